// Prefill of group-wise int8 / int4 weights (kernels/quant.hpp's format) with int8 activations,
// on VNNI's integer dot product: vpdpbusd (AVX512_VNNI + AVX512VL, 256-bit) adds to each int32
// lane the four products of unsigned by signed bytes -- in one instruction what AVX2 does with
// maddubs + madd (+ the sign trick).
//
// Bit for bit the AVX2 int8-activation kernels of quant.hpp (qgemv_rows_w8_g and
// qgemv_rows_int4_pairs_g), token by token: each int32 lane holds the same integer (integer sums
// are exact, whatever the instruction), converted, multiplied by the same d = s_w * s_x and
// FMA'd into one accumulator per (row, token) in the same block order, then summed across lanes
// by the same qhsum. Only the instruction count per block differs:
//   int8 weights: the activation codes x are made unsigned, x + 128 (an XOR of the sign bit, once
//     per (token, block)); vpdpbusd(c, x + 128, w) with c = -128 * sum(w) per lane (two
//     instructions per (row, block), shared by the tokens) is sum(x * w): one instruction per
//     (row, token, block) where AVX2 spends sign + maddubs + madd.
//   int4 weights: the nibbles n = code + 8 are the unsigned operand, x the signed one; the
//     offset 8 * sum(x) per lane (the int16 sums qacts::x8 that AVX2 subtracts, widened by one
//     madd per (token, pair)) starts the accumulation: two vpdpbusd per (row, token, pair of
//     blocks) where AVX2 spends two maddubs, an add, a sub and a madd.
// 256-bit vectors, not 512: the lanes of a 512-bit vector would pair blocks b and b + 1 in
// separate halves, summed in a different order than AVX2's (not bitwise), and Zen 4 -- the
// common host with VNNI here -- splits 512-bit operations into two 256-bit halves anyway. AVX-512VL
// gives 32 vector registers: R x M = 4 x 4 accumulators.
//
// Blocking: rows in blocks of kVnniRowBlock (their codes, 64-128 KiB at k = 2048, stay in L2)
// against every token of the call, 4 tokens x 4 rows at a time (the 4 tokens' codes in L1).
//
// This header is compiled twice (cpp/arch/dot_*.cpp): natively with -mavx512vnni -mavx512vl, and
// on the AVX2 baseline against SIMDe (SIMD Everywhere), whose portable vpdpbusd lets the suite
// run -- and compare bit for bit -- the same source on hosts without the instruction. Each unit
// puts it in its own namespace (LLMK_DOT_NS): nothing here is shared between the two.
#pragma once

#include <immintrin.h>

#include <algorithm>

#include "kernels/quant.hpp"  // qhsum, qstore, int4_pair_wscale, half_to_float (AVX2 unit code)

#if defined(LLMK_DOT_SIMDE)
#include <simde/x86/avx512/dpbusd.h>
#define LLMK_DPBUSD256(src, a, b) simde_mm256_dpbusd_epi32((src), (a), (b))
#else
#if !defined(__AVX512VNNI__) || !defined(__AVX512VL__)
#error "quant_vnni.hpp: build with -mavx512vnni -mavx512vl, or define LLMK_DOT_SIMDE"
#endif
#define LLMK_DPBUSD256(src, a, b) _mm256_dpbusd_epi32((src), (a), (b))
#endif

#if !defined(__AVX2__)
#error "quant_vnni.hpp: the AVX2 unit code of quant.hpp is the float side"
#endif

