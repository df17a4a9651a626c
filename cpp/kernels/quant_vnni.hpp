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
#include <cstring>

#include "common/dot.hpp"  // the pack layout constants

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

using dot::kVnniChunkBytes;
using dot::kVnniRowBlock;
constexpr int kVnniR = 4, kVnniM = 4;  // rows x tokens of accumulators (int4)

// --- int8 weights: repacked one block per lane -------------------------------------------------
// A block of kVnniRowBlock rows is repacked before every token passes over it (pack: per row
// and chunk of 8 blocks, kVnniPackChunk bytes):
//   [0, 256)    the codes, 8 vectors: vector j, lane l = codes 4j .. 4j + 3 of block l (int8)
//   [256, 288)  8 int32: -128 * the sum of block l's codes (the offset of the unsigned x + 128)
//   [288, 320)  8 float: block l's weight scale
// (blocks past the last: codes, offsets and scales 0). A chain of 8 vpdpbusd, from the offsets,
// then leaves in lane l the exact sum(code_w * code_x) of block l against act.xi (the codes
// + 128 in the same lanes) -- where the natural order needed a conversion and an FMA per block,
// a chunk now takes one of each: the float work per product falls 8-fold. The repacking costs
// about what one token's pass over the block does, once per call.

// The 8 x 8 transpose of 32-bit groups: out[j] lane l = v[l] lane j
inline void transpose8x32(const __m256i (&v)[8], __m256i (&out)[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // v[4h .. 4h + 3]
    u[4 * h] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    out[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
    out[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
  }
}

// rows [r0, r0 + nr) of w into pack
inline void vnni8_pack(const qweights& w, std::size_t r0, std::size_t nr, std::uint8_t* pack) {
  const std::size_t k = w.k, nb = k / kQBlock, nch = dot::vnni8_chunks(k), ng = k / w.group;
  const std::size_t bpg = w.group / kQBlock;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), zero = _mm256_setzero_si256();
  for (std::size_t r = 0; r < nr; ++r) {
    const std::uint8_t* row = w.q + (r0 + r) * k;
    const std::uint16_t* rsc = w.scales + (r0 + r) * ng;
    for (std::size_t c = 0; c < nch; ++c) {
      const std::size_t b0 = 8 * c, n = std::min<std::size_t>(8, nb - b0);
      std::uint8_t* dst = pack + (r * nch + c) * dot::kVnniPackChunk;
      __m256i v[8], out[8];
      for (std::size_t l = 0; l < 8; ++l)
        v[l] = l < n ? _mm256_loadu_si256(
                           reinterpret_cast<const __m256i*>(row + (b0 + l) * kQBlock))
                     : zero;
      transpose8x32(v, out);
      __m256i sum = zero;  // 128 * sum(codes) per block
      for (int j = 0; j < 8; ++j) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * j), out[j]);
        sum = LLMK_DPBUSD256(sum, flip, out[j]);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + kVnniChunkBytes),
                          _mm256_sub_epi32(zero, sum));
      alignas(32) float sw[8] = {};
      for (std::size_t l = 0; l < n; ++l) sw[l] = half_to_float(rsc[(b0 + l) / bpg]);
      std::memcpy(dst + kVnniChunkBytes + 32, sw, sizeof sw);
    }
  }
}

// rows p0 .. p0 + R - 1 of the pack (rows r0 + p0 .. of a) against tokens t0 .. t0 + M - 1: per
// chunk, R x M chains of 8 vpdpbusd, then per (row, token) one conversion, the products
// d = s_w * s_x of the 8 blocks and one FMA -- qgemv_rows_w8_g's arithmetic (kernels/quant.hpp)
template <int R, int M>
inline void vnni8_tile(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                       std::size_t p0, std::size_t t0) {
  const std::size_t nch = dot::vnni8_chunks(a.w.k), rstride = nch * dot::kVnniPackChunk;
  const std::uint8_t* wr = pack + p0 * rstride;                 // (R, nch, 320) repacked rows
  const std::uint8_t* xt = a.act.xi + t0 * nch * kVnniChunkBytes;  // (M, nch, 256) x + 128
  const float* st = a.act.sx8 + t0 * nch * 8;                   // (M, nch, 8) scales
  __m256 acc[R][M];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) acc[r][t] = _mm256_setzero_ps();
  for (std::size_t c = 0; c < nch; ++c) {
    const std::uint8_t* wc = wr + c * dot::kVnniPackChunk;
    const std::uint8_t* xc = xt + c * kVnniChunkBytes;
    __m256i s[R][M];
    for (int r = 0; r < R; ++r) {
      const __m256i off = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(wc + r * rstride + kVnniChunkBytes));
      for (int t = 0; t < M; ++t) s[r][t] = off;
    }
    for (int j = 0; j < 8; ++j) {
      __m256i wv[R], xv[M];
      for (int r = 0; r < R; ++r)
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + r * rstride + 32 * j));
      for (int t = 0; t < M; ++t)
        xv[t] = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(xc + t * nch * kVnniChunkBytes + 32 * j));
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < M; ++t) s[r][t] = LLMK_DPBUSD256(s[r][t], xv[t], wv[r]);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 sw = _mm256_loadu_ps(
          reinterpret_cast<const float*>(wc + r * rstride + kVnniChunkBytes + 32));
      for (int t = 0; t < M; ++t) {
        const __m256 d = _mm256_mul_ps(sw, _mm256_loadu_ps(st + t * nch * 8 + c * 8));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r][t]), d, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < M; ++t) qstore(a, r0 + p0 + r, t0 + t, qhsum(acc[r][t]));
}

