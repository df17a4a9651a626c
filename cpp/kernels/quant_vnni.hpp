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
// 256-bit vectors: 16 blocks per lane set would be summed in a different order than AVX2's 8
// (not bitwise), and Zen 4 splits 512-bit operations into two 256-bit halves anyway. Where the
// units are 512 bits wide, vnni_gemm512 below puts two rows in one vector instead (the same
// arithmetic per row). AVX-512VL gives 32 vector registers: 4 rows x 3 tokens of int32 chains
// and float accumulators, and the 7 operands.
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

#if defined(LLMK_DOT_MADDUBS)
// (no vpdpbusd: the tiles' integer side below is AVX2's maddubs + madd; the pack stores no
// offsets, and the GEMV and AMX parts of this header are left out)
#elif defined(LLMK_DOT_SIMDE)
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

#if !defined(LLMK_DOT_MADDUBS)
#include "kernels/amx.hpp"  // the AMX kernel below (native, or on emulated tiles)
#endif
#if defined(LLMK_DOT_MADDUBS)
#elif defined(LLMK_DOT_SIMDE)
#include <simde/x86/avx512.h>
#define LLMK_Q5(f) simde_mm512_##f
#define LLMK_DPBUSD512(src, a, b) simde_mm512_dpbusd_epi32((src), (a), (b))
using Q512 = simde__m512;
using Q512i = simde__m512i;
#else
#define LLMK_Q5(f) _mm512_##f
#define LLMK_DPBUSD512(src, a, b) _mm512_dpbusd_epi32((src), (a), (b))
using Q512 = __m512;
using Q512i = __m512i;
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

// rows [r0, r0 + nr) of w into pack; returns whether a code is -128 (int8 on AVX2 only, else
// false: the kernel's sign(x) * w would wrap there). Pairs (the 512-bit kernel): rows 2p and 2p + 1 interleaved
// 32 bytes at a time -- pair p's chunk c (2 * kVnniPackChunk bytes) holds vector j of both rows
// at 64 j (row 2p first), their offsets at 512 and scales at 576 -- so one 512-bit load takes
// the same step of two rows; an odd last row is paired with zeros.
template <int Bits, bool Pairs = false>
inline bool vnni_pack(const qweights& w, std::size_t r0, std::size_t nr, std::uint8_t* pack) {
  const std::size_t k = w.k, nb = k / kQBlock, nch = dot::vnni_chunks(k), ng = k / w.group;
  const unsigned gsh = w.group == 128 ? 2 : w.group == 64 ? 1 : 0;  // blocks per group 1 << gsh
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), zero = _mm256_setzero_si256();
  constexpr std::size_t V = Pairs ? 64 : 32;  // bytes from one vector of a row to its next
  const std::size_t rows = Pairs ? (nr + 1) / 2 * 2 : nr;
  __m256i min_code = zero;  // (int8 on AVX2) lanes of -128 codes
  for (std::size_t r = 0; r < rows; ++r) {
    const std::uint8_t* row = w.q + (r0 + std::min(r, nr - 1)) * (k * Bits / 8);  // (pad: unread)
    const std::uint16_t* rsc = w.scales + (r0 + std::min(r, nr - 1)) * ng;
    for (std::size_t c = 0; c < nch; ++c) {
      const std::size_t b0 = 8 * c, n = r < nr ? std::min<std::size_t>(8, nb - b0) : 0;
      std::uint8_t* dst = Pairs
                              ? pack + ((r / 2) * nch + c) * 2 * dot::kVnniPackChunk + 32 * (r % 2)
                              : pack + (r * nch + c) * dot::kVnniPackChunk;
      __m256i v[8], out[8];
      for (std::size_t l = 0; l < 8; ++l)
        v[l] = l < n ? qblock_avx2<Bits>(row, b0 + l) : zero;  // the codes, as int8
#if defined(LLMK_DOT_MADDUBS)
      if constexpr (Bits == 4)  // maddubs' unsigned operand: code + 8 (blocks past the last 0)
        for (std::size_t l = 0; l < n; ++l) v[l] = _mm256_add_epi8(v[l], _mm256_set1_epi8(8));
      else
        for (std::size_t l = 0; l < n; ++l)
          min_code = _mm256_or_si256(min_code, _mm256_cmpeq_epi8(v[l], flip));
      transpose8x32(v, out);
      for (int j = 0; j < 8; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + V * j), out[j]);
      (void)flip;
#else
      transpose8x32(v, out);
      __m256i sum = zero;  // 128 * sum(codes) per block
      for (int j = 0; j < 8; ++j) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + V * j), out[j]);
        sum = LLMK_DPBUSD256(sum, flip, out[j]);
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 8 * V), _mm256_sub_epi32(zero, sum));
#endif
      if (gsh == 0 && n == 8) {  // groups of 32, a whole chunk: 8 scales widened by F16C (exact)
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rsc + b0));
        _mm256_storeu_ps(reinterpret_cast<float*>(dst + 9 * V), _mm256_cvtph_ps(h));
      } else {
        alignas(32) float sw[8] = {};
        for (std::size_t l = 0; l < n; ++l) sw[l] = half_to_float(rsc[(b0 + l) >> gsh]);
        std::memcpy(dst + 9 * V, sw, sizeof sw);
      }
    }
  }
  return !_mm256_testz_si256(min_code, min_code);
}

// step j of a chunk: vector j of R repacked rows and of M tokens' codes
template <int R, int M>
inline void load_step(const std::uint8_t* wc, std::size_t rstride, const std::uint8_t* xc,
                      std::size_t tstride, int j, __m256i (&wv)[R], __m256i (&xv)[M]) {
  for (int r = 0; r < R; ++r)
    wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + r * rstride + 32 * j));
  for (int t = 0; t < M; ++t)
    xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + t * tstride + 32 * j));
}

