// Matrix-vector products for decode-time projections: y[t] = W x[t] (+ y[t]) for one token or
// a few (a batch of decode steps), W row-major (rows, k).
//
// A token's projection reads every weight once and does 2 FLOPs per 4 bytes, so it is bound by
// memory bandwidth. The loop reads the matrix as 4 sequential streams (4 stripes of rows, a row
// of each at a time: gemv_tokens below), applies each weight vector to up to 4 tokens while it
// is in a register (the weights are read once for the group), and reduces each (row, token) sum
// once at the end. One token uses two accumulators per row to cover the FMA latency; several
// tokens already give enough chains. Every row goes through the same arithmetic whichever rows
// share its block, so results do not depend on how rows are split across threads.
#pragma once

#include <algorithm>

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// How a projection kernel reads its weights (a template parameter of the shared bodies below
// and of gemm.hpp's, ggml-style: one kernel body, the weight storage a policy). Stored is the
// element type in memory; load(Arch, p) gives one batch of T from N consecutive weights,
// scalar(w) one weight (the tails). Weights stored as T are loaded as they are; the 16-bit
// formats (kernels/weight16.hpp) widen to float32 in registers and set widens, which makes the
// kernels convert row tails / tiles of weights before the float arithmetic -- the arithmetic
// itself is the same operation for operation, so results are bitwise those of the T kernel on
// the widened weights.
template <class T>
struct PlainWeights {
  using Stored = T;
  static constexpr bool widens = false;
  template <class Arch>
  static vec<Arch, T> load(Arch, const T* p) {
    return vec<Arch, T>::load_unaligned(p);
  }
  static T scalar(T w) { return w; }
};

// y[t * ldy + r * rs] (+)= dot(w[r * rs * k : (r * rs + 1) * k], x[t * ldx : t * ldx + k])
// (+ bias[r * rs]) for r < R, t < M: R rows rs rows apart (rs = 1: consecutive rows; see
// gemv_tokens for the other case); bias or null, added in the final store (no second pass over
// y); w read through the policy WL (PlainWeights<T> or a widening one)
template <class Arch, class T, class WL, int R, int M, int A = M == 1 ? 2 : 1>
inline void gemv_rows(T* y, std::size_t ldy, const typename WL::Stored* w, const T* x,
                      std::size_t ldx, std::size_t k, bool accumulate, const T* bias,
                      std::size_t rs, std::size_t pf = 0) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size;
  // A: accumulators per (row, token); 2 for a token alone (m = 1), 1 otherwise -- also for the
  // last token of a call whose groups left it alone (gemv_impl), so that its arithmetic does not
  // depend on how a call's tokens are grouped
  V acc[A][R][M];
  for (int a = 0; a < A; ++a)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < M; ++t) acc[a][r][t] = V(T(0));
  std::size_t i = 0;
  for (; i + A * N <= k; i += A * N) {
    for (int a = 0; a < A; ++a) {
      V xv[M];
      for (int t = 0; t < M; ++t) xv[t] = V::load_unaligned(x + t * ldx + i + a * N);
      for (int r = 0; r < R; ++r) {
        if (pf && a == 0) __builtin_prefetch(w + r * rs * k + i + pf, 0, 3);  // (gemv_tokens)
        const V wv = WL::load(Arch{}, w + r * rs * k + i + a * N);
        for (int t = 0; t < M; ++t) acc[a][r][t] = xsimd::fma(wv, xv[t], acc[a][r][t]);
      }
    }
  }
  if (A > 1 && i + N <= k) {  // one more full vector
    V xv[M];
    for (int t = 0; t < M; ++t) xv[t] = V::load_unaligned(x + t * ldx + i);
    for (int r = 0; r < R; ++r) {
      const V wv = WL::load(Arch{}, w + r * rs * k + i);
      for (int t = 0; t < M; ++t) acc[0][r][t] = xsimd::fma(wv, xv[t], acc[0][r][t]);
    }
    i += N;
  }
  for (int r = 0; r < R; ++r) {
    // the row's tail (< A * N weights) as T: widened first when the storage is narrower, so
    // that the tail loop is one expression for every storage (the same contractions into FMAs)
    T widened[WL::widens ? 2 * N : 1];
    const T* wt = widened;
    if constexpr (WL::widens)
      for (std::size_t j = i; j < k; ++j) widened[j - i] = WL::scalar(w[r * rs * k + j]);
    else
      wt = w + r * rs * k + i;
    for (int t = 0; t < M; ++t) {
      V v = acc[0][r][t];
      for (int a = 1; a < A; ++a) v += acc[a][r][t];
      T sum = xsimd::hadd(v);
      for (std::size_t j = i; j < k; ++j) sum += wt[j - i] * x[t * ldx + j];  // scalar tail
      T& dst = y[t * ldy + r * rs];
      dst = accumulate ? dst + sum : sum;
      if (bias) dst += bias[r * rs];  // as a separate bias pass would round it
    }
  }
}

