// kernels/gemm_bf16.hpp built for AVX512_BF16 (common/dot.cpp calls it only on such CPUs).
#define LLMK_DOT_NS bf16_native
#define LLMK_DOT_ENTRY bf16_native_entry
#include "common/dot.hpp"
#include "kernels/gemm_bf16.hpp"

static_assert(llmk::dot::kBf16PackWords >=
                  llmk::bf16_native::kBf16Kc / 2 * llmk::dot::kBf16BlockCols,
              "the pack scratch holds a packed block");