// The integer side of a chunk, R rows x M tokens: s[r][t] lane l = the dot product of block l's
// codes (exact). With vpdpbusd: chains of 8 from the offsets -128 * sum(w), x + 128 unsigned.
// On AVX2 (LLMK_DOT_MADDUBS, x as signed codes) maddubs multiplies unsigned by signed bytes into
// int16 pairs, which saturate: int8 weights take the sign trick -- |x| (act.xa, formed once per
// call) times sign(x) * w, a pair at most 2 * 127 * 127 < 2^15 -- and madd widens each pair to
// int32 at once. (|w| times sign(w) * x, the GEMV's order, costs an abs per row and step: on AMD
// Zen 3 the abs, sign, maddubs and madd share two pipes, and the inner loop of the 2 x 3 tile
// ran ~8% faster with |x| from memory: 65 against 60 G MAC/s, one core, L1-resident); int4 weights
// are stored as code + 8 (0 .. 15), so 8 steps of pairs add up in int16 (8 * 2 * 15 * 127 =
// 30480 < 2^15) before one madd, and 8 * sum(x) per block (act.xs8) comes off.
template <int R, int M, int Bits, bool AbsX = false>
inline void chunk_sums(const std::uint8_t* wc, std::size_t rstride, const std::uint8_t* xc,
                       std::size_t tstride, const std::int32_t* xs8c, std::size_t xs8stride,
                       const std::uint8_t* xac, __m256i (&s)[R][M]) {
#if defined(LLMK_DOT_MADDUBS)
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i h[R][M] = {};  // int8 weights: the int32 sums; int4: the int16 ones
  for (int j = 0; j < 8; ++j) {
    if constexpr (Bits == 8 && AbsX) {
      __m256i wv[R];
      for (int r = 0; r < R; ++r)
        wv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + r * rstride + 32 * j));
      for (int t = 0; t < M; ++t) {
        const __m256i ax =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xac + t * tstride + 32 * j));
        const __m256i xv =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + t * tstride + 32 * j));
        for (int r = 0; r < R; ++r)
          h[r][t] = _mm256_add_epi32(
              h[r][t],
              _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[r], xv)), ones));
      }
    } else {
      __m256i wv[R], xv[M];
      load_step(wc, rstride, xc, tstride, j, wv, xv);
      for (int r = 0; r < R; ++r) {
        const __m256i aw = _mm256_abs_epi8(wv[r]);  // (int8 only; -128 -> 128 unsigned)
        for (int t = 0; t < M; ++t)
          if constexpr (Bits == 8)
            h[r][t] = _mm256_add_epi32(
                h[r][t],
                _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv[t], wv[r])), ones));
          else
            h[r][t] = _mm256_add_epi16(h[r][t], _mm256_maddubs_epi16(wv[r], xv[t]));
      }
    }
  }
  for (int t = 0; t < M; ++t) {
    if constexpr (Bits == 8) {
      for (int r = 0; r < R; ++r) s[r][t] = h[r][t];
    } else {
      const __m256i off =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs8c + t * xs8stride));
      for (int r = 0; r < R; ++r)
        s[r][t] = _mm256_sub_epi32(_mm256_madd_epi16(h[r][t], ones), off);
    }
  }
#else
  (void)xs8c, (void)xs8stride, (void)xac;
  for (int r = 0; r < R; ++r) {
    const __m256i off = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(wc + r * rstride + kVnniChunkBytes));
    for (int t = 0; t < M; ++t) s[r][t] = off;
  }
  for (int j = 0; j < 8; ++j) {
    __m256i wv[R], xv[M];
    load_step(wc, rstride, xc, tstride, j, wv, xv);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < M; ++t) s[r][t] = LLMK_DPBUSD256(s[r][t], xv[t], wv[r]);
  }
#endif
}