namespace llmk {
namespace LLMK_DOT_NS {
namespace {

constexpr std::size_t kVnniRowBlock = 64;  // rows per L2 block (a multiple of R)
constexpr int kVnniR = 4, kVnniM = 4;      // rows x tokens of accumulators

// int8 weights: rows r0 .. r0 + R - 1 against tokens t0 .. t0 + M - 1
template <int R, int M, bool Group32>
inline void vnni_rows_w8(const qgemv_args& a, std::size_t r0, std::size_t t0) {
  const std::size_t k = a.w.k, nb = k / kQBlock, ng = k / a.w.group;
  const unsigned sh = a.w.group == 64 ? 1 : 2;  // blocks per group = 1 << sh (64, 128)
  const __m256i zero = _mm256_setzero_si256();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // 128 as unsigned bytes
  __m256 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) acc[r][t] = _mm256_setzero_ps();
  const std::uint8_t* w0 = a.w.q + r0 * k;                // (R, k) codes
  const std::uint16_t* s0 = a.w.scales + r0 * ng;         // (R, ng) float16 scales
  const std::int8_t* x0 = a.act.q + t0 * k;               // (M, k) activation codes
  const float* sx0 = a.act.s + t0 * nb;                   // (M, nb) activation scales
  // one step: block b, with the products d = s_w * s_x either given per (row, token) in d8
  // (column j) or formed here from the block's weight scale
  alignas(32) float d8[R][M][8];  // groups of 32: the products of 8 blocks, formed at once
  const auto block = [&](std::size_t b, int j) {
    __m256i xu[M];  // x + 128, unsigned
    for (int t = 0; t < M; ++t)
      xu[t] = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + t * k + b * kQBlock)), flip);
    for (int r = 0; r < R; ++r) {
      const __m256i w =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + r * k + b * kQBlock));
      const __m256i c = _mm256_sub_epi32(zero, LLMK_DPBUSD256(zero, flip, w));  // -128 sum(w)
      for (int t = 0; t < M; ++t) {
        const __m256 p = _mm256_cvtepi32_ps(LLMK_DPBUSD256(c, xu[t], w));
        acc[r][t] = _mm256_fmadd_ps(p, _mm256_broadcast_ss(&d8[r][t][j]), acc[r][t]);
      }
    }
  };
  std::size_t b0 = 0;
  if constexpr (Group32) {
    // the products of 8 blocks per (row, token) by one conversion of the row's 8 scales and one
    // product (the same values as one at a time): a third of the float work per block
    for (; b0 + 8 <= nb; b0 += 8) {
      for (int r = 0; r < R; ++r) {
        const __m256 sw8 = _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(s0 + r * ng + b0)));
        for (int t = 0; t < M; ++t)
          _mm256_store_ps(d8[r][t], _mm256_mul_ps(sw8, _mm256_loadu_ps(sx0 + t * nb + b0)));
      }
      for (int j = 0; j < 8; ++j) block(b0 + j, j);
    }
  }
  for (std::size_t b = b0; b < nb; ++b) {
    __m256i xu[M];  // x + 128, unsigned
    __m256 sx[M];
    for (int t = 0; t < M; ++t) {
      xu[t] = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0 + t * k + b * kQBlock)), flip);
      sx[t] = _mm256_broadcast_ss(sx0 + t * nb + b);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i w =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + r * k + b * kQBlock));
      const __m256i c = _mm256_sub_epi32(zero, LLMK_DPBUSD256(zero, flip, w));  // -128 sum(w)
      const __m256 sw = _mm256_cvtph_ps(
          _mm_set1_epi16(static_cast<short>(s0[r * ng + (Group32 ? b : b >> sh)])));
      for (int t = 0; t < M; ++t) {
        const __m256 p = _mm256_cvtepi32_ps(LLMK_DPBUSD256(c, xu[t], w));
        acc[r][t] = _mm256_fmadd_ps(p, _mm256_mul_ps(sw, sx[t]), acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) qstore(a, r0 + r, t0 + t, qhsum(acc[r][t]));
}

