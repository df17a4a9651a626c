// Group-wise quantized weights (int8, int4): matrix-vector products for decode and a matrix
// product for prefill, the weights converted in registers (GEMV) or in a small cache-resident
// tile (GEMM) -- never a dequantized copy of the matrix.
//
// Format (docs/quantization.md): W (rows, k), rows = output features, quantized along k in
// groups of G in {32, 64, 128} elements, one float16 scale s per (row, group); the weight is
// W_deq[r, i] = code[r, i] * s[r, i / G], a product that is exact in float32 (a code has at most
// 8 significant bits, a float16 scale 11).
//   int8: symmetric, s = the smallest float16 >= max|w| / 127, code = rint(w / s) in [-127, 127],
//         stored as int8 (rows, k).
//   int4: symmetric as llama.cpp's Q4_0: m = the element of largest magnitude (the first one on
//         ties), s = m / -8 rounded away from zero to float16, code = rint(w / s) clamped to
//         [-8, 7] (m itself maps to -8: 16 levels used), stored as code + 8 in a nibble, two per
//         byte (rows, k / 2): in each block of 32 elements, element i in the low nibble of byte
//         i and element i + 16 in the high nibble (Q4_0's order: one 16-byte load, a mask and a
//         shift give the 32 codes in order).
// rint rounds half to even. float16 scales read as llama.cpp's (2 bytes per group).
//
// Two activation strategies (the caller's choice, int8 the default of llmkernels.quantized_linear
// for m <= 8 as the faster; see docs/quantization.md for the figures):
//   float: x stays float32; each code is widened int8 -> int32 -> float, multiplied by its scale
//          (the exact dequantized weight) and FMA'd into the accumulators -- the float64
//          reference of the dequantized weights within float32 accumulation error.
//   int8:  x quantized per token in blocks of 32 (qacts, llama.cpp's q8_0 with float32 scales);
//          integer dot products per block (AVX2: _mm256_maddubs_epi16 on |w| and sign(x, w) for
//          int8 weights, on the unsigned nibbles and x for int4 -- two blocks per 32-byte load,
//          the 8 * x this adds taken off in int16 -- then _mm256_madd_epi16; SSE2:
//          _mm_madd_epi16 on int16), each block's sum(code_w * code_x) scaled by s_w * s_x (AVX2:
//          8 blocks a step, one block per lane, as the VNNI prefill: qgemv_rows_w8_g).
//          The caller (drivers/qlinear.cpp's qlinear) gives these kernels activation scales s_x
//          of 0, NaN or within [2^-100, 2^100] only (else the call takes float activations), so
//          that d = s_w * s_x is a finite normal float: a d of inf met a zero integer dot
//          product (inf * 0 = NaN where the reference gives 0), a subnormal d had a few bits.
// ISA paths: the integer code below is written with SSE2 intrinsics and with AVX2 ones; each
// per-ISA translation unit compiles the one its flags allow (#if __AVX2__: the avx2 and avx512
// units run the 256-bit code; AVX-512 has no cheaper int8 dot product without VNNI). The float
// side (float activations, the dequantized tile) is written once on xsimd batches of that width
// (QF), and the float GEMM tile product is gemm.hpp's on the unit's own batch type.
//
// Every row goes through the same arithmetic whatever block of rows it is computed in, so
// results do not depend on how rows are split across threads.
#pragma once

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/gemm.hpp"  // the tile product of the prefill (gemm_xt_tokens)
#include "kernels/ops.hpp"
#include "kernels/quant_types.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// The float side of the kernels (dequantized weights, float activations, accumulators) is
// written once on QF, the batch of the integer code's width: 256-bit in the avx2 and avx512
// units, 128-bit in the sse2 unit. The integer side (codes -> int32 / float, int8 dot products)
// is per ISA below.
#if defined(__AVX2__)
using QArch = xsimd::fma3<xsimd::avx2>;
#else
using QArch = xsimd::sse2;
#endif
using QF = vec<QArch, float>;
constexpr std::size_t kQF = QF::size;                  // floats per vector
constexpr std::size_t kQBlockVectors = kQBlock / kQF;  // float vectors per block of codes

// acc + w * x: one FMA on AVX2; on SSE2 a product and a sum, in this operand order (which
// decides the payload when both are NaN)
inline QF qmadd(const QF& w, const QF& x, const QF& acc) {
#if defined(__AVX2__)
  return xsimd::fma(w, x, acc);
#else
  return acc + w * x;
#endif
}

// float16 scales -> float32: half_to_float (quant_types.hpp), n at a time per ISA below
inline void scales_to_float(const std::uint16_t* h, float* out, std::size_t n);

// The row functions convert the float16 scales of R rows kScaleChunk groups at a time into
// sc[R][kScaleChunk] (on the stack): sc[r][j] = the scale of row r0 + r, group g0 + j.
constexpr std::size_t kScaleChunk = 64;
template <int R, std::size_t C>
inline void load_scales(const qweights& w, std::size_t r0, std::size_t g0, float (*sc)[C]) {
  static_assert(C >= kScaleChunk, "a row of sc holds a chunk");
  const std::size_t ng = w.k / w.group, n = std::min(kScaleChunk, ng - g0);
  for (int r = 0; r < R; ++r) scales_to_float(w.scales + (r0 + r) * ng + g0, sc[r], n);
}