// rows p0 .. p0 + R - 1 of the pack (rows r0 + p0 .. of a) against tokens t0 .. t0 + M - 1: per
// chunk the R x M block sums (chunk_sums), then per (row, token) one conversion, the products
// d = s_w * s_x of the 8 blocks and one FMA -- qgemv_rows_w8_g's arithmetic (kernels/quant.hpp)
template <int R, int M, int Bits, bool AbsX>
inline void vnni_tile(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                       std::size_t p0, std::size_t t0) {
  const std::size_t nch = dot::vnni_chunks(a.w.k), rstride = nch * dot::kVnniPackChunk;
  const std::uint8_t* wr = pack + p0 * rstride;                 // (R, nch, 320) repacked rows
  const std::uint8_t* xt = a.act.xi + t0 * nch * kVnniChunkBytes;  // (M, nch, 256) x codes
  const float* st = a.act.sx8 + t0 * nch * 8;                   // (M, nch, 8) scales
  const std::int32_t* xs8 = a.act.xs8 ? a.act.xs8 + t0 * nch * 8 : nullptr;  // (M, nch, 8)
  const std::uint8_t* xa = a.act.xa ? a.act.xa + t0 * nch * kVnniChunkBytes : nullptr;  // |xt|
  __m256 acc[R][M] = {};  // (zero)
  for (std::size_t c = 0; c < nch; ++c) {
    const std::uint8_t* wc = wr + c * dot::kVnniPackChunk;
    __m256i s[R][M];
    chunk_sums<R, M, Bits, AbsX>(wc, rstride, xt + c * kVnniChunkBytes, nch * kVnniChunkBytes,
                           xs8 ? xs8 + c * 8 : nullptr, nch * 8,
                           xa ? xa + c * kVnniChunkBytes : nullptr, s);
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

#if defined(LLMK_DOT_MADDUBS)
// 16 vector registers: rows x tokens of int sums + the operands (float accumulators spill, touched
// once per chunk); the best of 1x4, 2x2, 2x3, 3x2, 4x1, 4x2 measured (Intel, int8 and int4)
constexpr int kVnniR = 2, kVnniM = 3;
#else
constexpr int kVnniR = 4, kVnniM = 3;  // rows x tokens: 2 x 12 accumulators + 7 operands
#endif
static_assert(kVnniM <= 3, "vnni_gemm's tail takes up to 2 tokens");

// The next call's codes (qgemv_args::next_q) into L2, `step` cache lines after each tile: spread
// over the tiles of this call, so that the next block's repack finds its rows there. A batched
// decode step (few tokens) is otherwise a DRAM read in each repack, then compute, in turn.
// A 22-layer TinyLlama-1.1B decode step of 16 sequences, AMD EPYC Zen 4, ms without / with, 2
// processes each, 1 thread: int8 250 / 215-235, int4 214-248 / 178-198; 2 threads: int8 139-160
// / 108-141, int4 121-134 / 116-148 (a noisy host; prefill of 512 tokens within its noise).
struct NextPrefetch {
  const std::uint8_t* p;
  const std::uint8_t* end;
  std::size_t step;
  NextPrefetch(const qgemv_args& a, std::size_t tiles) : p(a.next_q), end(a.next_q), step(0) {
    if (!a.next_q || tiles == 0) return;
    end = a.next_q + a.next_bytes;
    step = (a.next_bytes / 64 + tiles) / tiles;
  }
  void operator()() {
    for (std::size_t i = 0; i < step && p < end; ++i, p += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  }
};

// pack rows [p0, p1) against tokens t0 .. t0 + M - 1
template <int M, int Bits, bool AbsX>
inline void vnni_tokens(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                         std::size_t nr, std::size_t t0, NextPrefetch& pf) {
  std::size_t p = 0;
  for (; p + kVnniR <= nr; p += kVnniR, pf())
    vnni_tile<kVnniR, M, Bits, AbsX>(a, pack, r0, p, t0);
  for (; p < nr; ++p, pf()) vnni_tile<1, M, Bits, AbsX>(a, pack, r0, p, t0);
}

// the tokens against one packed block of nr rows
template <int Bits, bool AbsX>
inline void vnni_block(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                       std::size_t nr, NextPrefetch& pf) {
  std::size_t t = 0;
  for (; t + kVnniM <= a.m; t += kVnniM) vnni_tokens<kVnniM, Bits, AbsX>(a, pack, r0, nr, t, pf);
  switch (a.m - t) {
    case 1:
      vnni_tokens<1, Bits, AbsX>(a, pack, r0, nr, t, pf);
      break;
    case 2:
      vnni_tokens<2, Bits, AbsX>(a, pack, r0, nr, t, pf);
      break;
    default:  // (none left: kVnniM <= 3)
      break;
  }
}

template <int Bits>
inline void vnni_gemm(const qgemv_args& a, std::uint8_t* pack) {
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kVnniRowBlock) {
    const std::size_t nr = std::min(a.w.rows - r0, kVnniRowBlock);
    const bool min_code = vnni_pack<Bits>(a.w, r0, nr, pack);
    // (the last block of the call: the next call's rows)
    const bool last = r0 + kVnniRowBlock >= a.w.rows;
    NextPrefetch pf(a, last ? (a.m + kVnniM - 1) / kVnniM * ((nr + kVnniR - 1) / kVnniR) : 0);
#if defined(LLMK_DOT_MADDUBS)
    // int8 on AVX2: |x| times sign(x) * w, unless a code of the block is -128 (lk.quantize
    // never writes one: its codes are in [-127, 127]; quantized_linear takes any)
    if (Bits == 8 && a.act.xa && !min_code) {
      vnni_block<Bits, true>(a, pack, r0, nr, pf);
      continue;
    }
#endif
    (void)min_code;
    vnni_block<Bits, false>(a, pack, r0, nr, pf);
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

#if !defined(LLMK_DOT_MADDUBS)
// ---- the same prefill on 512-bit vectors: two rows per vector (Int8Dot::vnni512) ----
// On a CPU whose vector units are 512 bits wide (AMD Zen 5, Intel) one 512-bit vpdpbusd does the
// work of two 256-bit ones at the same rate. Each 256-bit half of every vector here runs the
// 256-bit kernel's exact sequence for one row -- the pack puts rows 2p and 2p + 1 side by side
// (vnni_pack<Bits, true>), a token's codes and scales are broadcast to both halves -- so every
// row's lanes see the same operations in the same order: bit for bit the AVX2 GEMV as above.
// (Zen 4 runs 512-bit operations on its 256-bit units in two halves: there the 256-bit kernel.)

// 16 int32 -> float32 (exact: |block sums| < 2^24; SIMDe has no 512-bit conversion)
inline Q512 cvt16i(Q512i v) {
#if defined(LLMK_DOT_SIMDE)
  alignas(64) std::int32_t i[16];
  LLMK_Q5(store_si512)(i, v);
  alignas(64) float f[16];
  for (int l = 0; l < 16; ++l) f[l] = static_cast<float>(i[l]);
  return LLMK_Q5(load_ps)(f);
#else
  return _mm512_cvtepi32_ps(v);
#endif
}

// pairs pp .. pp + P - 1 of the pack (rows r0 + 2 pp ..., nr rows in the block) against tokens
// t0 .. t0 + M - 1: vnni_tile's arithmetic, two rows per vector
template <int P, int M>
inline void vnni_tile512(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                         std::size_t nr, std::size_t pp, std::size_t t0) {
  const std::size_t nch = dot::vnni_chunks(a.w.k), pstride = nch * 2 * dot::kVnniPackChunk;
  const std::uint8_t* wr = pack + pp * pstride;                    // (P, nch, 640) row pairs
  const std::uint8_t* xt = a.act.xi + t0 * nch * kVnniChunkBytes;  // (M, nch, 256) x codes
  const float* st = a.act.sx8 + t0 * nch * 8;                      // (M, nch, 8) scales
  Q512 acc[P][M];
  for (auto& row : acc)
    for (Q512& v : row) v = LLMK_Q5(setzero_ps)();
  for (std::size_t c = 0; c < nch; ++c) {
    const std::uint8_t* wc = wr + c * 2 * dot::kVnniPackChunk;
    const std::uint8_t* xc = xt + c * kVnniChunkBytes;
    Q512i s[P][M];
    for (int p = 0; p < P; ++p) {
      const Q512i off = LLMK_Q5(loadu_si512)(wc + p * pstride + 8 * 64);
      for (int t = 0; t < M; ++t) s[p][t] = off;
    }
    for (int j = 0; j < 8; ++j) {
      Q512i wv[P], xv[M];
      for (int p = 0; p < P; ++p) wv[p] = LLMK_Q5(loadu_si512)(wc + p * pstride + 64 * j);
      for (int t = 0; t < M; ++t)
        xv[t] = LLMK_Q5(broadcast_i64x4)(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(xc + t * nch * kVnniChunkBytes + 32 * j)));
      for (int p = 0; p < P; ++p)
        for (int t = 0; t < M; ++t) s[p][t] = LLMK_DPBUSD512(s[p][t], xv[t], wv[p]);
    }
    for (int p = 0; p < P; ++p) {
      const Q512 sw =
          LLMK_Q5(loadu_ps)(reinterpret_cast<const float*>(wc + p * pstride + 9 * 64));
      for (int t = 0; t < M; ++t) {
        const __m256 sx = _mm256_loadu_ps(st + t * nch * 8 + c * 8);
        const Q512 d = LLMK_Q5(mul_ps)(sw, LLMK_Q5(broadcast_f32x8)(sx));
        acc[p][t] = LLMK_Q5(fmadd_ps)(cvt16i(s[p][t]), d, acc[p][t]);
      }
    }
  }
  for (int p = 0; p < P; ++p)
    for (int t = 0; t < M; ++t) {
      alignas(64) float f[16];
      LLMK_Q5(store_ps)(f, acc[p][t]);
      const std::size_t row = 2 * (pp + p);  // (in the block)
      qstore(a, r0 + row, t0 + t, qhsum(_mm256_load_ps(f)));
      if (row + 1 < nr) qstore(a, r0 + row + 1, t0 + t, qhsum(_mm256_load_ps(f + 8)));
    }
}

constexpr int kVnni512P = 4, kVnni512M = 3;  // pairs x tokens: 2 x 12 accumulators + 7 operands

template <int M>
inline void vnni_tokens512(const qgemv_args& a, const std::uint8_t* pack, std::size_t r0,
                           std::size_t nr, std::size_t t0, NextPrefetch& pf) {
  const std::size_t pairs = (nr + 1) / 2;
  std::size_t p = 0;
  for (; p + kVnni512P <= pairs; p += kVnni512P, pf())
    vnni_tile512<kVnni512P, M>(a, pack, r0, nr, p, t0);
  for (; p < pairs; ++p, pf()) vnni_tile512<1, M>(a, pack, r0, nr, p, t0);
}

template <int Bits>
inline void vnni_gemm512(const qgemv_args& a, std::uint8_t* pack) {
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kVnniRowBlock) {
    const std::size_t nr = std::min(a.w.rows - r0, kVnniRowBlock);
    vnni_pack<Bits, true>(a.w, r0, nr, pack);
    const bool last = r0 + kVnniRowBlock >= a.w.rows;  // (as vnni_gemm)
    const std::size_t pairs = (nr + 1) / 2;
    NextPrefetch pf(a, last ? (a.m + kVnni512M - 1) / kVnni512M *
                                  ((pairs + kVnni512P - 1) / kVnni512P)
                            : 0);
    std::size_t t = 0;
    for (; t + kVnni512M <= a.m; t += kVnni512M)
      vnni_tokens512<kVnni512M>(a, pack, r0, nr, t, pf);
    if (a.m - t == 1) vnni_tokens512<1>(a, pack, r0, nr, t, pf);
    if (a.m - t == 2) vnni_tokens512<2>(a, pack, r0, nr, t, pf);
  }
}

// as qgemm_int8_acts (the same pack size: 64 rows are 32 pairs)
inline void qgemm_int8_acts512(const qgemv_args& a, int bits, std::uint8_t* pack) {
  if (bits == 8)
    vnni_gemm512<8>(a, pack);
  else
    vnni_gemm512<4>(a, pack);
}

// ---- decode: the int8-weight GEMV with each block's sum on vpdpbusd ----
// qgemv_rows_w8_g (kernels/quant.hpp) with the integer side on VNNI, for the natural (unpacked)
// layout: per block, the codes w made unsigned (w ^ 0x80 = w + 128) and one vpdpbusd against the
// activation codes x gives sum(w * x) + 128 * sum(x) in 8 lanes, where AVX2 spent abs, sign,
// maddubs and madd; block_sums8 joins the 8 blocks of a chunk as there, and the 128 * sum(x) of
// each block (qacts::xs128, formed once per call: shared by every row) comes off once per chunk.
// The sums are exact integers, so the float side -- the same conversion, d = s_w * s_x, FMA
// into lane l and qhsum -- gives the AVX2 kernel's result bit for bit. The weight codes may be
// any int8 (-128: w + 128 = 0, the correction restores -128 * x). Rows as qgemv_tokens reads
// them (2 stripes of 2 rows, software prefetch per a.prefetch).
template <int R, int M, bool Group32>
inline void vnni_gemv_rows_w8(const qgemv_args& a, std::size_t r0, std::size_t rs) {
  const std::size_t k = a.w.k, row_bytes = k;
  const std::size_t nch = dot::vnni_chunks(k);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), zero = _mm256_setzero_si256();
  __m256 acc[R][M] = {};  // (zero)
  const std::uint8_t* w0 = a.w.q + r0 * row_bytes;
  for_each_chunk<R, M, Group32>(a, r0, rs, [&](std::size_t b0, std::size_t n,
                                                const __m256 (&sw)[R], const __m256 (&sxv)[M])
                                    LLMK_ALWAYS_INLINE {
    const std::size_t c = b0 / 8;
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* wp = w0 + r * rs * row_bytes + b0 * kQBlock;
      if (a.prefetch)
        for (int l = 0; l < 4; ++l) prefetch_ahead(wp + 64 * l, a.prefetch);
      __m256i wu[8];  // the chunk's codes + 128 (0 past the last block: no products)
      for (std::size_t l = 0; l < 8; ++l)
        wu[l] = l < n ? _mm256_xor_si256(_mm256_loadu_si256(
                                             reinterpret_cast<const __m256i*>(wp + l * kQBlock)),
                                         flip)
                      : zero;
      for (int t = 0; t < M; ++t) {
        const std::int8_t* xp = a.act.q + t * k + b0 * kQBlock;
        __m256i p[8];
        for (std::size_t l = 0; l < 8; ++l)
          p[l] = l < n ? LLMK_DPBUSD256(zero, wu[l],
                                        _mm256_loadu_si256(
                                            reinterpret_cast<const __m256i*>(xp + l * kQBlock)))
                       : zero;
        const __m256i sums = _mm256_sub_epi32(
            block_sums8(p),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.act.xs128 + (t * nch + c) * 8)));
        const __m256 d = _mm256_mul_ps(sw[r], sxv[t]);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), d, acc[r][t]);
      }
    }
  });
  qstore_all(a, r0, rs, acc);
}

