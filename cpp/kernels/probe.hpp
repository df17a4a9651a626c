// Roofline probes: how fast this core can do FMAs, and how fast it can stream memory.
#pragma once

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {

template <class Arch>
void fma_probe_kernel::operator()(Arch, std::size_t iterations, double* flops, float* sink) const {
  using B = vec<Arch, float>;
  // 12 independent chains: enough to cover FMA latency (4 cycles) x 2-3 ports.
  // distinct starting values, so the compiler cannot merge identical chains
  B a0(1.00f), a1(1.01f), a2(1.02f), a3(1.03f), a4(1.04f), a5(1.05f), a6(1.06f), a7(1.07f),
      a8(1.08f), a9(1.09f), a10(1.10f), a11(1.11f);
  const B m(0.999999f), k(1e-7f);
  for (std::size_t it = 0; it < iterations; ++it) {
    a0 = xsimd::fma(a0, m, k);
    a1 = xsimd::fma(a1, m, k);
    a2 = xsimd::fma(a2, m, k);
    a3 = xsimd::fma(a3, m, k);
    a4 = xsimd::fma(a4, m, k);
    a5 = xsimd::fma(a5, m, k);
    a6 = xsimd::fma(a6, m, k);
    a7 = xsimd::fma(a7, m, k);
    a8 = xsimd::fma(a8, m, k);
    a9 = xsimd::fma(a9, m, k);
    a10 = xsimd::fma(a10, m, k);
    a11 = xsimd::fma(a11, m, k);
  }
  B total = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + ((a8 + a9) + (a10 + a11));
  *sink = xsimd::hadd(total);
  *flops = 2.0 * 12.0 * static_cast<double>(B::size) * static_cast<double>(iterations);
}

template <class Arch>
void triad_kernel::operator()(Arch, float* a, const float* b, const float* c, float s,
                              std::size_t n) const {
  using B = vec<Arch, float>;
  constexpr std::size_t N = B::size;
  const B vs(s);
  std::size_t i = 0;
  for (; i + N <= n; i += N)
    xsimd::fma(B::load_unaligned(c + i), vs, B::load_unaligned(b + i)).store_unaligned(a + i);
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

}  // namespace llmk