// s[r] = the scale of row r0 + r in group g, for the rows of a block (sc refilled from the
// float16 scales every kScaleChunk groups)
template <int R, std::size_t C>
inline void group_scales(const qweights& w, std::size_t r0, std::size_t g, float (*sc)[C],
                         float* s) {
  if (g % kScaleChunk == 0) load_scales<R>(w, r0, g, sc);
  for (int r = 0; r < R; ++r) s[r] = sc[r][g % kScaleChunk];
}

// The final store of every row kernel: y[t, row] (+)= sum (+ bias[row])
inline void qstore(const qgemv_args& a, std::size_t row, std::size_t t, float sum) {
  float& dst = a.y[t * a.ldy + row];
  dst = a.accumulate ? dst + sum : sum;
  if (a.bias) dst += a.bias[row];
}

// Software prefetch of the same bytes a whole number of R-row blocks further on, at least
// kQPrefetchBytes ahead (the float-activation and SSE2 kernels, whose R-row blocks are
// consecutive rows; the AVX2 int8-activation kernels read 4 stripes instead: qgemv_tokens).
// The rows of a block are consecutive, so this runs the reads ahead as one sequential stream:
// with rows of 1-2 KiB (int4 / int8 at k = 2048) the hardware prefetchers, which stop at 4 KiB
// pages and track a few streams, left a DRAM-resident matrix (the 2048 -> 32000 output
// projection) at half the bandwidth of an fp32 sgemv. One block of 4 KiB rows was too close.
constexpr std::size_t kQPrefetchBytes = 32768;

template <int R>
inline std::size_t prefetch_distance(std::size_t row_bytes) {
  const std::size_t block = R * row_bytes;
  return block * std::max<std::size_t>(1, (kQPrefetchBytes + block - 1) / block);
}

inline void prefetch_ahead(const std::uint8_t* p, std::size_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(p + ahead), _MM_HINT_T0);
}

// ---------------------------------------------------------------------------------------------
// AVX2 (256-bit): a block of 32 codes is one __m256i of int8.
#if defined(__AVX2__)

inline float qhsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

// a chunk of n blocks: its whole-chunk variant (no tests per block) when n is 8
template <class Chunk>
__attribute__((always_inline)) inline void run_chunk(std::size_t n, Chunk&& chunk) {
  if (n == 8)
    chunk(std::true_type{});
  else
    chunk(std::false_type{});
}

// the R x M sums of a row kernel: rows r0 + r * rs, tokens t
template <int R, int M>
inline void qstore_all(const qgemv_args& a, std::size_t r0, std::size_t rs,
                       const __m256 (&acc)[R][M]) {
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) qstore(a, r0 + r * rs, t, qhsum(acc[r][t]));
}

// n float16 scales -> float32, 8 at a time by F16C's vcvtph2ps (the avx2 and avx512 units are
// built with F16C: kernels/weight16.hpp): exact for every half, subnormals included, without
// forming a subnormal float (DAZ cannot change it) -- the values of half_to_float. (The lane
// selects that emulated it were ~15 operations per 8 scales: with group 32, a fifth of the
// int8 GEMV's work.)
inline void scales_to_float(const std::uint16_t* h, float* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(v));
  }
  for (; i < n; ++i) out[i] = half_to_float(h[i]);
}

// the 32 codes of block b of a row (int8, in element order)
template <int Bits>
inline __m256i qblock_avx2(const std::uint8_t* row, std::size_t b) {
  if constexpr (Bits == 8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * kQBlock));
  } else {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * kQBlock / 2));
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(p, 4), p);  // low nibbles, then high
    return _mm256_sub_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
  }
}

