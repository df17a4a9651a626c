// LayerNorm: out = (x - mean) / sqrt(var + eps) * weight + bias, biased variance, row by row.
#pragma once

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// Mean and 1/sqrt(var + eps) of one row. Two passes (mean, then squared deviations) for
// accuracy. If the sum overflows, the mean is rebuilt from the row scaled by 1/max|x|; if the
// squared deviations overflow or underflow, they are rebuilt scaled by 1/max|x - mean|.
template <class Arch, class T>
inline void layer_norm_stats(const T* x, std::size_t n, double eps, T* mean_out, double* inv_out) {
  const double dn = static_cast<double>(n);
  const T tiny = std::numeric_limits<T>::min() / std::numeric_limits<T>::epsilon();
  T mean = static_cast<T>(static_cast<double>(sum_shifted<Arch, T>(x, n, T(0), T(1))) / dn);
  if (!std::isfinite(mean)) {  // overflow can also show as NaN (+inf and -inf partial sums)
    T m = max_abs<Arch, T>(x, n);
    if (std::isfinite(m)) {  // finite entries whose sum overflowed
      T scale = T(1) / m;
      double scaled = static_cast<double>(sum_shifted<Arch, T>(x, n, T(0), scale));
      mean = static_cast<T>(scaled / dn / static_cast<double>(scale));
    }
  }
  T var_sum = sum_sq_dev<Arch, T>(x, n, mean, T(1));
  double var = static_cast<double>(var_sum) / dn;
  if (!std::isnan(var_sum) && (std::isinf(var_sum) || var_sum < tiny)) {
    T m = max_abs<Arch, T>(x, n, mean);
    if (m > T(0) && std::isfinite(m)) {
      T scale = T(1) / m;
      double s = static_cast<double>(scale);
      var = static_cast<double>(sum_sq_dev<Arch, T>(x, n, mean, scale)) / dn / (s * s);
    }
  }
  *mean_out = mean;
  *inv_out = 1.0 / std::sqrt(var + eps);
}

}  // namespace

template <class Arch, class T>
void layer_norm_kernel::operator()(Arch, T* out, const T* x, const T* weight, const T* bias,
                                   std::size_t rows, std::size_t n, double eps,
                                   bool stream) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;  // (n,)
    T* o = out + r * n;       // (n,) -- may alias xr
    T mean;
    double inv_d;
    layer_norm_stats<Arch, T>(xr, n, eps, &mean, &inv_d);
    const T inv = static_cast<T>(inv_d);
    const B vmean(mean), vinv(inv), zero(T(0)), one(T(1));
    auto scalar = [&](std::size_t k) {
      T y = (xr[k] - mean) * inv;
      o[k] = std::fma(y, weight ? weight[k] : T(1), bias ? bias[k] : T(0));
    };
    const std::size_t head = stream ? align_head<Arch, T>(o, n) : 0;  // see rms_norm
    std::size_t i = 0;
    for (; i < head; ++i) scalar(i);
    for (; i + N <= n; i += N) {
      B y = (B::load_unaligned(xr + i) - vmean) * vinv;
      B w = weight ? B::load_unaligned(weight + i) : one;
      B b = bias ? B::load_unaligned(bias + i) : zero;
      store_batch<Arch, T>(o + i, xsimd::fma(y, w, b), stream);
    }
    for (; i < n; ++i) scalar(i);
  }
  stream_fence(stream);
}

}  // namespace llmk
