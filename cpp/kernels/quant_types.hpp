// The operands of the quantized matrix kernels (kernels/quant.hpp), shared with their entry
// (drivers/qlinear.cpp). The format is described in kernels/quant.hpp and docs/quantization.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace llmk {

// Elements of a packing / activation block: int4 nibbles are paired within 32-element blocks
// (element i in the low nibble of byte i, element i + 16 in the high one), and the per-token
// int8 activations carry one scale per 32 elements. Every group size (32, 64, 128) is a whole
// number of blocks.
constexpr std::size_t kQBlock = 32;

// A group-wise quantized weight matrix W (rows, k), rows = output features.
struct qweights {
  const std::uint8_t* q;        // bits 8: (rows, k) int8 codes; bits 4: (rows, k / 2) nibbles
  const std::uint16_t* scales;  // (rows, k / group) float16 bit patterns
  std::size_t rows, k, group;   // group in {32, 64, 128}, k % group == 0
  // bits 8 only: codes and scales in AMX's tile layout (tile_int8, drivers/qlinear.hpp) -- per
  // group of 16 rows (rows % 16 == 0) codes [block][8 quadruple rows][16 rows][4 codes] and
  // scales [scale group][16 rows], each group where its rows are in the plain layout (so row
  // offsets that are multiples of 16 keep their meaning)
  bool tiles = false;
};

// Activations quantized per token to int8 in blocks of kQBlock (llama.cpp's q8_0, float32
// scales): x[t, i] ~= q[t, i] * s[t, i / kQBlock]. Null q: the kernels use the float
// activations instead.
struct qacts {
  const std::int8_t* q;     // (m, k) codes in [-127, 127]
  const std::int16_t* q16;  // (m, k) q widened (the operand of SSE2's madd)
  const float* s;           // (m, k / kQBlock)
  // int4 weights on AVX2 (two blocks a step): q (m, k) reordered per pair of blocks (b, b + 1)
  // as [b 0-15, b+1 0-15, b 16-31, b+1 16-31] (an odd last block as is). Null for int8 weights.
  const std::int8_t* q4;
  // with q4: (m, chunks of 8 blocks, 8) int32, 8 * the sum of each block's codes (0 past the
  // last block): the offset the unsigned nibbles (code + 8) add to a block's dot product, taken
  // off once per chunk of 8 blocks (formed once per call instead of once per row)
  const std::int32_t* xs8;
  // int8 weights on the VNNI prefill (kernels/quant_vnni.hpp; else null): q per chunk of 8
  // blocks with one block per int32 lane -- (m, chunks, 8, 8 lanes) groups of 4 codes, group j
  // of block l at [j][l] -- each code + 128 (unsigned), blocks past the last 0; and the scales
  // (m, chunks, 8), 0 past the last block
  const std::uint8_t* xi;
  const float* sx8;
  // int8 weights on the VNNI GEMV (kernels/quant_vnni.hpp; else null): (m, chunks of 8 blocks,
  // 8) int32, 128 * the sum of each block's codes (0 past the last block)
  const std::int32_t* xs128;
  // int8 weights on the AVX2 integer prefill (Int8Dot::avx2; else null): |xi| (xi holds the
  // signed codes there), the unsigned operand of maddubs(|x|, sign(w, x))
  const std::uint8_t* xa;
};

// One call of gemv_q8_kernel / gemv_q4_kernel / gemm_q_kernel:
//   y[t * ldy + r] (+)= sum_i W_deq[r, i] * x[t * ldx + i] (+ bias[r])   t < m, r < w.rows
// W_deq[r, i] = code * scale (exact in float32). The gemv kernels use act.q when non-null.
struct qgemv_args {
  float* y;
  std::size_t ldy;
  qweights w;
  const float* x;  // (m, k) row stride ldx
  std::size_t ldx, m;
  qacts act;
  bool accumulate;
  const float* bias;  // (rows,) or null, added in the final store
  int stripes;        // the AVX2 int8-activation GEMV's row stripes for int4 weights: 2 or 4
  // the AVX2 int8-activation GEMV's software prefetch: bytes ahead on each row it reads, or 0
  std::size_t prefetch;
  // the VNNI tile kernels: the codes this thread's next call reads (next_bytes of them, or null),
  // prefetched into L2 a little per tile while this call computes
  const std::uint8_t* next_q = nullptr;
  std::size_t next_bytes = 0;
};

namespace {  // internal linkage: compiled into each per-ISA unit with its own flags

// float16 bit pattern -> float32 (the scales), exact for every value: subnormal halves through an
// int -> float conversion, so no subnormal float32 is formed and DAZ cannot change the answer
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t em = h & 0x7fffu;
  float mag;
  if (em >= 0x0400u) {
    std::uint32_t b = (em << 13) + (std::uint32_t(127 - 15) << 23);
    if (em >= 0x7c00u) b = (em << 13) | 0x7f800000u;  // Inf / NaN (not made by quantize)
    std::memcpy(&mag, &b, sizeof mag);
  } else {
    mag = static_cast<float>(em) * 0x1p-24f;
  }
  // the sign by a bit operation: int4 scales are negative half the time, and a branch on it
  // mispredicted often enough to triple the time of an int4 GEMV
  std::uint32_t bits;
  std::memcpy(&bits, &mag, sizeof bits);
  bits |= static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::memcpy(&mag, &bits, sizeof mag);
  return mag;
}

}  // namespace

// gemm_q_kernel (prefill): x given packed in panels of kQPanel tokens, xt[(p * k + i) *
// kQPanel + j] = x[p * kQPanel + j, i], zero past row m (the layout of gemm.hpp's panels).
constexpr std::size_t kQPanel = 64;

}  // namespace llmk