// the codes of block b as 4 float vectors (elements 8j .. 8j + 7)
template <int Bits>
inline void qblock_float(const std::uint8_t* row, std::size_t b, QF f[kQBlockVectors]) {
  if constexpr (Bits == 8) {  // widened straight from memory, 8 codes a load
    const std::uint8_t* p = row + b * kQBlock;
    for (int j = 0; j < 4; ++j)
      f[j] = _mm256_cvtepi32_ps(
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * j))));
  } else {
    const __m256i v = qblock_avx2<4>(row, b);
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    f[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    f[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    f[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    f[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  }
}

// The integer dot products of 8 blocks, one per lane: p[l] holds block l's products in 8 int32
// lanes; lane l of the result is their sum (exact: integer). Two rounds of hadd sum each
// 128-bit half of 4 blocks, a permute and an add join the halves.
inline __m256i block_sums8(const __m256i (&p)[8]) {
  const __m256i a =
      _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
  const __m256i b =
      _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                          _mm256_permute2x128_si256(a, b, 0x31));
}

// The scales of a chunk of blocks b0 .. b0 + n - 1 (n <= 8), one block per lane, 0 past the
// last block: sw[r] the weight scales of row r (its float16 scales at s0 + r * rstride; groups
// of 32: one per block, else one per 1 << sh blocks), sxv[t] token t's block scales
template <int R, int M, bool Group32>
inline void chunk_scales(const std::uint16_t* s0, std::size_t rstride, unsigned sh, const float* sx,
                         std::size_t nb, std::size_t b0, std::size_t n, __m256 (&sw)[R],
                         __m256 (&sxv)[M]) {
  for (int r = 0; r < R; ++r) {
    const std::uint16_t* rsc = s0 + r * rstride;
    if (Group32 && n == 8) {
      sw[r] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rsc + b0)));
    } else {
      alignas(32) float f[8] = {};
      for (std::size_t l = 0; l < n; ++l)
        f[l] = half_to_float(rsc[Group32 ? b0 + l : (b0 + l) >> sh]);
      sw[r] = _mm256_load_ps(f);
    }
  }
  for (int t = 0; t < M; ++t) {
    if (n == 8) {
      sxv[t] = _mm256_loadu_ps(sx + t * nb + b0);
    } else {
      alignas(32) float f[8] = {};
      for (std::size_t l = 0; l < n; ++l) f[l] = sx[t * nb + b0 + l];
      sxv[t] = _mm256_load_ps(f);
    }
  }
}

// (the row kernels' bodies must stay in one function: their accumulators live in registers)
#define LLMK_ALWAYS_INLINE __attribute__((always_inline))

// the chunks of 8 blocks of rows r0 + r * rs (r < R) against M tokens: body(b0, n, sw, sxv) for
// blocks b0 .. b0 + n - 1 with their scales (chunk_scales)
template <int R, int M, bool Group32, class Body>
LLMK_ALWAYS_INLINE inline void for_each_chunk(const qgemv_args& a, std::size_t r0, std::size_t rs,
                                              Body&& body) {
  const std::size_t nb = a.w.k / kQBlock, ng = a.w.k / a.w.group;
  const unsigned sh = a.w.group == 64 ? 1 : 2;  // blocks per group = 1 << sh (groups of 64, 128)
  const std::uint16_t* s0 = a.w.scales + r0 * ng;
  for (std::size_t b0 = 0; b0 < nb; b0 += 8) {
    const std::size_t n = std::min<std::size_t>(8, nb - b0);  // blocks in this chunk
    __m256 sw[R], sxv[M];
    chunk_scales<R, M, Group32>(s0, rs * ng, sh, a.act.s, nb, b0, n, sw, sxv);
    body(b0, n, sw, sxv);
  }
}

// int8 weights, rows r0 + r * rs (r < R) against M tokens, int8 activations. The blocks of a
// row go 8 at a time (a chunk), one block per lane: each block's integer dot product
// sum(code_w * code_x) summed exactly (block_sums8), converted once, multiplied by its
// d = s_w * s_x (the 8 weight scales times the token's 8 block scales) and FMA'd into lane l of
// the (row, token) accumulator; the 8 lanes are summed at the end (qhsum). A last chunk of fewer
// than 8 blocks has zero sums and d = 0 in the lanes past the end. This arithmetic per (row,
// token) is the int8-weight contract of the VNNI prefill (kernels/quant_vnni.hpp), which
// computes the same sums with one vpdpbusd per 8 blocks from weights repacked lane by block:
// the two must agree bit for bit. Per block: maddubs multiplies unsigned by signed bytes, |w|
// (unsigned: -128 -> 128) times sign(w) * x (any int8 code, -128 included, since the activation
// codes stay in [-127, 127] and their negation cannot overflow): pair sums at most 2 * 128 *
// 127, within int16; madd widens to 8 int32 lanes. Against one conversion and one FMA per
// block, a chunk spends 6 hadd, 2 permutes and an add, and one conversion, product and FMA.
template <int R, int M, bool Group32>
inline void qgemv_rows_w8_g(const qgemv_args& a, std::size_t r0, std::size_t rs) {
  const std::size_t k = a.w.k, row_bytes = k;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][M] = {};  // (zero)
  const std::uint8_t* w0 = a.w.q + r0 * row_bytes;
  const std::int8_t* const xq0 = a.act.q;
  for_each_chunk<R, M, Group32>(a, r0, rs, [&](std::size_t b0, std::size_t n,
                                                const __m256 (&sw)[R], const __m256 (&sxv)[M])
                                    LLMK_ALWAYS_INLINE {
    const auto chunk = [&](auto full) LLMK_ALWAYS_INLINE {
      for (int r = 0; r < R; ++r) {
        const std::uint8_t* wp = w0 + r * rs * row_bytes + b0 * kQBlock;
        if (a.prefetch)  // the chunk's 256 bytes, a.prefetch further on (qgemv_args)
          for (int l = 0; l < 4; ++l) prefetch_ahead(wp + 64 * l, a.prefetch);
        for (int t = 0; t < M; ++t) {
          const std::int8_t* xp = xq0 + t * k + b0 * kQBlock;
          __m256i p[8];
          for (std::size_t l = 0; l < 8; ++l) {
            if (full || l < n) {
              const __m256i w =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + l * kQBlock));
              const __m256i x =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + l * kQBlock));
              p[l] = _mm256_madd_epi16(
                  _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)), ones);
            } else {
              p[l] = _mm256_setzero_si256();
            }
          }
          const __m256 d = _mm256_mul_ps(sw[r], sxv[t]);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sums8(p)), d, acc[r][t]);
        }
      }
    };
    run_chunk(n, chunk);
  });
  qstore_all(a, r0, rs, acc);
}

