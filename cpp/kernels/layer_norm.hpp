// LayerNorm: out = (x - mean) / sqrt(var + eps) * weight + bias, biased variance, row by row.
#pragma once

#include <algorithm>

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// Mean and 1/sqrt(var + eps) of one row, in two SIMD passes over the (cached) row, both with
// blocked sums (accurate at every n, see blocked_sum):
//   1. m0 = x[0] + sum(x - x[0]) / n: shifted by a value of the row, so the terms are the
//      deviations, not the values (a row around 1e8 with a spread of 1 sums numbers of size 1,
//      not 1e8: the unshifted float32 sum of 262,144 such values was off by hundreds).
//   2. the deviations d = x - m0: the corrected mean m0 + sum(d)/n and
//      var = sum(d^2)/n - (sum(d)/n)^2 (m0 is within rounding of the mean, so the subtracted
//      square is tiny: no cancellation).
// The correction makes constant rows exact (their output is exactly the bias). Returns false
// when the statistics cannot be trusted in T (sums that overflow, squared deviations that
// underflow): the caller then normalises the row wide.
template <class Arch, class T>
inline bool layer_norm_stats(const T* x, std::size_t n, double eps, T* m0_out, T* corr_out,
                             double* inv_out) {
  const double dn = static_cast<double>(n);
  const T tiny = std::numeric_limits<T>::min() / std::numeric_limits<T>::epsilon();
  const T x0 = x[0];
  const T m0 = static_cast<T>(static_cast<double>(x0) + sum_shifted<Arch, T>(x, n, x0) / dn);
  double sd, sd2;
  sum_dev_and_sq<Arch, T>(x, n, m0, &sd, &sd2);
  const double s1 = sd / dn;
  const T var_sum = static_cast<T>(sd2);
  const T mean = static_cast<T>(static_cast<double>(m0) + s1);
  if (!std::isfinite(m0) || !std::isfinite(mean) || std::isinf(var_sum)) {
    if (std::isfinite(max_abs<Arch, T>(x, n))) return false;  // finite row: redo wide
  } else if (var_sum < tiny && max_abs<Arch, T>(x, n, mean) > T(0)) {
    return false;  // deviations that underflow (a constant row has none: fast path, exact)
  }
  const double var = std::max(0.0, static_cast<double>(var_sum) / dn - s1 * s1);
  *m0_out = m0;
  *corr_out = static_cast<T>(s1);
  *inv_out = 1.0 / std::sqrt(var + eps);
  return true;
}

template <class T>
inline void layer_norm_row_wide(T* o, const T* x, const T* weight, const T* bias, std::size_t n,
                                double eps) {
  using L = long double;
  // The mean as an unevaluated sum hi + lo (hi = x0 + shift rounded, lo = its rounding error),
  // deviations as (x - hi) - lo: x - hi is exact when x is near the mean, so the deviations
  // keep their bits even when the row sits far from 0 relative to its spread (x - mean with
  // a once-rounded mean lost 1e-8 in long double for a row of tiny + subnormal deviations).
  const L x0 = x[0], dn = static_cast<L>(n);
  L s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<L>(x[i]) - x0;
  const L shift = s / dn;  // mean - x0
  const L hi = x0 + shift, lo = shift - (hi - x0);
  L v = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const L d = (static_cast<L>(x[i]) - hi) - lo;
    v += d * d;
  }
  const L inv = 1.0L / std::sqrt(v / dn + eps);
  for (std::size_t i = 0; i < n; ++i)
    o[i] = static_cast<T>(((static_cast<L>(x[i]) - hi) - lo) * inv * (weight ? weight[i] : T(1)) +
                          (bias ? bias[i] : T(0)));
}

}  // namespace

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias
//   x, out: (rows, n); weight, bias: (n,) or null
template <class Arch, class T>
void layer_norm_kernel::operator()(Arch, T* out, const T* x, const T* weight, const T* bias,
                                   std::size_t rows, std::size_t n, double eps, bool stream) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  ExactSubnormals exact;  // subnormal x count (no DAZ), whatever the caller's MXCSR
  if (n == 0) return;     // nothing to write (and no x[0] to shift by)
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;  // (n,)
    T* o = out + r * n;       // (n,) -- may alias xr
    // x - mean is formed as (x - m0) - corr: x - m0 is exact for x near the mean (Sterbenz), and
    // corr = mean - m0 is tiny, so nearly-constant rows keep their small deviations accurately
    T m0, corr;
    double inv_d;
    if (!layer_norm_stats<Arch, T>(xr, n, eps, &m0, &corr, &inv_d)) {
      layer_norm_row_wide(o, xr, weight, bias, n, eps);
      continue;
    }
    // a finite 1/std capped at T's max: a constant row with eps below ~1e-77 (inf in float32)
    // is then exactly its bias, not 0 * inf = NaN; eps = 0 (inv_d inf) stays 0/0, as the
    // reference
    const T inv = static_cast<T>(
        std::isinf(inv_d) ? inv_d : std::min(inv_d, double(std::numeric_limits<T>::max())));
    const B vm0(m0), vcorr(corr), vinv(inv), zero(T(0)), one(T(1));
    auto scalar = [&](std::size_t k) {
      T y = ((xr[k] - m0) - corr) * inv;
      o[k] = std::fma(y, weight ? weight[k] : T(1), bias ? bias[k] : T(0));
    };
    const std::size_t head = stream ? align_head<Arch, T>(o, n) : 0;  // see rms_norm
    std::size_t i = 0;
    for (; i < head; ++i) scalar(i);
    for (; i + N <= n; i += N) {
      B y = ((B::load_unaligned(xr + i) - vm0) - vcorr) * vinv;
      B w = weight ? B::load_unaligned(weight + i) : one;
      B b = bias ? B::load_unaligned(bias + i) : zero;
      store_batch<Arch, T>(o + i, xsimd::fma(y, w, b), stream);
    }
    for (; i < n; ++i) scalar(i);
  }
  stream_fence(stream);
}

}  // namespace llmk
