// Prefill of bfloat16 weights on AVX512_BF16's vdpbf16ps: each 32-bit lane adds two bf16 x bf16
// products to a float32 accumulator -- twice the multiply-adds of a float32 FMA per instruction.
// llama.cpp and oneDNN run BF16 models this way.
//
// Numerics (docs/quantization.md, "bfloat16 prefill"): the activations are rounded to bfloat16
// (round to nearest even, NaN kept quiet: a relative error of at most 2^-9 per element) and each
// product of two bfloat16 is exact in float32; vdpbf16ps adds the pair's two products to the
// accumulator one after the other, rounding each sum (round to nearest even), and treats
// subnormal inputs and results as zero whatever MXCSR says. So the result is no longer the
// float32 product of the rounded weights bit for bit: the error against it is that of rounding x,
// ~2^-9 of sum |x * w| at worst, ~2^-9 / sqrt(k) of it typically (tests/ops/test_gemm_bf16.py
// measures it; docs/quantization.md gives the figures).
//
// Blocking (Goto): a block of kBf16BlockCols features (the caller's column block, one per task) and
// kBf16Kc elements of k is packed into panels of kBf16Nr features, (pair of k, feature) words:
// word [kk][f] = (W[f][2kk], W[f][2kk + 1]), which is the operand vdpbf16ps pairs with a
// broadcast word (x[t][2kk], x[t][2kk + 1]). For each panel (32 KiB, L1 / L2) the tokens pass
// in tiles of kBf16Mr (kBf16Mr x 2 zmm accumulators), kBf16Mc tokens per pass (their x in L2).
// x is rounded once per call into (m, kp) bfloat16 (kp = k rounded up to even, the pad 0) by
// round_x_bf16. (1 thread, Zen 4, a 2048 -> 5632 SwiGLU FFN at 512 tokens: Kc = 256 gave 164
// GFLOP/s, 512 176, 1024 177; without the Mc pass 2048 tokens fell to 145.)
//
// Compiled twice (cpp/arch/dot_bf16*.cpp): natively with -mavx512bf16, and on the AVX2 baseline
// against SIMDe, whose vdpbf16ps adds the pair's products in another order and keeps subnormals:
// the tests hold the two to the documented bound, not to bit equality. Each unit wraps this in
// its own namespace (LLMK_DOT_NS).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(LLMK_DOT_SIMDE)
#include <simde/x86/avx512.h>
#define LLMK_M5(f) simde_mm512_##f
using V512 = simde__m512;
using V512i = simde__m512i;
using V512bh = simde__m512bh;
#else
#if !defined(__AVX512BF16__)
#error "gemm_bf16.hpp: build with -mavx512bf16, or define LLMK_DOT_SIMDE"
#endif
#define LLMK_M5(f) _mm512_##f
using V512 = __m512;
using V512i = __m512i;
using V512bh = __m512bh;
#endif

