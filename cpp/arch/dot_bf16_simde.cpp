// kernels/gemm_bf16.hpp built on the AVX2 baseline against SIMDe's portable AVX-512 and the
// emulated AMX tiles of kernels/amx.hpp (test paths; see dot_bf16.cpp).
#define LLMK_DOT_NS bf16_simde
#define LLMK_DOT_ENTRY bf16_simde_entry
#define LLMK_DOT_SIMDE 1
#define LLMK_AMX_EMU 1
#include "common/dot.hpp"
#include "kernels/gemm_bf16.hpp"
