// Matrix-vector products for decode-time projections: y[t] = W x[t] (+ y[t]) for one token or
// a few (a batch of decode steps), W row-major (rows, k).
//
// A token's projection reads every weight once and does 2 FLOPs per 4 bytes, so it is bound by
// memory bandwidth. The loop keeps several rows' streams in flight (R rows at a time), applies
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

// y[t * ldy + r] (+)= dot(w[r * k : (r + 1) * k], x[t * ldx : t * ldx + k]) (+ bias[r])
// for r < R, t < M; bias (R,) or null, added in the final store (no second pass over y)
template <class Arch, class T, int R, int M>
inline void gemv_rows(T* y, std::size_t ldy, const T* w, const T* x, std::size_t ldx, std::size_t k,
                      bool accumulate, const T* bias) {
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
        const V wv = V::load_unaligned(w + r * k + i + a * N);
        for (int t = 0; t < M; ++t) acc[a][r][t] = xsimd::fma(wv, xv[t], acc[a][r][t]);
      }
    }
  }
  if (A > 1 && i + N <= k) {  // one more full vector
    V xv[M];
    for (int t = 0; t < M; ++t) xv[t] = V::load_unaligned(x + t * ldx + i);
    for (int r = 0; r < R; ++r) {
      const V wv = V::load_unaligned(w + r * k + i);
      for (int t = 0; t < M; ++t) acc[0][r][t] = xsimd::fma(wv, xv[t], acc[0][r][t]);
    }
    i += N;
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < M; ++t) {
      V v = acc[0][r][t];
      for (int a = 1; a < A; ++a) v += acc[a][r][t];
      T sum = xsimd::hadd(v);
      for (std::size_t j = i; j < k; ++j) sum += w[r * k + j] * x[t * ldx + j];  // scalar tail
      T& dst = y[t * ldy + r];
      dst = accumulate ? dst + sum : sum;
      if (bias) dst += bias[r];  // as a separate bias pass would round it
    }
  }
}

// Every row of w against M tokens.
template <class Arch, class T, int M>
inline void gemv_tokens(T* y, std::size_t ldy, const T* w, const T* x, std::size_t ldx,
                        std::size_t rows, std::size_t k, bool accumulate, const T* bias) {
  constexpr int R = 4;
  std::size_t r = 0;
  for (; r + R <= rows; r += R)
    gemv_rows<Arch, T, R, M>(y + r, ldy, w + r * k, x, ldx, k, accumulate, bias ? bias + r : bias);
  for (; r < rows; ++r)
    gemv_rows<Arch, T, 1, M>(y + r, ldy, w + r * k, x, ldx, k, accumulate, bias ? bias + r : bias);
}

}  // namespace

// y[t, r] (+)= dot(w[r, :], x[t, :]) (+ bias[r])   y (m, rows) row stride ldy, w (rows, k)
// row-major, x (m, k) row stride ldx, bias (rows,) or null -- decode projections (one token, or
// a few); the bias is added in the final store
template <class Arch, class T>
void gemv_kernel::operator()(Arch, T* y, std::size_t ldy, const T* w, const T* x, std::size_t ldx,
                             std::size_t m, std::size_t rows, std::size_t k, bool accumulate,
                             const T* bias) const {
  constexpr std::size_t G = 4;  // tokens per pass over the weights
  std::size_t t = 0;
  for (; t + G <= m; t += G)
    gemv_tokens<Arch, T, G>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
  switch (m - t) {
    case 1:
      gemv_tokens<Arch, T, 1>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    case 2:
      gemv_tokens<Arch, T, 2>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    case 3:
      gemv_tokens<Arch, T, 3>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    default:
      break;
  }
}

}  // namespace llmk
