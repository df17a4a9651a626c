// Matrix-vector products for decode-time projections: y[t] = W x[t] (+ y[t]) for one token or
// a few (a batch of decode steps), W row-major (rows, k).
//
// A token's projection reads every weight once and does 2 FLOPs per 4 bytes, so it is bound by
// memory bandwidth. The loop keeps several rows' streams in flight (R rows at a time; rows of
// at most 2 KiB one at a time, as one sequential stream: kGemvShortRowBytes below), applies
// each weight vector to up to 4 tokens while it is in a register (the weights are read once for
// the group), and reduces each (row, token) sum once at the end. One token uses two
// accumulators per row to cover the FMA latency; several tokens already give enough chains.
// Every row goes through the same arithmetic whether it is in an R-row block or the row tail,
// so results do not depend on how rows are split across threads.
#pragma once

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

// y[t * ldy + r] (+)= dot(w[r * k : (r + 1) * k], x[t * ldx : t * ldx + k]) (+ bias[r])
// for r < R, t < M; bias (R,) or null, added in the final store (no second pass over y);
// w read through the policy WL (PlainWeights<T> or a widening one)
// pf_rows: how many rows ahead the software prefetch reads (a multiple of R; 0: none)
template <class Arch, class T, class WL, int R, int M>
inline void gemv_rows(T* y, std::size_t ldy, const typename WL::Stored* w, const T* x,
                      std::size_t ldx, std::size_t k, bool accumulate, const T* bias,
                      std::size_t pf_rows) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size;
  constexpr int A = M == 1 ? 2 : 1;  // accumulators per (row, token)
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
        const V wv = WL::load(Arch{}, w + r * k + i + a * N);
        for (int t = 0; t < M; ++t) acc[a][r][t] = xsimd::fma(wv, xv[t], acc[a][r][t]);
      }
    }
    // the same columns of R rows pf_rows ahead (a later block's, consecutive in memory), once
    // per 64 bytes: the R row streams become one sequential stream running kGemvPrefetchBytes
    // ahead. Rows of a few KiB end before the hardware prefetchers, which track each row as a
    // stream, have ramped up. (Rows of at most kGemvShortRowBytes skip this: one row at a time
    // reads faster still, see gemv_tokens.)
    if (pf_rows && (i * sizeof(typename WL::Stored)) % 64 == 0)
      for (int r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (pf_rows + r) * k + i), _MM_HINT_T0);
  }
  if (A > 1 && i + N <= k) {  // one more full vector
    V xv[M];
    for (int t = 0; t < M; ++t) xv[t] = V::load_unaligned(x + t * ldx + i);
    for (int r = 0; r < R; ++r) {
      const V wv = WL::load(Arch{}, w + r * k + i);
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
      for (std::size_t j = i; j < k; ++j) widened[j - i] = WL::scalar(w[r * k + j]);
    else
      wt = w + r * k + i;
    for (int t = 0; t < M; ++t) {
      V v = acc[0][r][t];
      for (int a = 1; a < A; ++a) v += acc[a][r][t];
      T sum = xsimd::hadd(v);
      for (std::size_t j = i; j < k; ++j) sum += wt[j - i] * x[t * ldx + j];  // scalar tail
      T& dst = y[t * ldy + r];
      dst = accumulate ? dst + sum : sum;
      if (bias) dst += bias[r];  // as a separate bias pass would round it
    }
  }
}

// Rows of at most this many bytes are taken one at a time, without software prefetch: the
// matrix is then read as one sequential stream, which the hardware prefetcher follows at the
// full read bandwidth, where R rows in lockstep are R streams of a few cache lines each -- too
// short for it to ramp up, and the prefetch of the next block's rows does not make that up.
// float32 GEMV, DRAM-resident, 1 thread, AVX2 EPYC (a standalone loop of this body): rows of
// 1-2 KiB (k = 256-512) 10-12 GB/s in blocks of 4 rows against 14-16 one row at a time (a plain
// read 15-17); from 4 KiB (k = 1024) blocks of 4 rows are level or ahead (k = 2048: 16.0 against
// 12-14). A row's arithmetic does not depend on R (the same accumulators, the same order), so
// neither do the results.
constexpr std::size_t kGemvShortRowBytes = 2048;

// The software prefetch of an R-row block runs at least this many bytes ahead (a whole number
// of blocks, at least one). One block ahead was 16 KiB for 4 KiB rows (float32 k = 1024, 16-bit
// k = 2048: TinyLlama's q/k/v/o/gate/up in bf16) and read 16-17 GB/s where 2-4 blocks (32-64
// KiB) read 18-19.5; for 8 KiB rows and up one block is already 32 KiB and further changes
// nothing (float32 GEMV, DRAM-resident, 1 thread, AVX2 EPYC, a standalone loop of this body).
constexpr std::size_t kGemvPrefetchBytes = 32768;

// Every row of w against M tokens.
template <class Arch, class T, class WL, int M>
inline void gemv_tokens(T* y, std::size_t ldy, const typename WL::Stored* w, const T* x,
                        std::size_t ldx, std::size_t rows, std::size_t k, bool accumulate,
                        const T* bias) {
  if (k * sizeof(typename WL::Stored) <= kGemvShortRowBytes) {
    for (std::size_t r = 0; r < rows; ++r)
      gemv_rows<Arch, T, WL, 1, M>(y + r, ldy, w + r * k, x, ldx, k, accumulate,
                                   bias ? bias + r : bias, 0);
    return;
  }
  constexpr int R = 4;
  const std::size_t block_bytes = R * k * sizeof(typename WL::Stored);
  const std::size_t pf_rows = R * std::max<std::size_t>(
                                      1, (kGemvPrefetchBytes + block_bytes - 1) / block_bytes);
  std::size_t r = 0;
  for (; r + R <= rows; r += R)
    gemv_rows<Arch, T, WL, R, M>(y + r, ldy, w + r * k, x, ldx, k, accumulate,
                                 bias ? bias + r : bias, pf_rows);
  for (; r < rows; ++r)
    gemv_rows<Arch, T, WL, 1, M>(y + r, ldy, w + r * k, x, ldx, k, accumulate,
                                 bias ? bias + r : bias, 1);
}

// gemv_kernel's body for any weight storage WL (gemv_w16_kernel uses it with 16-bit weights)
template <class Arch, class T, class WL>
inline void gemv_impl(T* y, std::size_t ldy, const typename WL::Stored* w, const T* x,
                      std::size_t ldx, std::size_t m, std::size_t rows, std::size_t k,
                      bool accumulate, const T* bias) {
  constexpr std::size_t G = 4;  // tokens per pass over the weights
  std::size_t t = 0;
  for (; t + G <= m; t += G)
    gemv_tokens<Arch, T, WL, G>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
  switch (m - t) {
    case 1:
      gemv_tokens<Arch, T, WL, 1>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    case 2:
      gemv_tokens<Arch, T, WL, 2>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    case 3:
      gemv_tokens<Arch, T, WL, 3>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    default:
      break;
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