// The integer side of qgemv_rows_int4_pairs_g: lane i of the result = the sum over bytes 4i ..
// 4i + 3 of lo * xlo (+ hi * xhi), lo / hi unsigned (nibbles), x signed -- here maddubs + madd
// (no saturation: |each int16 sum| <= 2 * 2 * 15 * 127); kernels/quant_vnni.hpp gives the same
// exact sums on vpdpbusd.
struct MaddubsDot {
  static __m256i dot2(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    const __m256i p16 =
        _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  }
  static __m256i dot1(__m256i u, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
  }
};

// int4 weights x int8 activations (rows r0 + r * rs, r < R), with qgemv_rows_w8_g's arithmetic
// per (row, token): chunks of 8 blocks, one block per lane, each block's integer dot product
// summed exactly, one conversion, product d = s_w * s_x and FMA per chunk. The integer sums go
// two blocks per step: one 32-byte load holds the nibbles of blocks b and b + 1; a mask gives
// [b elements 0-15 | b+1 elements 0-15] and a shift + mask [b 16-31 | b+1 16-31], which meet
// the activations stored in that order (qacts::q4). maddubs takes the nibbles (code + 8,
// unsigned) times x, and madd widens: lanes 0-3 of a pair's vector hold block b's products, 4-7
// block b + 1's. Two hadd rounds over a chunk's 4 pairs leave blocks [0 2 4 6 | 1 3 5 7], a
// permute puts them in order, and one subtraction per chunk takes off the 8 * sum(x) the
// nibbles' + 8 added (formed once per call: qacts::xs8; per pair in int16, it had cost 2 of
// the ~12 operations of a pair). An odd last block is stored in natural order: its 8 lanes
// folded into lanes 0-3 of its pair.
template <int R, int M, bool Group32, class Dot = MaddubsDot>
inline void qgemv_rows_int4_pairs_g(const qgemv_args& a, std::size_t r0, std::size_t rs) {
  const std::size_t k = a.w.k, nb = k / kQBlock, row_bytes = k / 2;
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // [0 2 4 6 1 3 5 7] -> 0..7
  const std::int8_t* const q4 = a.act.q4;
  const std::int32_t* const xs8 = a.act.xs8;
  const std::size_t nch = (nb + 7) / 8;
  __m256 acc[R][M] = {};  // (zero)
  const std::uint8_t* w0 = a.w.q + r0 * row_bytes;
  for_each_chunk<R, M, Group32>(a, r0, rs, [&](std::size_t b0, std::size_t n,
                                                const __m256 (&sw)[R], const __m256 (&sxv)[M])
                                    LLMK_ALWAYS_INLINE {
    const auto chunk = [&](auto full) LLMK_ALWAYS_INLINE {
      for (int r = 0; r < R; ++r) {
        const std::uint8_t* wp = w0 + r * rs * row_bytes + b0 * 16;
        if (a.prefetch)  // the chunk's 128 bytes
          for (int l = 0; l < 2; ++l) prefetch_ahead(wp + 64 * l, a.prefetch);
        for (int t = 0; t < M; ++t) {
          const std::int8_t* xp = q4 + t * k + b0 * kQBlock;
          __m256i pv[4];
          for (std::size_t i = 0; i < 4; ++i) {
            const std::size_t b = b0 + 2 * i;
            if (full || b + 1 < nb) {  // the pair (b, b + 1)
              const __m256i pk =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp + 2 * i * 16));
              const __m256i lo = _mm256_and_si256(pk, mask);
              const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(pk, 4), mask);
              const __m256i xlo =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 2 * i * kQBlock));
              const __m256i xhi = _mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(xp + 2 * i * kQBlock + 32));
              pv[i] = Dot::dot2(lo, xlo, hi, xhi);
            } else if (b < nb) {  // the odd last block, natural order
              const __m128i pk =
                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + 2 * i * 16));
              const __m256i nib =
                  _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(pk, 4), pk), mask);
              const __m256i xq =
                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 2 * i * kQBlock));
              const __m256i p = Dot::dot1(nib, xq);
              const __m128i h =
                  _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
              pv[i] = _mm256_zextsi128_si256(h);
            } else {
              pv[i] = _mm256_setzero_si256();
            }
          }
          // sum((code + 8) * x) per block, in order, less 8 * sum(x): sum(code * x)
          const __m256i sums = _mm256_sub_epi32(
              _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(_mm256_hadd_epi32(pv[0], pv[1]),
                                                            _mm256_hadd_epi32(pv[2], pv[3])),
                                          order),
              _mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(xs8 + (t * nch + b0 / 8) * 8)));
          const __m256 d = _mm256_mul_ps(sw[r], sxv[t]);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc[r][t]);
        }
      }
    };
    run_chunk(n, chunk);
  });
  qstore_all(a, r0, rs, acc);
}