template <int R, int M>
inline void vnni_gemv_rows(const qgemv_args& a, std::size_t r0, std::size_t rs) {
  if (a.w.group == kQBlock)
    vnni_gemv_rows_w8<R, M, true>(a, r0, rs);
  else
    vnni_gemv_rows_w8<R, M, false>(a, r0, rs);
}

// every row against M tokens: qgemv_tokens' int8 order (2 stripes, 2 rows of each per step)
template <int M>
inline void vnni_gemv_tokens(const qgemv_args& a) {
  const std::size_t part = a.w.rows / 2;
  std::size_t r = 0;
  for (; r + 2 <= part; r += 2) {
    vnni_gemv_rows<2, M>(a, r, part);
    vnni_gemv_rows<2, M>(a, r + 1, part);
  }
  for (; r < part; ++r) vnni_gemv_rows<2, M>(a, r, part);
  for (r = 2 * part; r < a.w.rows; ++r) vnni_gemv_rows<1, M>(a, r, 1);
}

// the int8-weight GEMV entry: tokens in passes of 4, as qgemv_run
inline void qgemv_int8_vnni(const qgemv_args& args) {
  constexpr std::size_t P = 4;
  qgemv_args a = args;
  const std::size_t nb = a.w.k / kQBlock, nch = dot::vnni_chunks(a.w.k);
  for (std::size_t t = 0; t < args.m; t += P) {
    a.y = args.y + t * args.ldy;
    a.act.q = args.act.q + t * a.w.k;
    a.act.s = args.act.s + t * nb;
    a.act.xs128 = args.act.xs128 + t * nch * 8;
    switch (std::min(P, args.m - t)) {
      case 1:
        vnni_gemv_tokens<1>(a);
        break;
      case 2:
        vnni_gemv_tokens<2>(a);
        break;
      case 3:
        vnni_gemv_tokens<3>(a);
        break;
      default:
        vnni_gemv_tokens<4>(a);
        break;
    }
  }
}