// int4 weights, two blocks a step in the pair layout of quant.hpp's AVX2 kernel (qacts::q4, x8,
// sx2); an odd last block in natural order
template <int R, int M, bool Group32>
inline void vnni_rows_w4(const qgemv_args& a, std::size_t r0, std::size_t t0) {
  const std::size_t k = a.w.k, nb = k / kQBlock, np = nb / 2, row_bytes = k / 2;
  const std::size_t ng = k / a.w.group;
  const unsigned sh = a.w.group == 64 ? 1 : 2;
  const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi16(1);
  const __m256i mask = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
  __m256 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) acc[r][t] = _mm256_setzero_ps();
  const std::uint8_t* w0 = a.w.q + r0 * row_bytes;  // (R, k / 2) nibbles
  const std::uint16_t* s0 = a.w.scales + r0 * ng;   // (R, ng)
  const std::int8_t* q4 = a.act.q4 + t0 * k;        // (M, k) codes in pair order
  for (std::size_t p = 0; p < np; ++p) {
    const std::size_t b = 2 * p;
    __m256i xlo[M], xhi[M], c[M];
    __m256 sx[M];
    for (int t = 0; t < M; ++t) {
      const std::int8_t* xp = q4 + t * k + b * kQBlock;
      xlo[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp));
      xhi[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xp + 32));
      // -8 * (the lane's 8 codes): the int16 sums of qacts::x8, pairwise into int32
      const __m256i x8 = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(a.act.x8 + ((t0 + t) * np + p) * 16));
      c[t] = _mm256_sub_epi32(zero, _mm256_madd_epi16(x8, ones));
      sx[t] = _mm256_loadu_ps(a.act.sx2 + ((t0 + t) * np + p) * 8);
    }
    for (int r = 0; r < R; ++r) {
      const __m256i pk =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + r * row_bytes + b * 16));
      const __m256i lo = _mm256_and_si256(pk, mask);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(pk, 4), mask);
      const __m256 sw = int4_pair_wscale<Group32>(s0 + r * ng, b, sh);
      for (int t = 0; t < M; ++t) {
        const __m256i q = LLMK_DPBUSD256(LLMK_DPBUSD256(c[t], lo, xlo[t]), hi, xhi[t]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_mul_ps(sw, sx[t]), acc[r][t]);
      }
    }
  }
  if (nb % 2) {  // the odd last block, stored in natural order
    const std::size_t b = nb - 1;
    for (int r = 0; r < R; ++r) {
      const __m128i pk =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(w0 + r * row_bytes + b * 16));
      const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(pk, 4), pk), mask);
      const float sw = half_to_float(s0[r * ng + (Group32 ? b : b >> sh)]);
      for (int t = 0; t < M; ++t) {
        const __m256i xq =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q4 + t * k + b * kQBlock));
        const __m256i c = _mm256_sub_epi32(zero, LLMK_DPBUSD256(zero, eight, xq));  // -8 sum(x)
        const __m256 pf = _mm256_cvtepi32_ps(LLMK_DPBUSD256(c, nib, xq));
        const __m256 d = _mm256_set1_ps(sw * a.act.s[(t0 + t) * nb + b]);
        acc[r][t] = _mm256_fmadd_ps(pf, d, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) qstore(a, r0 + r, t0 + t, qhsum(acc[r][t]));
}

template <int Bits, int R, int M>
inline void vnni_rows(const qgemv_args& a, std::size_t r0, std::size_t t0) {
  const bool group32 = a.w.group == kQBlock;
  if constexpr (Bits == 8) {
    if (group32)
      vnni_rows_w8<R, M, true>(a, r0, t0);
    else
      vnni_rows_w8<R, M, false>(a, r0, t0);
  } else {
    if (group32)
      vnni_rows_w4<R, M, true>(a, r0, t0);
    else
      vnni_rows_w4<R, M, false>(a, r0, t0);
  }
}

// rows [r0, r1) against tokens t0 .. t0 + M - 1: R rows at a time, then one at a time
template <int Bits, int M>
inline void vnni_tokens(const qgemv_args& a, std::size_t r0, std::size_t r1, std::size_t t0) {
  std::size_t r = r0;
  for (; r + kVnniR <= r1; r += kVnniR) vnni_rows<Bits, kVnniR, M>(a, r, t0);
  for (; r < r1; ++r) vnni_rows<Bits, 1, M>(a, r, t0);
}

template <int Bits>
inline void vnni_gemm(const qgemv_args& a) {
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kVnniRowBlock) {
    const std::size_t r1 = std::min(a.w.rows, r0 + kVnniRowBlock);
    std::size_t t = 0;
    for (; t + kVnniM <= a.m; t += kVnniM) vnni_tokens<Bits, kVnniM>(a, r0, r1, t);
    switch (a.m - t) {
      case 1:
        vnni_tokens<Bits, 1>(a, r0, r1, t);
        break;
      case 2:
        vnni_tokens<Bits, 2>(a, r0, r1, t);
        break;
      case 3:
        vnni_tokens<Bits, 3>(a, r0, r1, t);
        break;
      default:
        break;
    }
  }
}

// y (m, rows) (+)= x (m, k) . W_deq^T (+ bias) with int8 activations (a.act as qlinear prepares
// it for the AVX2 int8-activation GEMV: q and s, and for int4 q4, x8 and sx2), any m.
inline void qgemm_int8_acts(const qgemv_args& a, int bits) {
  if (bits == 8)
    vnni_gemm<8>(a);
  else
    vnni_gemm<4>(a);
}

}  // namespace
}  // namespace LLMK_DOT_NS
}  // namespace llmk
