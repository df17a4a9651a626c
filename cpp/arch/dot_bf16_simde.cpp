// kernels/gemm_bf16.hpp built on the AVX2 baseline against SIMDe's portable AVX-512 (test path;
// see dot_bf16.cpp).
#define LLMK_DOT_NS bf16_simde
#define LLMK_DOT_SIMDE 1
#include "common/dot.hpp"
#include "kernels/gemm_bf16.hpp"

namespace llmk::dot::bf16_simde_entry {
void round_x(std::uint16_t* xb, std::size_t kp, const float* x, std::size_t ldx, std::size_t m,
             std::size_t k) {
  bf16_simde::round_x_bf16(xb, kp, x, ldx, m, k);
}
void block(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp, std::size_t m,
           const std::uint16_t* w, std::size_t k, std::size_t nc, bool accumulate,
           const float* bias, std::uint32_t* wpack) {
  bf16_simde::gemm_bf16_block(y, ldy, xb, kp, m, w, k, nc, accumulate, bias, wpack);
}
}  // namespace llmk::dot::bf16_simde_entry
