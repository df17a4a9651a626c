// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, row by row.
#pragma once

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// 1 / sqrt(mean(x^2) + eps) of one row, computed overflow- and underflow-safe: the fast path
// sums squares in T; if that overflows (|x| ~ 1e20+ in float32) or lands where squares lose
// precision to underflow, the row is rescaled by 1/max|x| and the mean square rebuilt in double.
template <class Arch, class T>
inline double rms_inv(const T* x, std::size_t n, double eps) {
  T ss = sum_squares<Arch, T>(x, n, T(1));
  double ms = static_cast<double>(ss) / static_cast<double>(n);
  const T tiny = std::numeric_limits<T>::min() / std::numeric_limits<T>::epsilon();
  if (!std::isnan(ss) && (std::isinf(ss) || ss < tiny)) {
    T m = max_abs<Arch, T>(x, n);
    if (m > T(0) && std::isfinite(m)) {
      T scale = T(1) / m;
      double scaled = static_cast<double>(sum_squares<Arch, T>(x, n, scale));
      double s = static_cast<double>(scale);
      ms = scaled / (s * s) / static_cast<double>(n);
    }
  }
  return 1.0 / std::sqrt(ms + eps);
}

}  // namespace

template <class Arch, class T>
void rms_norm_kernel::operator()(Arch, T* out, const T* x, const T* weight, std::size_t rows,
                                 std::size_t n, double eps, bool stream) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;  // (n,)
    T* o = out + r * n;       // (n,) -- may be xr itself: each element is read before written
    const T inv = static_cast<T>(rms_inv<Arch, T>(xr, n, eps));
    const B vinv(inv);
    // with streamed stores, a scalar head brings o + i to vector alignment (same arithmetic)
    const std::size_t head = stream ? align_head<Arch, T>(o, n) : 0;
    std::size_t i = 0;
    if (weight) {
      for (; i < head; ++i) o[i] = (xr[i] * inv) * weight[i];
      for (; i + N <= n; i += N)
        store_batch<Arch, T>(o + i, (B::load_unaligned(xr + i) * vinv) * B::load_unaligned(weight + i),
                             stream);
      for (; i < n; ++i) o[i] = (xr[i] * inv) * weight[i];
    } else {
      for (; i < head; ++i) o[i] = xr[i] * inv;
      for (; i + N <= n; i += N) store_batch<Arch, T>(o + i, B::load_unaligned(xr + i) * vinv, stream);
      for (; i < n; ++i) o[i] = xr[i] * inv;
    }
  }
  stream_fence(stream);
}

}  // namespace llmk
