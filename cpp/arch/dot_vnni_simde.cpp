// kernels/quant_vnni.hpp built on the AVX2 baseline against SIMDe's portable vpdpbusd (test
// path: the same source as dot_vnni.cpp, runnable on any AVX2 host; integer sums are exact, so
// its results equal the native ones bit for bit); the AMX kernel on the emulated tiles of
// kernels/amx.hpp (the same: exact integer sums, then the same float arithmetic).
#define LLMK_DOT_NS vnni_simde
#define LLMK_DOT_SIMDE 1
#define LLMK_AMX_EMU 1
#include "common/dot.hpp"
#include "kernels/quant_vnni.hpp"

namespace llmk::dot {
void qgemm_int8_acts_vnni_simde(const qgemv_args& a, int bits, std::uint8_t* pack) {
  vnni_simde::qgemm_int8_acts(a, bits, pack);
}
void qgemm_int8_acts_amx_emu(const qgemv_args& a, int bits, std::uint8_t* pack) {
  vnni_simde::qgemm_int8_acts_amx(a, bits, pack);
}
void qgemv_int8_vnni_simde(const qgemv_args& a) { vnni_simde::qgemv_int8_vnni(a); }
}  // namespace llmk::dot