// ---- decode: the int4-weight GEMV with the integer side on vpdpbusd ----
// qgemv_rows_int4_pairs_g (kernels/quant.hpp) as it is -- the same stripes, chunks, hadds and
// float side -- with each pair's maddubs + add + madd replaced by two vpdpbusd: the nibbles
// (code + 8) are already unsigned, so vpdpbusd gives the same exact int32 sums of 4 products.
// Bit for bit the AVX2 kernel.
struct VnniDot {
  static __m256i dot2(__m256i lo, __m256i xlo, __m256i hi, __m256i xhi) {
    return LLMK_DPBUSD256(LLMK_DPBUSD256(_mm256_setzero_si256(), lo, xlo), hi, xhi);
  }
  static __m256i dot1(__m256i u, __m256i x) {
    return LLMK_DPBUSD256(_mm256_setzero_si256(), u, x);
  }
};

inline void qgemv_int4_vnni(const qgemv_args& a) { qgemv_run<4, true, VnniDot>(a); }

// 16 float16 scales at p -> float32 (exact, as half_to_float; SIMDe has no 512-bit vcvtph2ps)
inline Q512 widen16h(const std::uint16_t* p) {
#if defined(LLMK_DOT_SIMDE)
  alignas(64) float f[16];
  for (int l = 0; l < 16; ++l) f[l] = half_to_float(p[l]);
  return LLMK_Q5(load_ps)(f);
#else
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#endif
}

// ---- AMX (kernels/amx.hpp): the same sums, 16 tokens x 16 rows x one block per tdpbssd ----
// Per block of kVnniRowBlock rows, per 32 tokens and per 32 rows (2 x 2 C tiles), two phases:
//  1. the exact integer dot product of every block: per block four tdpbssd (signed x signed:
//     no offset) of two A tiles -- 16 tokens' 32 codes of the block each, laid out once per
//     call by the driver as 512 contiguous bytes (act.xi: [16-token tile][block][16][32], the
//     tokens past m zero) -- by two B tiles -- 16 rows' codes of the block in 8 quadruple rows,
//     repacked here -- into four C tiles, stored to a buffer (4 tiles x 16 tokens x blocks x
//     16 int32, in L2);
//  2. per (token, row) the GEMV's float arithmetic in 16-row vectors: block b's sum converted,
//     times d = s_w * s_x, FMA'd into lane b % 8 of 8 accumulators, which are summed in
//     qhsum's order -- so the result is the AVX2 GEMV's, bit for bit.
// Per tdpbssd one 512-byte tile load and one 1 KiB tile store: a block's sums cannot share a
// C tile with the next block's (each is scaled on its own), which leaves the kernel bound by
// the tile traffic and phase 2, far from tdpbssd's peak. A call of up to 16 tokens (a batched
// decode step) computes and stores only the first token tile's C tiles: then the repack of the
// weights is most of its time, and it costs about the same for 1 token as for 16.
// The pack (dot::amx_int8_pack_bytes(k)): codes [group of 16 rows][block][8 quadruple rows][16
// rows x 4] for 4 groups (rows past the block's end 0), the rows' float scales [group][block]
// [16], and the C buffer. Tiles (amx::kInt8Tiles): 0-3 C, 4-5 A (16 x 32 bytes), 6-7 B (8 x 64).
// wide: nr * k / group floats of scratch (the C buffer, which the tiles fill after the pack).
template <int Bits>
inline void amx_pack(const qweights& w, std::size_t nr, std::uint8_t* pack, float* wide) {
  const std::size_t k = w.k, nb = k / kQBlock, ng = k / w.group;
  // blocks per group 1 << gsh (groups of 32, 64, 128): a shift, where a division by the
  // runtime group size was 3% of an int8 prefill
  const unsigned gsh = w.group == 128 ? 2 : w.group == 64 ? 1 : 0;
  const std::size_t row_bytes = k * Bits / 8;
  auto* scales = reinterpret_cast<float*>(pack + dot::kVnniRowBlock * k);
  if (w.tiles) {  // stored in the tile layout: the scales widened per block, nothing else
    for (std::size_t g = 0; 16 * g < nr; ++g)
      for (std::size_t b = 0; b < nb; ++b)
        LLMK_Q5(storeu_ps)(scales + (g * nb + b) * 16,
                           widen16h(w.scales + (16 * g * ng + (b >> gsh) * 16)));
    return;
  }
  const __m256i zero = _mm256_setzero_si256();
  // the rows' float16 scales widened first, 8 at a time by F16C (exact, as half_to_float),
  // wide[row][group]: one scalar conversion per (row, block) was a fifth of a 17-token call
  for (std::size_t r = 0; r < nr; ++r) {
    const std::uint16_t* src = w.scales + r * ng;
    float* dst = wide + r * ng;
    std::size_t j = 0;
    for (; j + 8 <= ng; j += 8)
      _mm256_storeu_ps(dst + j,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + j))));
    for (; j < ng; ++j) dst[j] = half_to_float(src[j]);
  }
  for (std::size_t g = 0; g < dot::kVnniRowBlock / 16; ++g)
    for (std::size_t b = 0; b < nb; ++b) {
      std::uint8_t* dst = pack + (g * nb + b) * 512;
      float* sd = scales + (g * nb + b) * 16;
      for (std::size_t h = 0; h < 2; ++h) {  // rows 16g + 8h ... + 7
        __m256i v[8], out[8];
        for (std::size_t l = 0; l < 8; ++l) {
          const std::size_t r = 16 * g + 8 * h + l;
          v[l] = r < nr ? qblock_avx2<Bits>(w.q + r * row_bytes, b) : zero;
          sd[8 * h + l] = r < nr ? wide[r * ng + (b >> gsh)] : 0.f;
          // each row's codes 256 bytes ahead, once per 64-byte line: the pack walks 16 rows
          // at once and waited on their loads (two threads' packs, 16 rows each, leave the
          // hardware prefetchers behind). Intel Xeon with AMX, a layer's projections of the
          // 1.1B shape at 9-32 tokens, time without / with: int8 1.02-1.09 at one thread,
          // 1.22-1.37 at two; int4 1.05-1.07, 0.98-1.35 (512 tokens: within the noise)
          if (((b * 4 * Bits) & 63) == 0)
            __builtin_prefetch(w.q + r * row_bytes + b * 4 * Bits + 256);
        }
        transpose8x32(v, out);  // out[j] lane l = codes 4j .. 4j + 3 of row l
        for (int j = 0; j < 8; ++j)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 64 * j + 32 * h), out[j]);
      }
    }
}

