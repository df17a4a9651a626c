// SiLU and SwiGLU: out = x * sigmoid(x) [* up]. Also the bare exp / sigmoid used by tests.
#pragma once

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {

template <bool Gated>
template <class Arch, class T>
void silu_kernel<Gated>::operator()(Arch, T* out, const T* x, const T* up, std::size_t n,
                                    bool stream) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  const B one(T(1));
  FlushSubnormals ftz;
  // silu(x) = x / (1 + exp(-x)): for x -> -inf, exp(-x) overflows to +inf and the quotient is
  // -0, never NaN (x = -inf itself gives NaN, as IEEE inf/inf and torch do).
  auto silu = [&](const B& g) { return g / (one + exp_wide<Arch, T>(-g)); };
  // a partial batch of cnt < N elements at i goes through a padded buffer: the same vector code
  // for every element, wherever it sits
  auto partial = [&](std::size_t i, std::size_t cnt) {
    alignas(64) T bx[N] = {};
    alignas(64) T bu[N] = {};
    for (std::size_t k = 0; k < cnt; ++k) {
      bx[k] = x[i + k];
      if (Gated) bu[k] = up[i + k];
    }
    B y = silu(B::load_aligned(bx));
    if (Gated) y *= B::load_aligned(bu);
    y.store_aligned(bx);
    for (std::size_t k = 0; k < cnt; ++k) out[i + k] = bx[k];
  };
  std::size_t i = stream ? align_head<Arch, T>(out, n) : 0;  // streamed stores need alignment
  if (i > 0) partial(0, i);
  for (; i + N <= n; i += N) {
    B y = silu(B::load_unaligned(x + i));
    if (Gated) y *= B::load_unaligned(up + i);
    store_batch<Arch, T>(out + i, y, stream);
  }
  if (i < n) partial(i, n - i);
  stream_fence(stream);
}

template <class Arch, class T>
void exp_kernel::operator()(Arch, T* out, const T* x, std::size_t n) const {
  map_unary<Arch, T>(out, x, n, [](const vec<Arch, T>& v) { return exp_flush<Arch, T>(v); });
}

template <class Arch, class T>
void sigmoid_kernel::operator()(Arch, T* out, const T* x, std::size_t n) const {
  map_unary<Arch, T>(out, x, n, [](const vec<Arch, T>& v) { return sigmoid_vec<Arch, T>(v); });
}

template <class Arch, class T>
void add_bias_kernel::operator()(Arch, T* out, const T* bias, std::size_t rows,
                                 std::size_t n) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  for (std::size_t r = 0; r < rows; ++r) {
    T* o = out + r * n;  // (n,)
    std::size_t i = 0;
    for (; i + N <= n; i += N)
      (B::load_unaligned(o + i) + B::load_unaligned(bias + i)).store_unaligned(o + i);
    for (; i < n; ++i) o[i] += bias[i];
  }
}

}  // namespace llmk
