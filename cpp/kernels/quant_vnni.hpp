// Prefill of group-wise int8 / int4 weights (kernels/quant.hpp's format) with int8 activations,
// on VNNI's integer dot product: vpdpbusd (AVX512_VNNI + AVX512VL, 256-bit) adds to each int32
// lane the four products of unsigned by signed bytes -- in one instruction what AVX2 does with
// maddubs + madd (+ the sign trick).
//
// Bit for bit the AVX2 int8-activation GEMV of quant.hpp (qgemv_rows_w8_g and
// qgemv_rows_int4_pairs_g), token by token. Their arithmetic per (row, token): the blocks go 8 at
// a time, one block per lane; each block's integer dot product sum(code_w * code_x) (exact,
// whatever the instructions), converted, times d = s_w * s_x, FMA'd into lane l; the lanes summed
// by qhsum at the end. Here the weights of kVnniRowBlock rows are repacked so that one vpdpbusd
// gives 4 products of each of 8 blocks, one block per lane: a chain of 8 over a chunk leaves the
// 8 block sums in place, with no horizontal work, and a chunk costs one conversion, one product
// and one FMA per (row, token) -- where the natural order needed a conversion and an FMA per
// block. The pack, per row and chunk of 8 blocks (kVnniPackChunk bytes):
//   [0, 256)    the codes as int8 (int4: unpacked), 8 vectors: vector j, lane l = codes 4j ..
//               4j + 3 of block l
//   [256, 288)  8 int32: -128 * the sum of block l's codes
//   [288, 320)  8 float: block l's weight scale
// (blocks past the last: codes, offsets and scales 0). The activations are laid out the same
// way once per call (qacts::xi, each code + 128: vpdpbusd's unsigned operand; the offsets take
// the 128 * sum(w) this adds back off). The repacking costs about one token's pass over the
// block, once per call: this path runs from 17 tokens.
// 256-bit vectors, not 512: 16 blocks per lane set would be summed in a different order than
// AVX2's 8 (not bitwise), and Zen 4 -- the common host with VNNI here -- splits 512-bit
// operations into two 256-bit halves anyway. AVX-512VL gives 32 vector registers: 4 rows x 3
// tokens of int32 chains and float accumulators, and the 7 operands.
//
// Blocking: rows in blocks of kVnniRowBlock (repacked: 80-220 KiB at k = 2048-5632, in L2)
// against every token of the call, 3 tokens x 4 rows at a time (the 3 tokens' codes in L1).
//
// This header is compiled twice (cpp/arch/dot_*.cpp): natively with -mavx512vnni -mavx512vl, and
// on the AVX2 baseline against SIMDe (SIMD Everywhere), whose portable vpdpbusd lets the suite
// run -- and compare bit for bit -- the same source on hosts without the instruction. Each unit
// puts it in its own namespace (LLMK_DOT_NS): nothing here is shared between the two.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/dot.hpp"     // the pack layout constants
#include "kernels/quant.hpp"  // qhsum, qstore, qblock_avx2, half_to_float (AVX2 unit code)

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
template <int Bits>
inline void vnni_pack(const qweights& w, std::size_t r0, std::size_t nr, std::uint8_t* pack) {
  const std::size_t k = w.k, nb = k / kQBlock, nch = dot::vnni_chunks(k), ng = k / w.group;
  const std::size_t bpg = w.group / kQBlock;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), zero = _mm256_setzero_si256();
  for (std::size_t r = 0; r < nr; ++r) {
    const std::uint8_t* row = w.q + (r0 + r) * (k * Bits / 8);
    const std::uint16_t* rsc = w.scales + (r0 + r) * ng;
    for (std::size_t c = 0; c < nch; ++c) {
      const std::size_t b0 = 8 * c, n = std::min<std::size_t>(8, nb - b0);
      std::uint8_t* dst = pack + (r * nch + c) * dot::kVnniPackChunk;
      __m256i v[8], out[8];
      for (std::size_t l = 0; l < 8; ++l)
        v[l] = l < n ? qblock_avx2<Bits>(row, b0 + l) : zero;  // the codes, as int8
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
inline void vnni_tile(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                       std::size_t p0, std::size_t t0) {
  const std::size_t nch = dot::vnni_chunks(a.w.k), rstride = nch * dot::kVnniPackChunk;
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

constexpr int kVnniR = 4, kVnniM = 3;  // rows x tokens: 2 x 12 accumulators + 7 operands

// pack rows [p0, p1) against tokens t0 .. t0 + M - 1
template <int M>
inline void vnni_tokens(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                         std::size_t nr, std::size_t t0) {
  std::size_t p = 0;
  for (; p + kVnniR <= nr; p += kVnniR) vnni_tile<kVnniR, M>(a, pack, r0, p, t0);
  for (; p < nr; ++p) vnni_tile<1, M>(a, pack, r0, p, t0);
}

template <int Bits>
inline void vnni_gemm(const qgemv_args& a, std::uint8_t* pack) {
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kVnniRowBlock) {
    const std::size_t nr = std::min(a.w.rows - r0, kVnniRowBlock);
    vnni_pack<Bits>(a.w, r0, nr, pack);
    std::size_t t = 0;
    for (; t + kVnniM <= a.m; t += kVnniM) vnni_tokens<kVnniM>(a, pack, r0, nr, t);
    switch (a.m - t) {
      case 1:
        vnni_tokens<1>(a, pack, r0, nr, t);
        break;
      case 2:
        vnni_tokens<2>(a, pack, r0, nr, t);
        break;
      case 3:
        vnni_tokens<3>(a, pack, r0, nr, t);
        break;
      default:
        break;
    }
  }
}

// y (m, rows) (+)= x (m, k) . W_deq^T (+ bias) with int8 activations (a.act.xi and sx8 as
// qlinear prepares them), any m; pack: dot::vnni_pack_bytes(k) bytes of scratch
inline void qgemm_int8_acts(const qgemv_args& a, int bits, std::uint8_t* pack) {
  if (bits == 8)
    vnni_gemm<8>(a, pack);
  else
    vnni_gemm<4>(a, pack);
}

}  // namespace
}  // namespace LLMK_DOT_NS
}  // namespace llmk
