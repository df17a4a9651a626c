// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, row by row.
#pragma once

#include <algorithm>

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// A row whose sum of squares overflows (|x| ~ 1e19+ in float32) or loses precision to
// underflow (|x| ~ 1e-19-, subnormals) is normalised in a wider type where every square fits:
// double for float32, long double (x87: 15-bit exponent) for float64. Rare; the fast path is SIMD.
// (float32 rows only need double, whose range holds every float32 square: the compiler can
// vectorise that loop.)
template <class T>
using wide_t = typename std::conditional<std::is_same<T, float>::value, double, long double>::type;

template <class T>
inline void rms_norm_row_wide(T* o, const T* x, const T* weight, std::size_t n, double eps) {
  using W = wide_t<T>;
  W ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += static_cast<W>(x[i]) * static_cast<W>(x[i]);
  const W inv = W(1) / std::sqrt(ss / static_cast<W>(n) + static_cast<W>(eps));
  for (std::size_t i = 0; i < n; ++i)
    o[i] = static_cast<T>(static_cast<W>(x[i]) * inv * (weight ? weight[i] : T(1)));
}

// True when the fast sum of squares `ss` of a finite row cannot be trusted.
template <class Arch, class T>
inline bool needs_wide(T ss, const T* x, std::size_t n) {
  const T tiny = std::numeric_limits<T>::min() / std::numeric_limits<T>::epsilon();
  if (std::isnan(ss) || !(std::isinf(ss) || ss < tiny)) return false;
  const T m = max_abs<Arch, T>(x, n);
  return m > T(0) && std::isfinite(m);  // rows with Inf keep IEEE semantics (fast path)
}

}  // namespace

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight
//   x, out: (rows, n); weight: (n,) or null
template <class Arch, class T>
void rms_norm_kernel::operator()(Arch, T* out, const T* x, const T* weight, std::size_t rows,
                                 std::size_t n, double eps, bool stream) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  ExactSubnormals exact;  // subnormal x count (no DAZ), whatever the caller's MXCSR
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * n;  // (n,)
    T* o = out + r * n;       // (n,) -- may be xr itself: each element is read before written
    // blocked sum (accurate at every n, see blocked_sum)
    const T ss = sum_squares<Arch, T>(xr, n, T(1));
    if (needs_wide<Arch, T>(ss, xr, n)) {
      rms_norm_row_wide(o, xr, weight, n, eps);
      continue;
    }
    // A finite 1/rms is capped at T's max: a zero row with eps below ~1e-77 would make it inf
    // in float32, and 0 * inf NaN (the exact answer is 0; a nonzero row that small went wide
    // above). eps = 0 and a zero row stay 0/0 = NaN, as the reference.
    const double inv_d = 1.0 / std::sqrt(static_cast<double>(ss) / n + eps);
    const T inv = static_cast<T>(
        std::isinf(inv_d) ? inv_d : std::min(inv_d, double(std::numeric_limits<T>::max())));
    const B vinv(inv);
    // with streamed stores, a scalar head brings o + i to vector alignment (same arithmetic)
    const std::size_t head = stream ? align_head<Arch, T>(o, n) : 0;
    std::size_t i = 0;
    if (weight) {
      for (; i < head; ++i) o[i] = (xr[i] * inv) * weight[i];
      for (; i + N <= n; i += N)
        store_batch<Arch, T>(
            o + i, (B::load_unaligned(xr + i) * vinv) * B::load_unaligned(weight + i), stream);
      for (; i < n; ++i) o[i] = (xr[i] * inv) * weight[i];
    } else {
      for (; i < head; ++i) o[i] = xr[i] * inv;
      for (; i + N <= n; i += N)
        store_batch<Arch, T>(o + i, B::load_unaligned(xr + i) * vinv, stream);
      for (; i < n; ++i) o[i] = xr[i] * inv;
    }
  }
  stream_fence(stream);
}

}  // namespace llmk
