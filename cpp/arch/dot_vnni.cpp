// kernels/quant_vnni.hpp built for AVX512_VNNI + AVX512VL and AMX (CMakeLists.txt gives the
// flags; common/dot.cpp calls each kernel only on CPUs that have its instructions).
#define LLMK_DOT_NS vnni_native
#define LLMK_DOT_ENTRY native_entry
#include "common/dot.hpp"
#include "kernels/quant_vnni.hpp"

namespace llmk::dot {
// The roofline of the int8 kernels: 12 independent chains of 256-bit vpdpbusd (the kernels'
// width; Zen 4 splits 512-bit ones in two anyway), 64 integer operations (32 multiply-adds)
// each. Returns the operations done; *sink keeps the result alive.
double probe_vpdpbusd(std::size_t iterations, int* sink) {
  constexpr int kChains = 12;
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2);
  for (std::size_t it = 0; it < iterations; ++it)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_dpbusd_epi32(acc[c], a, b);
  __m256i total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm256_add_epi32(total, acc[c]);
  *sink = _mm256_extract_epi32(total, 0);
  return 64.0 * kChains * static_cast<double>(iterations);
}
}  // namespace llmk::dot
