// Roofline probes: how fast this core can do FMAs, and how fast it can stream memory.
#pragma once

#include <utility>

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// a[i] = fma(a[i], m, k) for every i of the pack
template <class B, std::size_t... I>
inline void fma_chains(B* a, const B& m, const B& k, std::index_sequence<I...>) {
  ((a[I] = xsimd::fma(a[I], m, k)), ...);
}

}  // namespace

// FMA throughput: *flops = floating-point operations done; *sink keeps the result alive.
template <class Arch>
void fma_probe_kernel::operator()(Arch, std::size_t iterations, double* flops, float* sink) const {
  using B = vec<Arch, float>;
  // 12 independent chains: enough to cover FMA latency (4 cycles) x 2-3 ports; distinct
  // starting values, so the compiler cannot merge identical chains. (An index pack, not a
  // loop: every chain stays in a register.)
  constexpr std::size_t kChains = 12;
  B a[kChains];
  for (std::size_t c = 0; c < kChains; ++c) a[c] = B(1.0f + 0.01f * static_cast<float>(c));
  const B m(0.999999f), k(1e-7f);
  for (std::size_t it = 0; it < iterations; ++it)
    fma_chains(a, m, k, std::make_index_sequence<kChains>{});
  B total = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])) +
            ((a[8] + a[9]) + (a[10] + a[11]));
  *sink = xsimd::hadd(total);
  *flops = 2.0 * kChains * static_cast<double>(B::size) * static_cast<double>(iterations);
}

// A STREAM triad a = b + s * c over n floats.
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

// Read-only streaming: *sum = the sum of a[0, n), read as 4 streams in lockstep (its quarters;
// one vector accumulator each), as the GEMV kernels read 4 stripes of rows: a single stream left
// the hardware prefetchers behind (20 against 26 GB/s on 1 Zen 4 core). What a decode step does
// to its weights.
template <class Arch>
void read_kernel::operator()(Arch, const float* a, std::size_t n, float* sum) const {
  using B = vec<Arch, float>;
  constexpr std::size_t N = B::size;
  const std::size_t q = n / 4 / N * N;  // vectors per quarter
  const float *a0 = a, *a1 = a + q, *a2 = a + 2 * q, *a3 = a + 3 * q;
  B s0(0.f), s1(0.f), s2(0.f), s3(0.f);
  for (std::size_t i = 0; i < q; i += N) {
    s0 += B::load_unaligned(a0 + i);
    s1 += B::load_unaligned(a1 + i);
    s2 += B::load_unaligned(a2 + i);
    s3 += B::load_unaligned(a3 + i);
  }
  float tail = 0.f;
  for (std::size_t i = 4 * q; i < n; ++i) tail += a[i];
  *sum = xsimd::hadd((s0 + s1) + (s2 + s3)) + tail;
}

}  // namespace llmk
