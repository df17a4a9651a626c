// Included once per ISA translation unit (cpp/arch/arch.cpp.in, configured per ISA by CMake):
// LLMK_INSTANTIATE(tag) explicitly instantiates every kernel of kernel_list.hpp for that
// architecture and both dtypes.
#pragma once

#include "kernels/attention.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemm_packed_w.hpp"
#include "kernels/gelu.hpp"
#include "kernels/gemv.hpp"
#include "kernels/kernel_list.hpp"
#include "kernels/layer_norm.hpp"
#include "kernels/probe.hpp"
#include "kernels/quant.hpp"
#include "kernels/quant_acts.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rope.hpp"
#include "kernels/silu.hpp"
#include "kernels/weight16.hpp"

// one kernel for the translation unit's architecture tag (the element type is deduced)
#define LLMK_INSTANTIATE_KERNEL(name, params) \
  template void name::operator()<llmk_arch_tag>(llmk_arch_tag, LLMK_UNPAREN params) const;

#define LLMK_INSTANTIATE(A)                                \
  namespace llmk {                                         \
  using llmk_arch_tag = A;                                 \
  LLMK_KERNELS(LLMK_INSTANTIATE_KERNEL, float)             \
  LLMK_KERNELS(LLMK_INSTANTIATE_KERNEL, double)            \
  LLMK_FLOAT_KERNELS(LLMK_INSTANTIATE_KERNEL)              \
  }
