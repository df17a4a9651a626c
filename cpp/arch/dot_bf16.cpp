// kernels/gemm_bf16.hpp built for AVX512_BF16 and AMX (common/dot.cpp calls each only on CPUs
// that have it).
#define LLMK_DOT_NS bf16_native
#define LLMK_DOT_ENTRY bf16_native_entry
#include "common/dot.hpp"
#include "kernels/gemm_bf16.hpp"

static_assert(llmk::dot::kBf16PackWords >=
                  llmk::bf16_native::kBf16Kc / 2 * llmk::dot::kBf16BlockCols,
              "the pack scratch holds a packed block");

namespace llmk::dot {
// The roofline of the bf16 GEMM: 12 independent chains of 512-bit vdpbf16ps (the kernel's
// width), 64 floating-point operations (32 bf16 products, each added) each. Returns the
// operations done; *sink keeps the result alive.
double probe_vdpbf16ps(std::size_t iterations, float* sink) {
  constexpr int kChains = 12;
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  for (std::size_t it = 0; it < iterations; ++it)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  *sink = _mm512_reduce_add_ps(total);
  return 64.0 * kChains * static_cast<double>(iterations);
}

// The roofline of the AMX kernels: 4 independent tile accumulators, tdpbf16ps (16 x 16 x 32
// bf16 multiply-adds: 16384 operations) or tdpbssd (16 x 16 x 64 int8: 32768) on whole tiles.
// Call where cpu_has_amx() (the tile state granted).
double probe_amx(bool int8, std::size_t iterations, float* sink) {
  namespace amx = bf16_native::amx;
  alignas(64) float out[16 * 16];
  {
    const amx::Session session(amx::kWholeTiles);
    alignas(64) std::uint16_t ones[16 * 32];
    for (std::uint16_t& v : ones) v = 0x3f80;  // bf16 1.0 (as int8: 0x80, 0x3f)
    LLMK_TILE_LOAD(4, ones, 64);
    LLMK_TILE_LOAD(5, ones, 64);
    LLMK_TILE_LOAD(6, ones, 64);
    LLMK_TILE_LOAD(7, ones, 64);
    LLMK_TILE_ZERO(0);
    LLMK_TILE_ZERO(1);
    LLMK_TILE_ZERO(2);
    LLMK_TILE_ZERO(3);
    for (std::size_t it = 0; it < iterations; ++it) {
      if (int8) {
        LLMK_TILE_DPBSSD(0, 4, 6);
        LLMK_TILE_DPBSSD(1, 4, 7);
        LLMK_TILE_DPBSSD(2, 5, 6);
        LLMK_TILE_DPBSSD(3, 5, 7);
      } else {
        LLMK_TILE_DPBF16PS(0, 4, 6);
        LLMK_TILE_DPBF16PS(1, 4, 7);
        LLMK_TILE_DPBF16PS(2, 5, 6);
        LLMK_TILE_DPBF16PS(3, 5, 7);
      }
    }
    LLMK_TILE_STORE(0, out, 64);
  }  // (the tiles left as they were found)
  *sink = out[0];
  return (int8 ? 32768.0 : 16384.0) * 4 * static_cast<double>(iterations);
}
}  // namespace llmk::dot