// 16 int32 at p -> float32 (cvt16i)
inline Q512 cvt16(const std::int32_t* p) { return cvt16i(LLMK_Q5(loadu_si512)(p)); }

// y of token t, the nf valid rows of 16 from r0, = sum (lane f: row r0 + f), stored as qstore does
inline void rows_store(const qgemv_args& a, Q512 sum, std::size_t r0, std::size_t nf,
                       std::size_t t) {
  if (nf == 16) {  // qstore on 16 rows at once (a scalar loop here became a memcpy per token)
    float* dst = a.y + t * a.ldy + r0;
    Q512 v = a.accumulate ? LLMK_Q5(add_ps)(LLMK_Q5(loadu_ps)(dst), sum) : sum;
    if (a.bias) v = LLMK_Q5(add_ps)(v, LLMK_Q5(loadu_ps)(a.bias + r0));
    LLMK_Q5(storeu_ps)(dst, v);
    return;
  }
  alignas(64) float sf[16];
  LLMK_Q5(storeu_ps)(sf, sum);
  for (std::size_t f = 0; f < nf; ++f) qstore(a, r0 + f, t, sf[f]);
}

// phase 2 for one token and 16 rows: c = that token's sums of the 16 rows, block b at c + 16 b
// (consecutive: one stream), sw the 16 rows' scales (block b at sw + 16 b), sx the token's
// scales; y of the nf valid rows from r0 stored as qstore does
inline void amx_rows_out(const qgemv_args& a, const std::int32_t* c, const float* sw,
                         const float* sx, std::size_t nb, std::size_t r0, std::size_t nf,
                         std::size_t t) {
  Q512 acc[8];
  for (Q512& v : acc) v = LLMK_Q5(setzero_ps)();
  auto step = [&](std::size_t b, Q512& lane) {  // block b into its lane
    const Q512 d = LLMK_Q5(mul_ps)(LLMK_Q5(loadu_ps)(sw + 16 * b), LLMK_Q5(set1_ps)(sx[b]));
    lane = LLMK_Q5(fmadd_ps)(cvt16(c + 16 * b), d, lane);
  };
  std::size_t b = 0;
  for (; b + 8 <= nb; b += 8) {  // whole chunks: the lanes stay in registers
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) step(b + l, acc[l]);
  }
  for (int l = 0; b < nb; ++b, ++l) step(b, acc[l]);
  // qhsum's order: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
  const Q512 e =
      LLMK_Q5(add_ps)(LLMK_Q5(add_ps)(acc[0], acc[4]), LLMK_Q5(add_ps)(acc[2], acc[6]));
  const Q512 o =
      LLMK_Q5(add_ps)(LLMK_Q5(add_ps)(acc[1], acc[5]), LLMK_Q5(add_ps)(acc[3], acc[7]));
  rows_store(a, LLMK_Q5(add_ps)(e, o), r0, nf, t);
}