#else  // SSE2 (128-bit): a block of 32 codes is two __m128i of int8.

struct MaddubsDot {};  // (the AVX2 int4 kernel's integer side: unused here)

inline float qhsum(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0x55));
  return _mm_cvtss_f32(s);
}

// n float16 scales -> float32, 4 at a time (see the AVX2 version)
inline void scales_to_float(const std::uint16_t* h, float* out, std::size_t n) {
  std::size_t i = 0;
  const __m128i zero = _mm_setzero_si128();
  for (; i + 4 <= n; i += 4) {
    const __m128i v =
        _mm_unpacklo_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h + i)), zero);
    const __m128i em = _mm_and_si128(v, _mm_set1_epi32(0x7fff));
    const __m128i sign = _mm_slli_epi32(_mm_and_si128(v, _mm_set1_epi32(0x8000)), 16);
    const __m128i shifted = _mm_slli_epi32(em, 13);
    const __m128i special = _mm_cmpgt_epi32(em, _mm_set1_epi32(0x7bff));
    const __m128i normal = _mm_or_si128(
        _mm_andnot_si128(special, _mm_add_epi32(shifted, _mm_set1_epi32((127 - 15) << 23))),
        _mm_and_si128(special, _mm_or_si128(shifted, _mm_set1_epi32(0x7f800000))));
    const __m128i is_normal = _mm_cmpgt_epi32(em, _mm_set1_epi32(0x3ff));
    const __m128i sub = _mm_castps_si128(_mm_mul_ps(_mm_cvtepi32_ps(em), _mm_set1_ps(0x1p-24f)));
    const __m128i mag =
        _mm_or_si128(_mm_and_si128(is_normal, normal), _mm_andnot_si128(is_normal, sub));
    _mm_storeu_ps(out + i, _mm_castsi128_ps(_mm_or_si128(mag, sign)));
  }
  for (; i < n; ++i) out[i] = half_to_float(h[i]);
}

// the 32 codes of block b of a row: v[0] elements 0-15, v[1] 16-31
template <int Bits>
inline void qblock_sse2(const std::uint8_t* row, std::size_t b, __m128i v[2]) {
  if constexpr (Bits == 8) {
    v[0] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * kQBlock));
    v[1] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * kQBlock + 16));
  } else {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * kQBlock / 2));
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    v[0] = _mm_sub_epi8(_mm_and_si128(p, mask), eight);
    v[1] = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(p, 4), mask), eight);
  }
}

// int8 x 16 -> int16 x 8 twice (sign-extended: each byte duplicated, then shifted down)
inline void widen_i8_sse2(__m128i v, __m128i h[2]) {
  h[0] = _mm_srai_epi16(_mm_unpacklo_epi8(v, v), 8);
  h[1] = _mm_srai_epi16(_mm_unpackhi_epi8(v, v), 8);
}

// the codes of block b as 8 float vectors (elements 4j .. 4j + 3)
template <int Bits>
inline void qblock_float(const std::uint8_t* row, std::size_t b, QF f[kQBlockVectors]) {
  __m128i v[2];
  qblock_sse2<Bits>(row, b, v);
  for (int i = 0; i < 2; ++i) {
    __m128i h[2];
    widen_i8_sse2(v[i], h);
    for (int j = 0; j < 2; ++j) {
      f[4 * i + 2 * j] = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(h[j], h[j]), 16));
      f[4 * i + 2 * j + 1] = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(h[j], h[j]), 16));
    }
  }
}

