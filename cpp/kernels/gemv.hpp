// Matrix-vector product for decode-time projections: y = W x (+ y), W row-major (rows, k).
//
// One token's projection reads every weight once and does 2 FLOPs per 4 bytes, so it is bound
// by memory bandwidth: the loop keeps several rows' streams in flight (R rows at a time, two
// accumulators per row to cover the FMA latency) and reduces each row once at its end.
// Every row goes through the same arithmetic whether it is in an R-row block or the row tail,
// so results do not depend on how rows are split across threads.
#pragma once

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// y[r] (+)= dot(w[r * k : (r + 1) * k], x) for r < R
template <class Arch, class T, int R>
inline void gemv_rows(T* y, const T* w, const T* x, std::size_t k, bool accumulate) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size;
  V a0[R], a1[R];
  for (int r = 0; r < R; ++r) a0[r] = a1[r] = V(T(0));
  std::size_t i = 0;
  for (; i + 2 * N <= k; i += 2 * N) {
    const V x0 = V::load_unaligned(x + i), x1 = V::load_unaligned(x + i + N);
    for (int r = 0; r < R; ++r) {
      a0[r] = xsimd::fma(V::load_unaligned(w + r * k + i), x0, a0[r]);
      a1[r] = xsimd::fma(V::load_unaligned(w + r * k + i + N), x1, a1[r]);
    }
  }
  if (i + N <= k) {
    const V x0 = V::load_unaligned(x + i);
    for (int r = 0; r < R; ++r) a0[r] = xsimd::fma(V::load_unaligned(w + r * k + i), x0, a0[r]);
    i += N;
  }
  for (int r = 0; r < R; ++r) {
    T sum = xsimd::hadd(a0[r] + a1[r]);
    for (std::size_t t = i; t < k; ++t) sum += w[r * k + t] * x[t];  // scalar tail
    y[r] = accumulate ? y[r] + sum : sum;
  }
}

}  // namespace

template <class Arch, class T>
void gemv_kernel::operator()(Arch, T* y, const T* w, const T* x, std::size_t rows, std::size_t k,
                             bool accumulate) const {
  constexpr int R = 4;
  std::size_t r = 0;
  for (; r + R <= rows; r += R) gemv_rows<Arch, T, R>(y + r, w + r * k, x, k, accumulate);
  for (; r < rows; ++r) gemv_rows<Arch, T, 1>(y + r, w + r * k, x, k, accumulate);
}

}  // namespace llmk
