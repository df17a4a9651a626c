// GeGLU with the tanh-approximated GELU (Gemma's MLP): out = gelu_tanh(x) * up, where
//   gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// the formula of torch.nn.functional.gelu(approximate="tanh") and transformers'
// gelu_pytorch_tanh, evaluated in that order so the results track the peer's rounding.
// tanh saturates at +-1: for x below about -10 (float32) 1 + tanh is exactly 0, as in torch.
#pragma once

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {

// out, x, up: (n,). `stream` is accepted for the common signature; stores are plain.
template <class Arch, class T>
void geglu_kernel::operator()(Arch, T* out, const T* x, const T* up, std::size_t n, bool) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  ExactSubnormals exact;  // subnormal x count (no DAZ), whatever the caller's MXCSR
  const B half(T(0.5)), one(T(1)), kappa(T(0.044715));
  const B beta(T(0.7978845608028654));  // sqrt(2 / pi)
  auto f = [&](const B& g, const B& u) {
    const B inner = beta * (g + kappa * g * g * g);
    return half * g * (one + xsimd::tanh(inner)) * u;
  };
  std::size_t i = 0;
  for (; i + N <= n; i += N)
    f(B::load_unaligned(x + i), B::load_unaligned(up + i)).store_unaligned(out + i);
  if (i < n) {  // tail through a padded buffer: the same vector code for every element
    alignas(64) T bx[N] = {}, bu[N] = {};
    for (std::size_t k = 0; k < n - i; ++k) bx[k] = x[i + k], bu[k] = up[i + k];
    f(B::load_aligned(bx), B::load_aligned(bu)).store_aligned(bx);
    for (std::size_t k = 0; k < n - i; ++k) out[i + k] = bx[k];
  }
}

}  // namespace llmk
