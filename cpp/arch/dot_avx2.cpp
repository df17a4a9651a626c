// kernels/quant_vnni.hpp's prefill with its integer side on AVX2 (maddubs + madd, the sign
// trick for int8 weights, unsigned nibbles for int4): the int8-activation prefill on CPUs
// without VNNI. Integer sums are exact, so it equals the VNNI kernel -- and the AVX2 GEMV, token
// by token -- bit for bit.
#define LLMK_DOT_NS maddubs_avx2
#define LLMK_DOT_ENTRY avx2_entry
#define LLMK_DOT_MADDUBS 1
#include "common/dot.hpp"
#include "kernels/quant_vnni.hpp"

namespace llmk::dot {
// The roofline of the int8-weight kernels on AVX2 (no VNNI): the instruction mix of their
// integer side per 32 products (chunk_sums above, the GEMV alike) -- the sign trick's sign,
// maddubs (one side's absolute value as the unsigned operand), madd to int32, add -- on 12
// independent chains, 64 integer operations each. On AMD Zen 3 the vector integer multiplies (two per 32 products) bound it at
// about the float32 FMA peak. Returns the operations done; *sink keeps the result alive.
double probe_maddubs(std::size_t iterations, int* sink) {
  constexpr int kChains = 12;
  __m256i acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_epi32(c);
  const __m256i w = _mm256_set1_epi8(-3), ones = _mm256_set1_epi16(1);
  const __m256i aw = _mm256_abs_epi8(w);
  // Each chain's activation bytes are its own running sum: nothing is loop-invariant, so the
  // compiler cannot hoist the mix out of the loop (products of constants would leave only the
  // adds). The chain's latency (sign, maddubs, madd, add: ~8 cycles) is covered by 12 chains.
  for (std::size_t it = 0; it < iterations; ++it)
    for (int c = 0; c < kChains; ++c)
      acc[c] = _mm256_add_epi32(
          acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(acc[c], w)), ones));
  __m256i total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm256_add_epi32(total, acc[c]);
  alignas(32) std::int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  int s = 0;
  for (int l = 0; l < 8; ++l) s += lanes[l];
  *sink = s;
  return 64.0 * kChains * static_cast<double>(iterations);
}
}  // namespace llmk::dot
