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

#include "kernels/amx.hpp"

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

inline void round_x_bf16_rows(std::uint16_t* xb, std::size_t kp, std::size_t ldxb, const float* x,
                              std::size_t ldx, std::size_t m, std::size_t k) {
  for (std::size_t t = 0; t < m; ++t) {
    const float* src = x + t * ldx;
    std::uint16_t* dst = xb + t * ldxb;
    for (std::size_t i = 0; i < k; ++i) dst[i] = to_bf16(src[i]);
    for (std::size_t i = k; i < kp; ++i) dst[i] = 0;  // the pad (AMX: to a whole tile row)
  }
}

// dst row c (16 words at dst + c * lddst words) = word c of the 16 rows at src (row stride
// ldsrc bytes: bf16 rows of any length, so not always word-aligned): a 16 x 16 transpose of
// 32-bit words in three rounds of unpacks and lane shuffles
inline void transpose_words_16x16(std::uint32_t* dst, std::size_t lddst, const char* src,
                                  std::size_t ldsrc) {
  V512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = LLMK_M5(loadu_si512)(src + i * ldsrc);
  for (int i = 0; i < 8; ++i) {  // lane L: rows 2i, 2i + 1 at words 4L, 4L + 1 | 4L + 2, 4L + 3
    t[2 * i] = LLMK_M5(unpacklo_epi32)(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = LLMK_M5(unpackhi_epi32)(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // r[4g + j], lane L: rows 4g ... 4g + 3 at word 4L + j
    r[4 * g] = LLMK_M5(unpacklo_epi64)(t[4 * g], t[4 * g + 2]);
    r[4 * g + 1] = LLMK_M5(unpackhi_epi64)(t[4 * g], t[4 * g + 2]);
    r[4 * g + 2] = LLMK_M5(unpacklo_epi64)(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = LLMK_M5(unpackhi_epi64)(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // word 4L + j: lane L of r[j], r[4 + j], r[8 + j], r[12 + j]
    const V512i u0 = LLMK_M5(shuffle_i32x4)(r[j], r[4 + j], 0x88);
    const V512i u1 = LLMK_M5(shuffle_i32x4)(r[j], r[4 + j], 0xdd);
    const V512i u2 = LLMK_M5(shuffle_i32x4)(r[8 + j], r[12 + j], 0x88);
    const V512i u3 = LLMK_M5(shuffle_i32x4)(r[8 + j], r[12 + j], 0xdd);
    LLMK_M5(storeu_si512)(dst + (0 + j) * lddst, LLMK_M5(shuffle_i32x4)(u0, u2, 0x88));
    LLMK_M5(storeu_si512)(dst + (4 + j) * lddst, LLMK_M5(shuffle_i32x4)(u1, u3, 0x88));
    LLMK_M5(storeu_si512)(dst + (8 + j) * lddst, LLMK_M5(shuffle_i32x4)(u0, u2, 0xdd));
    LLMK_M5(storeu_si512)(dst + (12 + j) * lddst, LLMK_M5(shuffle_i32x4)(u1, u3, 0xdd));
  }
}

// W rows [0, nc) x elements [k0, k0 + 2 * kcp) -> panels of kBf16Nr features, (kcp, kBf16Nr)
// words each; features past nc and the elements past k are 0. Whole panels go 16 x 16 words at
// a time through transpose_words_16x16 (the scalar loop cost the AMX kernel a fifth of a
// 512-token call), the rest word by word.
inline void pack_w_bf16(std::uint32_t* wp, const std::uint16_t* w, std::size_t k,
                        std::size_t nc, std::size_t k0, std::size_t kcp) {
  const std::size_t avail = k - k0;  // elements of each row from k0 on
  for (std::size_t f0 = 0; f0 < nc; f0 += kBf16Nr) {
    std::uint32_t* panel = wp + (f0 / kBf16Nr) * kcp * kBf16Nr;
    std::size_t kk0 = 0;  // words done by the transposes
    if (f0 + kBf16Nr <= nc) {
      kk0 = std::min(kcp, avail / 2) / 16 * 16;
      for (std::size_t kb = 0; kb < kk0; kb += 16)
        for (std::size_t h = 0; h < kBf16Nr; h += 16)
          transpose_words_16x16(panel + kb * kBf16Nr + h, kBf16Nr,
                                reinterpret_cast<const char*>(w + (f0 + h) * k + k0 + 2 * kb),
                                k * sizeof(std::uint16_t));
    }
    for (std::size_t f = 0; f < kBf16Nr; ++f) {
      if (f0 + f >= nc) {
        for (std::size_t kk = kk0; kk < kcp; ++kk) panel[kk * kBf16Nr + f] = 0;
        continue;
      }
      const std::uint16_t* row = w + (f0 + f) * k + k0;
      for (std::size_t kk = kk0; kk < kcp; ++kk) {
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
inline void round_x_bf16(std::uint16_t* xb, std::size_t kp, std::size_t ldxb, const float* x,
                         std::size_t ldx, std::size_t m, std::size_t k) {
  round_x_bf16_rows(xb, kp, ldxb, x, ldx, m, k);
}

// One column block: y (m, nc) (row stride ldy) (+)= xb (m, kp; row stride ldxb) bf16 . w (nc, k)
// bf16 ^T (+ bias (nc,)); wpack: kBf16BlockCols x kBf16Kc / 2 words of scratch
// (nc <= kBf16BlockCols)
inline void gemm_bf16_block(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp,
                            std::size_t ldxb, std::size_t m, const std::uint16_t* w,
                            std::size_t k, std::size_t nc, bool accumulate, const float* bias,
                            std::uint32_t* wpack) {
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
          micro_any<kBf16Mr>(y + t * ldy + f0, ldy, xb + t * ldxb + k0, ldxb, panel, kcp, nf,
                             first, b);
        if (t < t1)
          micro_tail<kBf16Mr - 1>(static_cast<int>(t1 - t), y + t * ldy + f0, ldy,
                                  xb + t * ldxb + k0, ldxb, panel, kcp, nf, first, b);
      }
    }
  }
}

// AMX (kernels/amx.hpp): 32 tokens x one 32-feature panel per step, the 2 x 2 float32 C tiles
// in the tile registers for the whole k block; each step of 32 elements of k loads two A tiles
// (x rows, straight from xb) and two B tiles (the panel's two 16-feature halves: the panel
// words [kk][f] are tdpbf16ps's B layout, row stride kBf16Nr words) for four tdpbf16ps. c: the
// block's (32, 32) output, row stride ldc; first: from 0, else from c.
inline void micro_bf16_amx(float* c, std::size_t ldc, const std::uint16_t* xh, std::size_t ldxh,
                           const std::uint32_t* panel, std::size_t kcp, bool first) {
  const std::size_t sc = ldc * sizeof(float), sa = ldxh * sizeof(std::uint16_t);
  constexpr std::size_t sb = kBf16Nr * sizeof(std::uint32_t);
  if (first) {
    LLMK_TILE_ZERO(0);
    LLMK_TILE_ZERO(1);
    LLMK_TILE_ZERO(2);
    LLMK_TILE_ZERO(3);
  } else {
    LLMK_TILE_LOAD(0, c, sc);
    LLMK_TILE_LOAD(1, c + 16, sc);
    LLMK_TILE_LOAD(2, c + 16 * ldc, sc);
    LLMK_TILE_LOAD(3, c + 16 * ldc + 16, sc);
  }
  for (std::size_t kk = 0; kk < kcp; kk += 16) {  // 16 words = 32 elements of k
    LLMK_TILE_LOAD(4, xh + 2 * kk, sa);
    LLMK_TILE_LOAD(5, xh + 16 * ldxh + 2 * kk, sa);
    LLMK_TILE_LOAD(6, panel + kk * kBf16Nr, sb);
    LLMK_TILE_LOAD(7, panel + kk * kBf16Nr + 16, sb);
    LLMK_TILE_DPBF16PS(0, 4, 6);
    LLMK_TILE_DPBF16PS(1, 4, 7);
    LLMK_TILE_DPBF16PS(2, 5, 6);
    LLMK_TILE_DPBF16PS(3, 5, 7);
  }
  LLMK_TILE_STORE(0, c, sc);
  LLMK_TILE_STORE(1, c + 16, sc);
  LLMK_TILE_STORE(2, c + 16 * ldc, sc);
  LLMK_TILE_STORE(3, c + 16 * ldc + 16, sc);
}

// gemm_bf16_block on AMX, same blocking and packing; xb as round_x_bf16 writes it with kp a
// multiple of kBf16AmxK and rows readable (zero) up to m rounded up to kBf16AmxM. A partial
// block (the last tokens, the last panel's features) goes through a local tile. Per (token,
// feature) the products are added in the order of k, as the vdpbf16ps kernel adds them.
inline void gemm_bf16_block_amx(float* y, std::size_t ldy, const std::uint16_t* xb,
                                std::size_t kp, std::size_t ldxb, std::size_t m,
                                const std::uint16_t* w, std::size_t k, std::size_t nc,
                                bool accumulate, const float* bias, std::uint32_t* wpack) {
  alignas(64) float tile[32][kBf16Nr] = {};
  const amx::Session session(amx::kWholeTiles);
  for (std::size_t k0 = 0; k0 < kp; k0 += kBf16Kc) {
    const std::size_t kcp = std::min(kBf16Kc, kp - k0) / 2;
    pack_w_bf16(wpack, w, k, nc, k0, kcp);
    const bool first = k0 == 0 && !accumulate;
    const bool last = k0 + kBf16Kc >= kp;
    for (std::size_t t0 = 0; t0 < m; t0 += kBf16Mc) {
      const std::size_t t1 = std::min(m, t0 + kBf16Mc);
      for (std::size_t f0 = 0; f0 < nc; f0 += kBf16Nr) {
        const std::uint32_t* panel = wpack + (f0 / kBf16Nr) * kcp * kBf16Nr;
        const std::size_t nf = std::min(kBf16Nr, nc - f0);
        for (std::size_t t = t0; t < t1; t += 32) {
          const std::size_t mt = std::min<std::size_t>(32, t1 - t);
          float* yt = y + t * ldy + f0;
          const bool whole = mt == 32 && nf == kBf16Nr;
          if (!whole && !first)
            for (std::size_t i = 0; i < mt; ++i) std::memcpy(tile[i], yt + i * ldy, nf * 4);
          micro_bf16_amx(whole ? yt : &tile[0][0], whole ? ldy : kBf16Nr, xb + t * ldxb + k0, ldxb,
                         panel, kcp, first);
          if (!whole)
            for (std::size_t i = 0; i < mt; ++i) std::memcpy(yt + i * ldy, tile[i], nf * 4);
          if (last && bias)
            for (std::size_t i = 0; i < mt; ++i)
              for (std::size_t f = 0; f < nf; ++f) yt[i * ldy + f] += bias[f0 + f];
        }
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
void round_x(std::uint16_t* xb, std::size_t kp, std::size_t ldxb, const float* x, std::size_t ldx,
             std::size_t m, std::size_t k) {
  LLMK_DOT_NS::round_x_bf16(xb, kp, ldxb, x, ldx, m, k);
}
void block(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp, std::size_t ldxb,
           std::size_t m,
           const std::uint16_t* w, std::size_t k, std::size_t nc, bool accumulate,
           const float* bias, std::uint32_t* wpack) {
  LLMK_DOT_NS::gemm_bf16_block(y, ldy, xb, kp, ldxb, m, w, k, nc, accumulate, bias, wpack);
}
void block_amx(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp,
               std::size_t ldxb, std::size_t m,
               const std::uint16_t* w, std::size_t k, std::size_t nc, bool accumulate,
               const float* bias, std::uint32_t* wpack) {
  LLMK_DOT_NS::gemm_bf16_block_amx(y, ldy, xb, kp, ldxb, m, w, k, nc, accumulate, bias, wpack);
}
}  // namespace llmk::dot::LLMK_DOT_ENTRY
#endif