// Rows [r0, r1) of each stripe of w against M tokens (the rows left over with the block that
// passes the stripes' end), in R = 4 stripes: the rows split into 4 contiguous parts and
// row r of each part taken together (rows r, r + part, r + 2 part, r + 3 part), so the matrix
// is read as 4 sequential streams far apart. One core's DRAM reads run on the hardware
// prefetchers' streams, and 4 independent ones keep more misses in flight than one: float32
// GEMV, DRAM-resident, 1 thread, AVX2 EPYC (a standalone loop of this body): 32000 x 512
// (2 KiB rows) 16.9 GB/s as one stream of rows (one at a time) against 25.6 in 4 stripes;
// 4096 x 2048 21-24 GB/s in blocks of 4 consecutive rows with a software prefetch 32 KiB
// ahead against 27.5-31.8; 2048 x 5632 24.5 against 26.4-29.1. (Blocks of consecutive rows
// were 4 short streams a row apart, which the prefetchers drop at every 4 KiB page; a software
// prefetch made them one stream.) A row's arithmetic does not depend on which rows share its
// block (the same accumulators, the same order), so neither do the results; the rows left
// over (rows % 4) go one at a time.
// On Intel, 16-bit weights are also prefetched in software 1 KiB ahead on each stripe (a hint
// per step of A * N weights: one 64-byte line at 512 bits). Decode of a 22-layer TinyLlama shape
// in bfloat16, Intel Xeon Emerald Rapids, tokens/s at 1 / 2 threads, medians of 5 interleaved
// runs: 5.33 / 9.03 without, 6.05 / 10.77 with (512 B 6.07 / 10.69, 2 KiB 5.75 at 1 thread).
// float32 weights: no change (2.98 / 6.99 against 3.06 / 6.90 with 1-2 KiB), none is made.
template <class Arch, class T, class WL, int M, int A = M == 1 ? 2 : 1>
inline void gemv_tokens(T* y, std::size_t ldy, const typename WL::Stored* w, const T* x,
                        std::size_t ldx, std::size_t rows, std::size_t k, bool accumulate,
                        const T* bias, std::size_t r0, std::size_t r1) {
  constexpr int R = 4;
  const std::size_t part = rows / R;
  const std::size_t pf = WL::widens && cpu_is_intel() ? 1024 / sizeof(typename WL::Stored) : 0;
  for (std::size_t r = r0; r < std::min(r1, part); ++r)
    gemv_rows<Arch, T, WL, R, M, A>(y + r, ldy, w + r * k, x, ldx, k, accumulate,
                                    bias ? bias + r : bias, part, pf);
  if (r1 > part)  // the rows left over (rows % 4), with the block past the stripes' last row
    for (std::size_t r = R * part; r < rows; ++r)
      gemv_rows<Arch, T, WL, 1, M, A>(y + r, ldy, w + r * k, x, ldx, k, accumulate,
                                      bias ? bias + r : bias, 1);
}