constexpr int kVnni8R = 4, kVnni8M = 3;  // rows x tokens: 2 x 12 accumulators + 7 operands

// pack rows [p0, p1) against tokens t0 .. t0 + M - 1
template <int M>
inline void vnni8_tokens(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                         std::size_t nr, std::size_t t0) {
  std::size_t p = 0;
  for (; p + kVnni8R <= nr; p += kVnni8R) vnni8_tile<kVnni8R, M>(a, pack, r0, p, t0);
  for (; p < nr; ++p) vnni8_tile<1, M>(a, pack, r0, p, t0);
}

inline void vnni8_gemm(const qgemv_args& a, std::uint8_t* pack) {
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kVnniRowBlock) {
    const std::size_t nr = std::min(a.w.rows - r0, kVnniRowBlock);
    vnni8_pack(a.w, r0, nr, pack);
    std::size_t t = 0;
    for (; t + kVnni8M <= a.m; t += kVnni8M) vnni8_tokens<kVnni8M>(a, pack, r0, nr, t);
    switch (a.m - t) {
      case 1:
        vnni8_tokens<1>(a, pack, r0, nr, t);
        break;
      case 2:
        vnni8_tokens<2>(a, pack, r0, nr, t);
        break;
      case 3:
        vnni8_tokens<3>(a, pack, r0, nr, t);
        break;
      default:
        break;
    }
  }
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

template <int R, int M>
inline void vnni_rows(const qgemv_args& a, std::size_t r0, std::size_t t0) {
  if (a.w.group == kQBlock)
    vnni_rows_w4<R, M, true>(a, r0, t0);
  else
    vnni_rows_w4<R, M, false>(a, r0, t0);
}

// rows [r0, r1) against tokens t0 .. t0 + M - 1: R rows at a time, then one at a time
template <int M>
inline void vnni_tokens(const qgemv_args& a, std::size_t r0, std::size_t r1, std::size_t t0) {
  std::size_t r = r0;
  for (; r + kVnniR <= r1; r += kVnniR) vnni_rows<kVnniR, M>(a, r, t0);
  for (; r < r1; ++r) vnni_rows<1, M>(a, r, t0);
}

inline void vnni4_gemm(const qgemv_args& a) {
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kVnniRowBlock) {
    const std::size_t r1 = std::min(a.w.rows, r0 + kVnniRowBlock);
    std::size_t t = 0;
    for (; t + kVnniM <= a.m; t += kVnniM) vnni_tokens<kVnniM>(a, r0, r1, t);
    switch (a.m - t) {
      case 1:
        vnni_tokens<1>(a, r0, r1, t);
        break;
      case 2:
        vnni_tokens<2>(a, r0, r1, t);
        break;
      case 3:
        vnni_tokens<3>(a, r0, r1, t);
        break;
      default:
        break;
    }
  }
}

// y (m, rows) (+)= x (m, k) . W_deq^T (+ bias) with int8 activations (a.act as qlinear prepares
// it for the AVX2 int8-activation GEMV: q and s, and for int4 q4, x8 and sx2), any m.
inline void qgemm_int8_acts(const qgemv_args& a, int bits, std::uint8_t* pack) {
  if (bits == 8)
    vnni8_gemm(a, pack);
  else
    vnni4_gemm(a);
}

}  // namespace
}  // namespace LLMK_DOT_NS
}  // namespace llmk
