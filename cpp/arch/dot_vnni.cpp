// kernels/quant_vnni.hpp built for AVX512_VNNI + AVX512VL (CMakeLists.txt gives the flags).
#define LLMK_DOT_NS vnni_native
#include "common/dot.hpp"
#include "kernels/quant_vnni.hpp"

namespace llmk::dot {
void qgemm_int8_acts_vnni(const qgemv_args& a, int bits, std::uint8_t* pack) {
  vnni_native::qgemm_int8_acts(a, bits, pack);
}
}  // namespace llmk::dot