// More than one group of tokens (gemv_impl) would read the matrix from memory once per group,
// and a group of a few tokens is already near the bandwidth: the stripes are walked in blocks
// of rows (4 stripes x kGemvBlockBytes / 4 of weights, kept in L2) and every group of tokens
// takes a block before the next is read, so the matrix is read from memory once per call. Only the
// order of the rows changes: each (row, token) is the same arithmetic, the same bits.
constexpr std::size_t kGemvBlockBytes = 128 * 1024;

// gemv_kernel's body for any weight storage WL (gemv_w16_kernel uses it with 16-bit weights)
template <class Arch, class T, class WL>
inline void gemv_impl(T* y, std::size_t ldy, const typename WL::Stored* w, const T* x,
                      std::size_t ldx, std::size_t m, std::size_t rows, std::size_t k,
                      bool accumulate, const T* bias) {
  // Groups of tokens. AVX2 / SSE2 (16 vector registers): 4 rows x 3 tokens of accumulators and
  // an operand for weights stored as T (4 x 4 spill a register: slower than groups of 3, except
  // alone, m = 4; where one token would be left alone the last group of 3 takes 2), 4 x 2 and
  // the widening's temporaries for 16-bit weights. AVX-512 (32 registers): groups of 4, then 3,
  // 2 or 1. Every (row, token) is the same arithmetic in any group (gemv_rows' A), so 16-bit
  // weights give the float32 kernel's bits on the widened weights.
  constexpr bool wide = std::is_base_of<xsimd::avx512f, Arch>::value;
  constexpr std::size_t G = wide ? 4 : WL::widens ? 2 : 3;
  const std::size_t part = rows / 4;
  const std::size_t rb = m <= G || (G == 3 && m == 4)
                             ? part + 1
                             : std::max<std::size_t>(
                                   1, kGemvBlockBytes / (4 * k * sizeof(typename WL::Stored)));
  for (std::size_t r0 = 0; r0 <= part; r0 += rb) {  // (<=: a last block of the left-over rows)
    const std::size_t r1 = r0 + rb;
    std::size_t t = 0;
    if (G == 4 || (G == 3 && m == 4))
      for (; m - t >= 4; t += 4)
        gemv_tokens<Arch, T, WL, 4>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate,
                                    bias, r0, r1);
    if (G >= 3)
      for (; m - t >= 3 && (G == 4 || m - t != 4); t += 3)
        gemv_tokens<Arch, T, WL, 3>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate,
                                    bias, r0, r1);
    for (; m - t >= 2; t += 2)
      gemv_tokens<Arch, T, WL, 2>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias,
                                  r0, r1);
    if (m == 1)
      gemv_tokens<Arch, T, WL, 1>(y, ldy, w, x, ldx, rows, k, accumulate, bias, r0, r1);
    else if (t < m)  // the last token, alone: one accumulator per row, as in a group
      gemv_tokens<Arch, T, WL, 1, 1>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate,
                                     bias, r0, r1);
  }
}

}  // namespace

// y[t, r] (+)= dot(w[r, :], x[t, :]) (+ bias[r])   y (m, rows) row stride ldy, w (rows, k)
// row-major, x (m, k) row stride ldx, bias (rows,) or null -- decode projections (one token, or
// a few); the bias is added in the final store
template <class Arch, class T>
void gemv_kernel::operator()(Arch, T* y, std::size_t ldy, const T* w, const T* x, std::size_t ldx,
                             std::size_t m, std::size_t rows, std::size_t k, bool accumulate,
                             const T* bias) const {
  gemv_impl<Arch, T, PlainWeights<T>>(y, ldy, w, x, ldx, m, rows, k, accumulate, bias);
}

}  // namespace llmk
