// kernels/quant_vnni.hpp built for AVX512_VNNI + AVX512VL and AMX (CMakeLists.txt gives the
// flags; common/dot.cpp calls each kernel only on CPUs that have its instructions).
#define LLMK_DOT_NS vnni_native
#define LLMK_DOT_ENTRY native_entry
#include "common/dot.hpp"
#include "kernels/quant_vnni.hpp"

namespace llmk::dot {
// The roofline of the int8 kernels: 12 independent chains of 512-bit vpdpbusd, 128 integer
// operations (64 multiply-adds) each -- the instruction's peak whatever the kernel's width (Zen 4
// splits a 512-bit one into two 256-bit halves: the same rate as 256-bit ones; Zen 5 and Intel
// run it whole, twice theirs). Returns the operations done; *sink keeps the result alive.
double probe_vpdpbusd(std::size_t iterations, int* sink) {
  constexpr int kChains = 12;
  __m512i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_epi32(c);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (std::size_t it = 0; it < iterations; ++it)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], a, b);
  __m512i total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_epi32(total, acc[c]);
  *sink = _mm512_reduce_add_epi32(total);
  return 128.0 * kChains * static_cast<double>(iterations);
}
}  // namespace llmk::dot
