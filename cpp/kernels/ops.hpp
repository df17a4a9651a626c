// The kernel functors, declared from kernels/kernel_list.hpp (one line per kernel there): each
// functor's operator() is a template over the xsimd architecture tag and the element type; its
// body lives in the op's header (kernels/<op>.hpp) and is instantiated once per ISA
// (kernels/instantiate.hpp). Call through llmk::dispatch (common/isa.hpp). This header also
// holds the types the attention kernel shares with its driver (drivers/attend.cpp).
#pragma once

#include "common/isa.hpp"  // Family

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/kernel_list.hpp"

namespace llmk {

// How a projection's weights are stored (cpp/modules, drivers/linear.hpp): float32, or 16 bits per
// weight -- bfloat16 (the checkpoints' usual dtype) or IEEE float16 -- converted to float32 in
// registers by the kernels of kernels/weight16.hpp, or group-wise quantized int8 / int4 codes
// with float16 scales (kernels/quant.hpp, docs/quantization.md).
enum class WeightFormat : std::uint8_t { f32, bf16, f16, q8, q4 };

inline bool is_quantized(WeightFormat f) { return f == WeightFormat::q8 || f == WeightFormat::q4; }

// A projection's weights as the modules store them: (n, k) row-major (HF's (out, in) layout) in
// `format`: float32, 16-bit bf16 / f16 words, or int8 / int4 codes (q8: (n, k) int8; q4: (n, k /
// 2) bytes of two nibbles) with `scales` (n, k / group) float16 bits (docs/quantization.md). The
// operand of drivers/linear.hpp's linear and of gemm_packed_w_kernel (kernels/gemm_packed_w.hpp).
struct WeightRef {
  const void* data;
  WeightFormat format;
  const std::uint16_t* scales = nullptr;  // q8 / q4 only
  std::size_t group = 0;                  // q8 / q4 only: 32, 64 or 128, k % group == 0
  bool tiles = false;  // q8 only: codes and scales in AMX's tile layout (qweights::tiles)
};

// Rows [r0, ...) of w (n, k): the same matrix seen from feature r0 on (a thread's share).
inline WeightRef weight_rows(const WeightRef& w, std::size_t r0, std::size_t k) {
  std::size_t bytes = k;  // bytes per row: q8
  if (w.format == WeightFormat::f32) bytes = 4 * k;
  if (w.format == WeightFormat::bf16 || w.format == WeightFormat::f16) bytes = 2 * k;
  if (w.format == WeightFormat::q4) bytes = k / 2;
  WeightRef out = w;
  out.data = static_cast<const std::uint8_t*>(w.data) + r0 * bytes;
  if (is_quantized(w.format)) out.scales = w.scales + r0 * (k / w.group);
  return out;
}

// --- attention -----------------------------------------------------------------------------
// Tiles: up to kAttnRowTile query rows (of one KV head's group) against kAttnKeyTile keys.
// A call without causal or window limits uses tiles of up to kAttnRowTile rows: the per-key-
// tile work that does not grow with the rows (the V tile copy, loop overheads) is spread over
// 3x the rows of a 64-row tile (non-causal (1, 32, 2048, 128) at 1 thread: 0.97x the time). A
// causal or windowed call keeps tiles of kAttnRowTileLimited rows: a tile's rows see different
// key ranges, and the scores of a diagonal key tile are computed for all of its rows.
constexpr std::size_t kAttnRowTile = 192;
constexpr std::size_t kAttnRowTileLimited = 64;
constexpr std::size_t kAttnKeyTile = 64;

// Dv rounded up to a multiple of 64 bytes' worth of elements (a whole number of vectors on
// every ISA).
template <class T>
constexpr std::size_t attn_dv_pad_t(std::size_t dv) {
  constexpr std::size_t e = 64 / sizeof(T);
  return (dv + e - 1) / e * e;
}

// The kind of an attention mask: none, bool (uint8, nonzero = may attend), or additive (T).
enum class AttnMask : std::uint8_t { none, boolean, additive };

template <class T>
struct attn_params {
  const T* q;  // (B, Hq, Tq, D)   element (b, h, i, :) at q + b*qs[0] + h*qs[1] + i*qs[2]
  const T* k;  // (B, Hkv, Tk, D)  likewise with ks
  const T* v;  // (B, Hkv, Tk, Dv) likewise with vs
  T* out;      // (B, Hq, Tq, Dv)  likewise with os
  T* weights;  // (B, Hq, Tq, Tk) C-contiguous, or null
  std::size_t b, hq, hkv, tq, tk, d, dv;
  // (batch, head, row) strides in elements; the last axis is contiguous. They let a module read
  // q/k/v straight from a fused projection output or a KV cache and write (B, T, H*Dv) rows.
  std::size_t qs[3], ks[3], vs[3], os[3];
  // score multiplier, in double whatever T: a scale outside T's normal range (1e-50, 1e40 in
  // float32) must still give the float64 reference's answer (the driver then runs the exact path)
  double scale;
  bool causal;             // bottom-right aligned: query i sees key j iff j <= i + Tk - Tq
  AttnMask mask_kind;      // what `mask` points to
  const void* mask;        // broadcast view of (B, Hq, Tq, Tk)
  std::int64_t mask_strides[4];  // in elements; 0 on broadcast axes
  // sliding window (Mistral, Gemma 2): 0 = none; else query i sees key j only if
  // (i + Tk - Tq) - j < window. Key tiles wholly before a tile's window are never visited.
  std::int64_t window;
  double softcap;   // 0 = none; else scores become softcap * tanh(s / softcap) before the mask
  const T* sinks;   // (Hq,) or null: an extra logit per query head in the softmax denominator
  T* lse;           // (B, Hq, Tq) C-contiguous, or null: log-sum-exp of each row's scores
  // How K and V are stored (a KV cache's dtype). f32 (the default of a value-initialised
  // attn_params): k and v above, of type T. bf16 / f16 (T = float only): the 16-bit words at
  // k16 / v16 (k and v unused), same strides in elements; the kernel widens them to float32 as
  // it loads its K/V tiles (kernels/weight16.hpp's conversions), never a widened copy of the
  // whole K/V, so a product equals the float32 kernel's on the widened values bit for bit.
  WeightFormat kv_format;
  const std::uint16_t* k16;
  const std::uint16_t* v16;
};

// One work item: rows [row0, row0 + nrows) of KV head g's group (rows are (h, i) pairs,
// h-major) in batch b, against keys [k0, k1).
struct attn_item {
  std::size_t b, g, row0, nrows, k0, k1;
};

// Row stride of the tile kernel's (., kAttnRowTile) buffers (Q^T, the scores): 64 bytes more
// than a row. At exactly 256 (float) or 512 bytes (double) the 128 rows of Q^T a micro-GEMM
// walks down fall in 16 (8) of L1's 64 sets, 8-way: more lines than ways, so the K or V rows
// streaming past evicted them (conflict misses, every tile).
template <class T>
constexpr std::size_t attn_tile_stride() {
  return kAttnRowTile + 64 / sizeof(T);
}

// Elements of scratch one item needs (per thread): Q^T and the scores (rows of
// attn_tile_stride), O and the V copy (rows of Dv padded, plus 64 bytes), 4 row values; with
// 16-bit K/V (kv16) also a widened K tile (kAttnKeyTile rows of D).
template <class T>
constexpr std::size_t attn_workspace_size(std::size_t d, std::size_t dv, bool kv16 = false) {
  return (d + kAttnKeyTile) * attn_tile_stride<T>() +
         (kAttnRowTile + kAttnKeyTile) * (attn_dv_pad_t<T>(dv) + 64 / sizeof(T)) +
         4 * kAttnRowTile + (kv16 ? kAttnKeyTile * d : 0);
}

// Folds a sink logit into a row's final softmax state (running max m, sum l, unnormalised
// output o of dv values): the sink joins the denominator with no value. NaN propagates.
template <class T>
inline void attn_add_sink(T sink, T& m, T& l, T* o, std::size_t dv) {
  const T m_new = std::isnan(m) || std::isnan(sink) ? std::numeric_limits<T>::quiet_NaN()
                                                     : std::max(m, sink);
  if (m_new == -std::numeric_limits<T>::infinity()) return;  // sink -inf and no key: nothing
  const T a = std::exp(m - m_new);  // m = -inf (no key yet): 0
  l = l * a + std::exp(sink - m_new);
  if (a != T(1))
    for (std::size_t d = 0; d < dv; ++d) o[d] *= a;
  m = m_new;
}

// log-sum-exp of a row from its final (m, l): -inf for a row that attended nothing
template <class T>
inline T attn_lse(T m, T l) {
  if (std::isnan(m) || std::isnan(l)) return std::numeric_limits<T>::quiet_NaN();
  return l > T(0) ? m + std::log(l) : -std::numeric_limits<T>::infinity();
}

// Runs one item. part_o == null: writes the normalised rows to p.out (and p.weights);
// otherwise writes the unnormalised running state (m, l: (nrows,), O: (nrows, dv_pad)) for a
// later merge of key splits. flags (nrows,): per row, kAttnNonFinite when a score of the row
// was +inf or NaN (the running max is +inf or the running sum NaN), kAttnAllNegInf when the row
// had keys it may attend but every score of them was -inf. Both can come from scores that
// overflow T while the float64 reference's stay finite; the driver recomputes such rows exactly
// (attention_row_exact).
constexpr std::uint8_t kAttnNonFinite = 1, kAttnAllNegInf = 2;

// The functors of kernel_list.hpp: attention_tile_kernel runs one item (above); see each
// kernel's header for what the others compute.
#define LLMK_DECLARE_KERNEL(name, params)                                    \
  struct name {                                                              \
    template <class Arch, class T>                                           \
    void operator()(Arch, LLMK_UNPAREN params) const;                        \
  };
#define LLMK_DECLARE_FLOAT_KERNEL(name, params)                              \
  struct name {                                                              \
    template <class Arch>                                                    \
    void operator()(Arch, LLMK_UNPAREN params) const;                        \
  };
LLMK_KERNELS(LLMK_DECLARE_KERNEL, T)
LLMK_FLOAT_KERNELS(LLMK_DECLARE_FLOAT_KERNEL)
#undef LLMK_DECLARE_KERNEL
#undef LLMK_DECLARE_FLOAT_KERNEL

// The kernel families whose path is chosen by measured speed (common/isa.hpp); the packed
// GEMM's x panels and its kernels are one family (the panel layout is the ISA's)
#define LLMK_KERNEL_FAMILY(kernel, fam) \
  template <>                            \
  inline constexpr Family kernel_family<kernel> = Family::fam;
LLMK_KERNEL_FAMILY(rms_norm_kernel, norm)
LLMK_KERNEL_FAMILY(layer_norm_kernel, norm)
LLMK_KERNEL_FAMILY(rope_kernel, rope)
LLMK_KERNEL_FAMILY(attention_tile_kernel, attention)
LLMK_KERNEL_FAMILY(gemv_q8_kernel, qgemv)
LLMK_KERNEL_FAMILY(gemv_q4_kernel, qgemv)
LLMK_KERNEL_FAMILY(gemm_q_kernel, quant)
LLMK_KERNEL_FAMILY(gemm_pack_x_kernel, packed)
LLMK_KERNEL_FAMILY(gemm_packed_kernel, packed)
LLMK_KERNEL_FAMILY(gemm_packed_w_kernel, packed)
#undef LLMK_KERNEL_FAMILY

// Panel height of gemm_xt_kernel's packed operand (kernels/gemm.hpp).
constexpr std::size_t kGemmPanel = 64;

// gemm_packed_kernel (kernels/gemm.hpp): the weight block each thread packs, kGemmPackKc x
// kGemmPackNc elements (its scratch, sized by the driver), and the token count every ISA's
// panel of packed x divides (the driver sizes xp as m rounded up to it, times k, and splits
// the packing on multiples of it).
constexpr std::size_t kGemmPackKc = 512;
constexpr std::size_t kGemmPackNc = 1024;
// Features per packed block of a call with m tokens of k: kGemmPackNc, or kGemmPackNcSmallX (a
// 512 KiB block) when the packed x is at most 2 MiB, cheap to stream again for each of the 4x
// as many blocks. Measured on the AVX2 EPYC, prefill of 256 tokens through a dim-512 8-layer
// model (x of 0.5 and 1.4 MiB): 0.968x the time at 1 thread, 0.942x at 2 (paired, 4 rounds);
// through a dim-2048 model, 512 tokens (x of 4 and 11 MiB), 256-feature blocks were 1.5%
// slower. The thread's block scratch is leased at this size.
constexpr std::size_t kGemmPackNcSmallX = 256;
constexpr std::size_t gemm_pack_nc(std::size_t m, std::size_t k) {
  return m * k <= (std::size_t{2} << 20) / sizeof(float) ? kGemmPackNcSmallX : kGemmPackNc;
}
constexpr std::size_t kGemmPackTokenAlign = 12;

}  // namespace llmk