// int8 activations: _mm_madd_epi16 on the codes widened to int16 (SSE2 has no maddubs)
template <int Bits, int R, int M>
inline void qgemv_rows_int8(const qgemv_args& a, std::size_t r0) {
  const std::size_t k = a.w.k, ng = k / a.w.group, bpg = a.w.group / kQBlock, nb = k / kQBlock;
  const std::size_t row_bytes = Bits == 8 ? k : k / 2;
  __m128 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) acc[r][t] = _mm_setzero_ps();
  alignas(32) float sc[R][kScaleChunk];
  for (std::size_t g = 0; g < ng; ++g) {
    float s[R];
    group_scales<R>(a.w, r0, g, sc, s);
    for (std::size_t b = g * bpg; b < (g + 1) * bpg; ++b) {
      for (int r = 0; r < R; ++r) {
        __m128i v[2], w16[4];
        qblock_sse2<Bits>(a.w.q + (r0 + r) * row_bytes, b, v);
        widen_i8_sse2(v[0], w16);
        widen_i8_sse2(v[1], w16 + 2);
        for (int t = 0; t < M; ++t) {
          const std::int16_t* xp = a.act.q16 + t * k + b * kQBlock;
          __m128i p = _mm_madd_epi16(w16[0], _mm_loadu_si128(reinterpret_cast<const __m128i*>(xp)));
          for (int j = 1; j < 4; ++j)
            p = _mm_add_epi32(
                p, _mm_madd_epi16(w16[j],
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(xp + 8 * j))));
          acc[r][t] = _mm_add_ps(
              acc[r][t], _mm_mul_ps(_mm_cvtepi32_ps(p), _mm_set1_ps(s[r] * a.act.s[t * nb + b])));
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) qstore(a, r0 + r, t, qhsum(acc[r][t]));
}

#endif

// rows [r0, r0 + R) against M tokens, float activations: each block's codes widened to float,
// times the group's scale (the dequantized weights, exact), FMA'd into the accumulators
template <int Bits, int R, int M>
inline void qgemv_rows_float(const qgemv_args& a, std::size_t r0) {
  const std::size_t k = a.w.k, ng = k / a.w.group, bpg = a.w.group / kQBlock;
  const std::size_t row_bytes = Bits == 8 ? k : k / 2;
  const std::size_t ahead = prefetch_distance<R>(row_bytes);
  constexpr int A = M == 1 ? 2 : 1;  // accumulators per (row, token): cover the FMA latency
  QF acc[A][R][M];
  for (int i = 0; i < A; ++i)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < M; ++t) acc[i][r][t] = QF(0.f);
  alignas(32) float sc[R][kScaleChunk];
  for (std::size_t g = 0; g < ng; ++g) {
    float sg[R];
    group_scales<R>(a.w, r0, g, sc, sg);
    QF s[R];
    for (int r = 0; r < R; ++r) s[r] = QF(sg[r]);
    for (std::size_t b = g * bpg; b < (g + 1) * bpg; ++b) {
      for (int r = 0; r < R; ++r) {
        QF f[kQBlockVectors];
        prefetch_ahead(a.w.q + (r0 + r) * row_bytes + b * kQBlock * Bits / 8, ahead);
        qblock_float<Bits>(a.w.q + (r0 + r) * row_bytes, b, f);
        for (std::size_t j = 0; j < kQBlockVectors; ++j) {
          const QF wv = f[j] * s[r];  // the dequantized weights, exact
          for (int t = 0; t < M; ++t) {
            const QF xv = QF::load_unaligned(a.x + t * a.ldx + b * kQBlock + kQF * j);
            acc[j % A][r][t] = qmadd(wv, xv, acc[j % A][r][t]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) {
      QF v = acc[0][r][t];
      for (int i = 1; i < A; ++i) v += acc[i][r][t];
      qstore(a, r0 + r, t, qhsum(v));
    }
}

// rows [r0, r0 + n) of the matrix, columns [c0, c0 + kc) (whole groups), dequantized into
// tile (n, kc)
template <int Bits>
inline void qdequant_tile(const qweights& w, std::size_t r0, std::size_t n, std::size_t c0,
                          std::size_t kc, float* tile) {
  const std::size_t ng = w.k / w.group, bpg = w.group / kQBlock;
  const std::size_t row_bytes = Bits == 8 ? w.k : w.k / 2;
  for (std::size_t r = 0; r < n; ++r) {
    const std::uint8_t* row = w.q + (r0 + r) * row_bytes;
    for (std::size_t b = c0 / kQBlock; b < (c0 + kc) / kQBlock; ++b) {
      const QF s(half_to_float(w.scales[(r0 + r) * ng + b / bpg]));  // once per 32
      QF f[kQBlockVectors];
      qblock_float<Bits>(row, b, f);
      float* dst = tile + r * kc + (b * kQBlock - c0);
      for (std::size_t j = 0; j < kQBlockVectors; ++j) (f[j] * s).store_unaligned(dst + kQF * j);
    }
  }
}

// int8 activations: on AVX2 int8 weights by qgemv_rows_w8_g, int4 weights two blocks a step
// (qgemv_rows_int4_pairs_g), each specialized for groups of 32 (one scale per block) or more;
// SSE2 by qgemv_rows_int8
template <int Bits, int R, int M, class Dot = MaddubsDot>
inline void qgemv_rows_int8_any(const qgemv_args& a, std::size_t r0, std::size_t rs) {
#if defined(__AVX2__)
  const bool group32 = a.w.group == kQBlock;
  if constexpr (Bits == 4) {
    if (group32)
      qgemv_rows_int4_pairs_g<R, M, true, Dot>(a, r0, rs);
    else
      qgemv_rows_int4_pairs_g<R, M, false, Dot>(a, r0, rs);
  } else {
    if (group32)
      qgemv_rows_w8_g<R, M, true>(a, r0, rs);
    else
      qgemv_rows_w8_g<R, M, false>(a, r0, rs);
  }
#else
  (void)rs;  // consecutive rows only (qgemv_tokens)
  qgemv_rows_int8<Bits, R, M>(a, r0);
#endif
}

// Without the AVX2 int8-activation kernels (float activations, SSE2): rows of codes of at most
// this many bytes (int8 k <= 2048, int4 k <= 4096) are taken one at a time with int8
// activations -- one sequential stream (each row prefetching the next), where 4 rows of 1-2 KiB
// in lockstep are 4 short streams. int8 2048 x 32000, DRAM-resident, 1 thread, AVX2 EPYC (a
// standalone loop of this body): 14.7-16.1 G weights/s one row at a time against 13.8-14.2 in
// blocks of 4.
constexpr std::size_t kQGemvShortRowBytes = 2048;

// Every row against M tokens (the same arithmetic per row whatever rows share its block, so
// results do not depend on the blocking or the thread split). AVX2 with int8 activations: R
// stripes, as the float GEMV (kernels/gemv.hpp's gemv_tokens) -- the rows split into R parts
// and row r of each taken together, the matrix read as R sequential streams far apart, with no
// software prefetch. DRAM-resident, 1 thread, AVX2 EPYC, a standalone loop of this body (GB/s
// of codes and scales, against one row at a time with a software prefetch 32 KiB ahead, or for
// rows over 2 KiB blocks of 4 consecutive rows): int8 8000 x 2048 22.0 against 15.1-18.8,
// 2048 x 5632 20.1-20.4 against 18.1-19.0; int4 (compute-bound at 1 thread) 4096 x 5632
// 16.1-16.8 against 14.3-14.7, 32000 x 2048 17.3-17.7 against 16.6; with the software prefetch
// kept on each stripe, slower than either (int8 16.0-16.4, int4 14.0).
// On Intel each stripe keeps a software prefetch 2 KiB ahead (a.prefetch; the figures are in
// drivers/qlinear.cpp).
template <int Bits, bool Int8Acts, int M, class Dot = MaddubsDot>
inline void qgemv_tokens(const qgemv_args& a) {
#if defined(__AVX2__)
  if constexpr (Int8Acts) {
    // Stripes: 4 (rows r, r + part, ... together) or 2 (rows r and r + part, two of each per
    // step: 4 streams of codes and scales at most per thread). With 4, two threads (8 streams
    // of codes and 8 of scales) left the prefetchers behind. 32000 x 2048, DRAM-resident, Zen 4,
    // GB/s of codes and scales at 1 / 2 threads, medians of 4 interleaved runs on a busy machine
    // (read probe 26 / 33): int8 30 / 28 with 4 stripes, 33 / 35 with 2; int4 (compute-bound on
    // one thread, where 4 rows in flight hide more latency) 24 / 22 with 4, 20 / 27 with 2. So
    // int8 takes 2, int4 4 on one thread and 2 on more (a.stripes, set by qlinear; each row's
    // arithmetic is the same either way).
    if (Bits == 4 && a.stripes == 4) {
      constexpr int R = M <= 2 ? 4 : 2;  // R x M accumulators in 16 registers
      const std::size_t part = a.w.rows / R;
      for (std::size_t r = 0; r < part; ++r) qgemv_rows_int8_any<Bits, R, M, Dot>(a, r, part);
      for (std::size_t r = R * part; r < a.w.rows; ++r)
        qgemv_rows_int8_any<Bits, 1, M, Dot>(a, r, 1);
      return;
    }
    const std::size_t part = a.w.rows / 2;
    std::size_t r = 0;
    for (; r + 2 <= part; r += 2) {
      qgemv_rows_int8_any<Bits, 2, M, Dot>(a, r, part);
      qgemv_rows_int8_any<Bits, 2, M, Dot>(a, r + 1, part);
    }
    for (; r < part; ++r) qgemv_rows_int8_any<Bits, 2, M, Dot>(a, r, part);
    for (r = 2 * part; r < a.w.rows; ++r) qgemv_rows_int8_any<Bits, 1, M, Dot>(a, r, 1);
    return;
  }
#endif
  if constexpr (Int8Acts) {
    if (a.w.k * Bits / 8 <= kQGemvShortRowBytes) {
      for (std::size_t r = 0; r < a.w.rows; ++r) qgemv_rows_int8_any<Bits, 1, M, Dot>(a, r, 1);
      return;
    }
  }
  constexpr int R = M <= 2 ? 4 : 2;  // R x M (x 2 for one token) accumulators in 16 registers
  std::size_t r = 0;
  for (; r + R <= a.w.rows; r += R) {
    if constexpr (Int8Acts)
      qgemv_rows_int8_any<Bits, R, M, Dot>(a, r, 1);
    else
      qgemv_rows_float<Bits, R, M>(a, r);
  }
  for (; r < a.w.rows; ++r) {
    if constexpr (Int8Acts)
      qgemv_rows_int8_any<Bits, 1, M, Dot>(a, r, 1);
    else
      qgemv_rows_float<Bits, 1, M>(a, r);
  }
}

// Tokens in passes of 4 (the weights read once per pass), then the 1-3 left.
template <int Bits, bool Int8Acts, class Dot = MaddubsDot>
inline void qgemv_run(const qgemv_args& args) {
  constexpr std::size_t P = 4;
  qgemv_args a = args;
  const std::size_t nb = a.w.k / kQBlock;
  for (std::size_t t = 0; t < args.m; t += P) {
    a.y = args.y + t * args.ldy;
    a.x = args.x + t * args.ldx;
    if (Int8Acts) {
      a.act.q = args.act.q + t * a.w.k;
      a.act.q16 = args.act.q16 + t * a.w.k;
      a.act.s = args.act.s + t * nb;
      if (args.act.q4) {
        a.act.q4 = args.act.q4 + t * a.w.k;
        a.act.xs8 = args.act.xs8 + t * ((nb + 7) / 8) * 8;
      }
    }
    switch (std::min(P, args.m - t)) {
      case 1:
        qgemv_tokens<Bits, Int8Acts, 1, Dot>(a);
        break;
      case 2:
        qgemv_tokens<Bits, Int8Acts, 2, Dot>(a);
        break;
      case 3:
        qgemv_tokens<Bits, Int8Acts, 3, Dot>(a);
        break;
      default:
        qgemv_tokens<Bits, Int8Acts, 4, Dot>(a);
        break;
    }
  }
}

template <int Bits>
inline void qgemv(const qgemv_args& a) {
  if (a.act.q)
    qgemv_run<Bits, true>(a);
  else
    qgemv_run<Bits, false>(a);
}

// --- GEMM (prefill) ----------------------------------------------------------------------------
// The weights of kQTileRows rows x kQTileK columns are dequantized into a tile (32 KiB, stays
// in L1/L2) and multiplied by every token of the call before the next tile: each weight is
// converted once per call. The tile product is gemm.hpp's kernel body itself (gemm_xt_tokens
// on the float tile): x packed transposed in panels (tokens contiguous), TV token vectors x RN
// broadcast weights of accumulators, no horizontal sums.
constexpr std::size_t kQTileRows = 16;
constexpr std::size_t kQTileK = 512;  // a multiple of every group size

template <class Arch, int Bits>
inline void qgemm(const qgemv_args& a) {
  constexpr std::size_t N = vec<Arch, float>::size;
  constexpr std::size_t chunk = 4 * N;  // tokens per block (4 vectors)
  static_assert(kQPanel % chunk == 0, "a token chunk must not straddle two panels");
  alignas(64) float tile[kQTileRows * kQTileK];  // (rows of the tile, kc)
  const std::size_t k = a.w.k, m = a.m;
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kQTileRows) {
    const std::size_t nr = std::min(kQTileRows, a.w.rows - r0);
    for (std::size_t k0 = 0; k0 < k; k0 += kQTileK) {
      const std::size_t kc = std::min(kQTileK, k - k0);
      qdequant_tile<Bits>(a.w, r0, nr, k0, kc, tile);
      const bool acc = a.accumulate || k0 > 0;
      const float* bias = k0 + kc == k && a.bias ? a.bias + r0 : nullptr;  // with the last chunk
      for (std::size_t t = 0; t < m; t += chunk) {
        const std::size_t vectors = (std::min(m - t, chunk) + N - 1) / N;
        const float* xt = a.x + (t / kQPanel) * k * kQPanel + t % kQPanel + k0 * kQPanel;
        float* y = a.y + t * a.ldy + r0;
        const std::size_t valid = m - t;
        switch (vectors) {
          case 1:
            gemm_xt_tokens<Arch, float, PlainWeights<float>, 1>(y, a.ldy, xt, kQPanel, valid, tile,
                                                                kc, nr, kc, acc, bias);
            break;
          case 2:
            gemm_xt_tokens<Arch, float, PlainWeights<float>, 2>(y, a.ldy, xt, kQPanel, valid, tile,
                                                                kc, nr, kc, acc, bias);
            break;
          case 3:
            gemm_xt_tokens<Arch, float, PlainWeights<float>, 3>(y, a.ldy, xt, kQPanel, valid, tile,
                                                                kc, nr, kc, acc, bias);
            break;
          default:
            gemm_xt_tokens<Arch, float, PlainWeights<float>, 4>(y, a.ldy, xt, kQPanel, valid, tile,
                                                                kc, nr, kc, acc, bias);
            break;
        }
      }
    }
  }
}

}  // namespace

// y (m, rows) (+)= x (m, k) . W_deq^T (+ bias), W int8 (rows, k) group-wise: decode, m small
// (the weights read once per 4 tokens, in place). Activations float, or int8 when a.act.q.
template <class Arch>
void gemv_q8_kernel::operator()(Arch, const qgemv_args& a) const {
  qgemv<8>(a);
}

// The same for int4 weights (rows, k / 2), nibbles packed as described above.
template <class Arch>
void gemv_q4_kernel::operator()(Arch, const qgemv_args& a) const {
  qgemv<4>(a);
}

// Prefill: a.x is x packed in panels of kQPanel tokens (quant_types.hpp); bits 8 or 4; float
// activations. Weights dequantized per 16 x 512 tile.
template <class Arch>
void gemm_q_kernel::operator()(Arch, const qgemv_args& a, int bits) const {
  if (bits == 8)
    qgemm<Arch, 8>(a);
  else
    qgemm<Arch, 4>(a);
}

}  // namespace llmk