// The GEMV of a few tokens on weights stored in the tile layout (a.w.tiles), where a tile's
// products are mostly wasted: a B tile's 64 bytes of one quadruple row are 4 codes of each of
// 16 rows, so one 512-bit vpdpbusd against a token's 4 codes (broadcast) adds 4 products to
// each of the 16 rows' lanes, and 8 of them leave the block's 16 sums in place -- no C tile to
// store and load back. vpdpbusd multiplies unsigned by signed bytes: the weights go in as
// w + 128 (w ^ 0x80) and each block's 128 * sum(x) (act.xs128) comes off. Then amx_rows_out's
// float arithmetic on the same sums: the AVX2 GEMV's results, bit for bit.
// S groups of 16 rows at once (gs), tokens t0 .. t0 + M - 1 of act.xi's tiles: each group's
// arithmetic is the same whichever groups share the pass.
template <int M, int S>
inline void tiled_groups(const qgemv_args& a, std::size_t t0, const std::size_t (&gs)[S]) {
  const std::size_t k = a.w.k, nb = k / kQBlock, ng = k / a.w.group, nch = dot::vnni_chunks(k);
  const unsigned gsh = a.w.group == 128 ? 2 : a.w.group == 64 ? 1 : 0;
  const Q512i flip = LLMK_Q5(set1_epi8)(static_cast<char>(0x80));
  const std::uint8_t* xc[M];  // token t0 + t's codes: block b at xc[t] + 512 b
  const float* sx[M];         // its scales, block b at sx[t][b]
  const std::int32_t* xs[M];  // 128 * its block sums
  for (int t = 0; t < M; ++t) {
    const std::size_t tok = t0 + t;
    xc[t] = a.act.xi + (tok / 16) * nb * 512 + (tok % 16) * kQBlock;
    sx[t] = a.act.sx8 + tok * nch * 8;
    xs[t] = a.act.xs128 + tok * nch * 8;
  }
  const std::uint8_t* wq[S];   // group gs[s]: [block][8][16 rows x 4]
  const std::uint16_t* ws[S];  // [scale group][16 rows]
  for (int s = 0; s < S; ++s) {
    wq[s] = a.w.q + gs[s] * 16 * k;
    ws[s] = a.w.scales + gs[s] * 16 * ng;
  }
  Q512 acc[S][M][8];
  for (auto& grp : acc)
    for (auto& row : grp)
      for (Q512& v : row) v = LLMK_Q5(setzero_ps)();
  auto step = [&](std::size_t b, int l) LLMK_ALWAYS_INLINE {
    for (int s = 0; s < S; ++s) {
      const std::uint8_t* wb = wq[s] + b * 512;
      Q512i sum[M];
      for (int t = 0; t < M; ++t) sum[t] = LLMK_Q5(setzero_si512)();
      for (int j = 0; j < 8; ++j) {
        const Q512i w = LLMK_Q5(xor_si512)(LLMK_Q5(loadu_si512)(wb + 64 * j), flip);
        for (int t = 0; t < M; ++t) {
          std::int32_t quad;
          std::memcpy(&quad, xc[t] + 512 * b + 4 * j, 4);
          sum[t] = LLMK_DPBUSD512(sum[t], w, LLMK_Q5(set1_epi32)(quad));
        }
      }
      const Q512 sw = widen16h(ws[s] + (b >> gsh) * 16);
      for (int t = 0; t < M; ++t) {
        const Q512i d_int = LLMK_Q5(sub_epi32)(sum[t], LLMK_Q5(set1_epi32)(xs[t][b]));
        const Q512 d = LLMK_Q5(mul_ps)(sw, LLMK_Q5(set1_ps)(sx[t][b]));
        acc[s][t][l] = LLMK_Q5(fmadd_ps)(cvt16i(d_int), d, acc[s][t][l]);
      }
    }
  };
  std::size_t b = 0;
  for (; b + 8 <= nb; b += 8) {
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) step(b + l, l);
  }
  for (int l = 0; b < nb; ++b, ++l) step(b, l);
  for (int s = 0; s < S; ++s)
    for (int t = 0; t < M; ++t) {  // qhsum's order, as amx_rows_out
      const Q512 e = LLMK_Q5(add_ps)(LLMK_Q5(add_ps)(acc[s][t][0], acc[s][t][4]),
                                     LLMK_Q5(add_ps)(acc[s][t][2], acc[s][t][6]));
      const Q512 o = LLMK_Q5(add_ps)(LLMK_Q5(add_ps)(acc[s][t][1], acc[s][t][5]),
                                     LLMK_Q5(add_ps)(acc[s][t][3], acc[s][t][7]));
      rows_store(a, LLMK_Q5(add_ps)(e, o), 16 * gs[s], 16, t0 + t);
    }
}

// Tokens t0 .. t0 + M - 1, every row of a (a.w.rows % 16 == 0): groups g and g + groups / 2
// together, two streams of weights a thread (then a last odd group alone). One stream left the
// GEMV short of the read bandwidth: Intel Xeon with AMX, the 8 MLPs below, ms at 1 / 2
// threads, one / two groups a pass, two interleaved runs: 1 token 21.0-22.1 / 11.0-11.5 against
// 20.1-20.7 / 10.3-10.4, 2 tokens 23.5-24.1 /
// 12.4-13.0 against 21.8-22.9 / 11.1-11.8; three or four groups a pass no faster than two.
template <int M>
inline void tiled_gemv(const qgemv_args& a, std::size_t t0) {
  const std::size_t groups = a.w.rows / 16, half = groups / 2;
  for (std::size_t g = 0; g < half; ++g) tiled_groups<M, 2>(a, t0, {g, g + half});
  if (groups % 2) tiled_groups<M, 1>(a, t0, {groups - 1});
}

// Up to kTiledGemvTokens tokens on tiled weights: tiled_gemv, 2 tokens a pass. Above, the tile
// kernel. Intel Xeon with AMX, 8 SwiGLU MLPs of the 1.1B shape (2048 -> 5632 -> 2048, 277 MB
// of int8 codes, partly in that VM's 480 MiB L3), medians of 5, ms at 1 / 2 threads, tiled
// GEMV / tiles: m = 1 22.0 / 12.1 vs 32.5 / 16.6 (the plain-layout GEMV 21.7 / 11.7), m = 2
// 22.0 / 13.0 vs 33.0 / 17.0, m = 3 29.5 / 16.0 vs 29.8 / 15.9, m = 4 31.1 / 16.9 vs 30.7 /
// 16.9, m = 6 36.9 / 18.9 vs 31.7 / 18.0, m = 8 42.1 / 21.6 vs 34.0 / 19.2 (the GEMV then read
// one group a pass). No software prefetch: the hardware prefetchers follow the streams (0-8 KiB
// ahead measured alike, with one stream a thread and with two).
constexpr std::size_t kTiledGemvTokens = 3;
inline void tiled_gemv_all(const qgemv_args& a) {
  std::size_t t = 0;
  for (; t + 2 <= a.m; t += 2) tiled_gemv<2>(a, t);
  if (t < a.m) tiled_gemv<1>(a, t);
}