namespace llmk {
namespace LLMK_DOT_NS {
namespace {

constexpr std::size_t kBf16Nr = 32;   // features per panel: two 16-lane vectors
constexpr std::size_t kBf16Mr = 12;   // tokens per tile: 24 accumulators of 32 registers
constexpr std::size_t kBf16Kc = 512;  // elements of k per packed block (256 words per feature)
constexpr std::size_t kBf16Mc = 192;  // tokens per pass over a packed block (96 KiB of x)

// x (m, k) float32 (row stride ldx) -> xb (m, kp) bfloat16, round to nearest even (the
// rounding of ml_dtypes and of vcvtneps2bf16 on normal numbers); NaN stays a quiet NaN of the
// same sign; the pad column (k odd) is 0. Scalar: once per call, ~1% of the product's time.
inline std::uint16_t to_bf16(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline void round_x_bf16_rows(std::uint16_t* xb, std::size_t kp, const float* x, std::size_t ldx,
                              std::size_t m, std::size_t k) {
  for (std::size_t t = 0; t < m; ++t) {
    const float* src = x + t * ldx;
    std::uint16_t* dst = xb + t * kp;
    for (std::size_t i = 0; i < k; ++i) dst[i] = to_bf16(src[i]);
    if (kp > k) dst[k] = 0;
  }
}

// W rows [0, nc) x elements [k0, k0 + 2 * kcp) -> panels of kBf16Nr features, (kcp, kBf16Nr)
// words each; features past nc and the element past k are 0
inline void pack_w_bf16(std::uint32_t* wp, const std::uint16_t* w, std::size_t k,
                        std::size_t nc, std::size_t k0, std::size_t kcp) {
  for (std::size_t f0 = 0; f0 < nc; f0 += kBf16Nr) {
    std::uint32_t* panel = wp + (f0 / kBf16Nr) * kcp * kBf16Nr;
    for (std::size_t f = 0; f < kBf16Nr; ++f) {
      if (f0 + f >= nc) {
        for (std::size_t kk = 0; kk < kcp; ++kk) panel[kk * kBf16Nr + f] = 0;
        continue;
      }
      const std::uint16_t* row = w + (f0 + f) * k + k0;
      const std::size_t avail = k - k0;  // elements of this row from k0 on
      for (std::size_t kk = 0; kk < kcp; ++kk) {
        const std::size_t e = 2 * kk;
        const std::uint32_t lo = e < avail ? row[e] : 0;
        const std::uint32_t hi = e + 1 < avail ? row[e + 1] : 0;
        panel[kk * kBf16Nr + f] = lo | (hi << 16);
      }
    }
  }
}

// the 32-bit word (x[2i], x[2i + 1]) at p (bfloat16 pairs, read through memcpy: no aliasing)
inline std::uint32_t load_word(const std::uint16_t* p) {
  std::uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

inline V512bh as_bh(const V512i& v) {
  V512bh r;
  std::memcpy(&r, &v, sizeof r);
  return r;
}

// y[t, f] (+)= sum_kk dot(word kk of x row t, panel[kk][f]) (xh: x rows as bf16, stride ldxh) for the tile's MR tokens and the panel's
// kBf16Nr features (y row stride ldy, all kBf16Nr columns valid: the caller gives a local tile
// for a partial panel); first: start from 0 (else from y); bias (kBf16Nr,) or null: added
template <int MR>
inline void micro_bf16(float* y, std::size_t ldy, const std::uint16_t* xh, std::size_t ldxh,
                       const std::uint32_t* panel, std::size_t kcp, bool first,
                       const float* bias) {
  V512 acc[MR][2];
  for (int i = 0; i < MR; ++i) {
    if (first) {
      acc[i][0] = LLMK_M5(setzero_ps)();
      acc[i][1] = LLMK_M5(setzero_ps)();
    } else {
      acc[i][0] = LLMK_M5(loadu_ps)(y + i * ldy);
      acc[i][1] = LLMK_M5(loadu_ps)(y + i * ldy + 16);
    }
  }
  for (std::size_t kk = 0; kk < kcp; ++kk) {
    const V512bh w0 = as_bh(LLMK_M5(loadu_si512)(panel + kk * kBf16Nr));
    const V512bh w1 = as_bh(LLMK_M5(loadu_si512)(panel + kk * kBf16Nr + 16));
    for (int i = 0; i < MR; ++i) {
      const V512bh a = as_bh(LLMK_M5(set1_epi32)(static_cast<int>(load_word(xh + i * ldxh + 2 * kk))));
      acc[i][0] = LLMK_M5(dpbf16_ps)(acc[i][0], a, w0);
      acc[i][1] = LLMK_M5(dpbf16_ps)(acc[i][1], a, w1);
    }
  }
  if (bias) {
    const V512 b0 = LLMK_M5(loadu_ps)(bias), b1 = LLMK_M5(loadu_ps)(bias + 16);
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = LLMK_M5(add_ps)(acc[i][0], b0);
      acc[i][1] = LLMK_M5(add_ps)(acc[i][1], b1);
    }
  }
  for (int i = 0; i < MR; ++i) {
    LLMK_M5(storeu_ps)(y + i * ldy, acc[i][0]);
    LLMK_M5(storeu_ps)(y + i * ldy + 16, acc[i][1]);
  }
}

// tokens [0, mr) of a tile against one panel of nf <= kBf16Nr valid features: straight into y
// when the panel is whole, else through a local (mr, kBf16Nr) tile
template <int MR>
inline void micro_any(float* y, std::size_t ldy, const std::uint16_t* xh, std::size_t ldxh,
                      const std::uint32_t* panel, std::size_t kcp, std::size_t nf, bool first,
                      const float* bias) {
  if (nf == kBf16Nr) {
    micro_bf16<MR>(y, ldy, xh, ldxh, panel, kcp, first, bias);
    return;
  }
  alignas(64) float tile[MR][kBf16Nr] = {};
  alignas(64) float b[kBf16Nr] = {};
  if (!first)
    for (int i = 0; i < MR; ++i) std::memcpy(tile[i], y + i * ldy, nf * sizeof(float));
  if (bias) std::memcpy(b, bias, nf * sizeof(float));
  micro_bf16<MR>(&tile[0][0], kBf16Nr, xh, ldxh, panel, kcp, first, bias ? b : nullptr);
  for (int i = 0; i < MR; ++i) std::memcpy(y + i * ldy, tile[i], nf * sizeof(float));
}

template <int MR>
inline void micro_tail(int mr, float* y, std::size_t ldy, const std::uint16_t* xh,
                       std::size_t ldxh, const std::uint32_t* panel, std::size_t kcp,
                       std::size_t nf, bool first, const float* bias) {
  if constexpr (MR > 0) {
    if (mr == MR)
      micro_any<MR>(y, ldy, xh, ldxh, panel, kcp, nf, first, bias);
    else
      micro_tail<MR - 1>(mr, y, ldy, xh, ldxh, panel, kcp, nf, first, bias);
  }
}

// x rounded to bfloat16 (see round_x_bf16_rows)
inline void round_x_bf16(std::uint16_t* xb, std::size_t kp, const float* x, std::size_t ldx,
                         std::size_t m, std::size_t k) {
  round_x_bf16_rows(xb, kp, x, ldx, m, k);
}

// One column block: y (m, nc) (row stride ldy) (+)= xb (m, kp) bf16 . w (nc, k) bf16 ^T (+ bias
// (nc,)); wpack: kBf16BlockCols x kBf16Kc / 2 words of scratch (nc <= kBf16BlockCols)
inline void gemm_bf16_block(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp,
                            std::size_t m, const std::uint16_t* w, std::size_t k, std::size_t nc,
                            bool accumulate, const float* bias, std::uint32_t* wpack) {
  for (std::size_t k0 = 0; k0 < kp; k0 += kBf16Kc) {
    const std::size_t kcp = std::min(kBf16Kc, kp - k0) / 2;
    pack_w_bf16(wpack, w, k, nc, k0, kcp);
    const bool first = k0 == 0 && !accumulate;
    const bool last = k0 + kBf16Kc >= kp;
    for (std::size_t t0 = 0; t0 < m; t0 += kBf16Mc) {  // kBf16Mc tokens' x stay in L2
      const std::size_t t1 = std::min(m, t0 + kBf16Mc);
      for (std::size_t f0 = 0; f0 < nc; f0 += kBf16Nr) {  // a panel stays in L1
        const std::uint32_t* panel = wpack + (f0 / kBf16Nr) * kcp * kBf16Nr;
        const std::size_t nf = std::min(kBf16Nr, nc - f0);
        const float* b = last && bias ? bias + f0 : nullptr;
        std::size_t t = t0;
        for (; t + kBf16Mr <= t1; t += kBf16Mr)
          micro_any<kBf16Mr>(y + t * ldy + f0, ldy, xb + t * kp + k0, kp, panel, kcp, nf,
                             first, b);
        if (t < t1)
          micro_tail<kBf16Mr - 1>(static_cast<int>(t1 - t), y + t * ldy + f0, ldy,
                                  xb + t * kp + k0, kp, panel, kcp, nf, first, b);
      }
    }
  }
}

}  // namespace
}  // namespace LLMK_DOT_NS
}  // namespace llmk

// The unit's entry points (cpp/arch/dot_bf16*.cpp define LLMK_DOT_ENTRY): common/dot.cpp picks
// the native or the SIMDe unit's
#if defined(LLMK_DOT_ENTRY)
namespace llmk::dot::LLMK_DOT_ENTRY {
void round_x(std::uint16_t* xb, std::size_t kp, const float* x, std::size_t ldx, std::size_t m,
             std::size_t k) {
  LLMK_DOT_NS::round_x_bf16(xb, kp, x, ldx, m, k);
}
void block(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp, std::size_t m,
           const std::uint16_t* w, std::size_t k, std::size_t nc, bool accumulate,
           const float* bias, std::uint32_t* wpack) {
  LLMK_DOT_NS::gemm_bf16_block(y, ldy, xb, kp, m, w, k, nc, accumulate, bias, wpack);
}
}  // namespace llmk::dot::LLMK_DOT_ENTRY
#endif