template <int Bits>
inline void amx_gemm(const qgemv_args& a, std::uint8_t* pack) {
  if (Bits == 8 && a.w.tiles && a.m <= kTiledGemvTokens) {
    tiled_gemv_all(a);
    return;
  }
  const std::size_t k = a.w.k, nb = k / kQBlock, nch = dot::vnni_chunks(k);
  const auto* sw = reinterpret_cast<const float*>(pack + dot::kVnniRowBlock * k);
  // the C sums: per C tile, per token, the blocks one after the other (ldc int32 a token: one
  // 64-byte line more than the blocks, so the 16 rows of a tile store fall in different sets)
  auto* cbuf = reinterpret_cast<std::int32_t*>(pack + dot::kVnniRowBlock * k + 256 * nb);
  const std::size_t ldc = 16 * nb + 16;
  const std::uint8_t* xa = a.act.xi;  // [16-token tile][block][16][32]
  const amx::Session session(amx::kInt8Tiles);
  for (std::size_t r0 = 0; r0 < a.w.rows; r0 += kVnniRowBlock) {
    const std::size_t nr = std::min(a.w.rows - r0, kVnniRowBlock);
    qweights w = a.w;
    w.q += r0 * (k * Bits / 8);
    w.scales += r0 * (k / w.group);
    amx_pack<Bits>(w, nr, pack, reinterpret_cast<float*>(cbuf));
    // the B tiles: the pack's, or the weights' own (stored in the tile layout: w.tiles)
    const std::uint8_t* codes = w.tiles ? w.q : pack;
    for (std::size_t t0 = 0; t0 < a.m; t0 += 32) {  // the tiles of tokens past m are zero
      const std::uint8_t* a0 = xa + (t0 / 16) * nb * 512;
      const std::uint8_t* a1 = a0 + nb * 512;
      // the second 16 tokens all past m (a call of up to 16 tokens: batched decode): their
      // tile is zero, so its products and C stores -- half of the tile work -- are skipped
      const bool both = t0 + 16 < a.m;
      for (std::size_t g = 0; 16 * g < nr; g += 2) {  // rows 16g ... 16g + 31
        // y of these 32 tokens x 32 rows, fetched while the tiles run: its lines lie a row of y
        // apart (beyond the hardware prefetchers' reach), and the projections that add into
        // the residual stream read them -- their misses were a tenth of an int8 prefill
        for (std::size_t t = t0; t < std::min(t0 + 32, a.m); ++t)
          for (std::size_t j = 0; j < 2 && 16 * (g + j) < nr; ++j) {
            const float* p = a.y + t * a.ldy + r0 + 16 * (g + j);
            __builtin_prefetch(p, 1, 3);
            __builtin_prefetch(p + 15, 1, 3);  // (y need not be 64-byte aligned)
          }
        const std::uint8_t* b0 = codes + g * nb * 512;
        const std::uint8_t* b1 = b0 + nb * 512;
        // a lone last group of 16 rows: stored tiles end there (the pack's are zero past nr)
        const bool pair = 16 * (g + 1) < nr;
        for (std::size_t b = 0; b < nb; ++b) {
          std::int32_t* c = cbuf + 16 * b;  // tile q = 2 * token half + row half
          LLMK_TILE_ZERO(0);
          if (pair) LLMK_TILE_ZERO(1);
          LLMK_TILE_LOAD(4, a0 + 512 * b, 32);
          LLMK_TILE_LOAD(6, b0 + 512 * b, 64);
          LLMK_TILE_DPBSSD(0, 4, 6);
          if (pair) {
            LLMK_TILE_LOAD(7, b1 + 512 * b, 64);
            LLMK_TILE_DPBSSD(1, 4, 7);
          }
          LLMK_TILE_STORE(0, c, ldc * 4);
          if (pair) LLMK_TILE_STORE(1, c + 16 * ldc, ldc * 4);
          if (!both) continue;
          LLMK_TILE_ZERO(2);
          if (pair) LLMK_TILE_ZERO(3);
          LLMK_TILE_LOAD(5, a1 + 512 * b, 32);
          LLMK_TILE_DPBSSD(2, 5, 6);
          if (pair) LLMK_TILE_DPBSSD(3, 5, 7);
          LLMK_TILE_STORE(2, c + 32 * ldc, ldc * 4);
          if (pair) LLMK_TILE_STORE(3, c + 48 * ldc, ldc * 4);
        }
        for (std::size_t i = 0; i < 2; ++i)
          for (std::size_t t = 0; t < 16 && t0 + 16 * i + t < a.m; ++t) {
            const std::size_t tok = t0 + 16 * i + t;
            const float* sx = a.act.sx8 + tok * nch * 8;
            for (std::size_t j = 0; j < 2 && 16 * (g + j) < nr; ++j)
              amx_rows_out(a, cbuf + (16 * (2 * i + j) + t) * ldc, sw + (g + j) * nb * 16, sx, nb,
                           r0 + 16 * (g + j), std::min<std::size_t>(16, nr - 16 * (g + j)),
                           tok);
          }
      }
    }
  }
}

// the AMX entry point: as qgemm_int8_acts, pack of dot::amx_int8_pack_bytes(k) bytes
inline void qgemm_int8_acts_amx(const qgemv_args& a, int bits, std::uint8_t* pack) {
  if (bits == 8)
    amx_gemm<8>(a, pack);
  else
    amx_gemm<4>(a, pack);
}

#endif  // !LLMK_DOT_MADDUBS

}  // namespace
}  // namespace LLMK_DOT_NS

// this build's entries, called by common/dot.cpp's dispatch (namespace LLMK_DOT_ENTRY)
namespace dot::LLMK_DOT_ENTRY {
void qgemm(const qgemv_args& a, int bits, std::uint8_t* pack) {
  LLMK_DOT_NS::qgemm_int8_acts(a, bits, pack);
}
#if !defined(LLMK_DOT_MADDUBS)
void qgemm_amx(const qgemv_args& a, int bits, std::uint8_t* pack) {
  LLMK_DOT_NS::qgemm_int8_acts_amx(a, bits, pack);
}
void qgemm512(const qgemv_args& a, int bits, std::uint8_t* pack) {
  LLMK_DOT_NS::qgemm_int8_acts512(a, bits, pack);
}
void gemv(const qgemv_args& a) { LLMK_DOT_NS::qgemv_int8_vnni(a); }
void gemv4(const qgemv_args& a) { LLMK_DOT_NS::qgemv_int4_vnni(a); }
#endif
}  // namespace dot::LLMK_DOT_ENTRY
}  // namespace llmk
