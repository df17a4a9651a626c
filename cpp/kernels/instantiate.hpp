// Included once per ISA translation unit (cpp/arch/<isa>.cpp) after defining LLMK_ARCH:
// explicitly instantiates every kernel functor for that architecture and both dtypes.
#pragma once

#include "kernels/attention.hpp"
#include "kernels/gemm.hpp"
#include "kernels/gemv.hpp"
#include "kernels/layer_norm.hpp"
#include "kernels/probe.hpp"
#include "kernels/rms_norm.hpp"
#include "kernels/rope.hpp"
#include "kernels/silu.hpp"

#define LLMK_INSTANTIATE_T(A, T)                                                               \
  template void llmk::rms_norm_kernel::operator()<A, T>(A, T*, const T*, const T*, std::size_t, \
                                                        std::size_t, double, bool) const;      \
  template void llmk::layer_norm_kernel::operator()<A, T>(                                     \
      A, T*, const T*, const T*, const T*, std::size_t, std::size_t, double, bool) const;      \
  template void llmk::silu_kernel<false>::operator()<A, T>(A, T*, const T*, const T*,          \
                                                           std::size_t, bool) const;           \
  template void llmk::silu_kernel<true>::operator()<A, T>(A, T*, const T*, const T*,           \
                                                          std::size_t, bool) const;            \
  template void llmk::exp_kernel::operator()<A, T>(A, T*, const T*, std::size_t) const;        \
  template void llmk::sigmoid_kernel::operator()<A, T>(A, T*, const T*, std::size_t) const;    \
  template void llmk::add_bias_kernel::operator()<A, T>(A, T*, const T*, std::size_t,          \
                                                        std::size_t) const;                    \
  template void llmk::gemv_kernel::operator()<A, T>(A, T*, std::size_t, const T*, const T*,   \
                                                    std::size_t, std::size_t, std::size_t,     \
                                                    std::size_t, bool, const T*) const;        \
  template void llmk::gemm_xt_kernel::operator()<A, T>(A, T*, std::size_t, const T*,           \
                                                      std::size_t, const T*, std::size_t,       \
                                                      std::size_t, bool, const T*) const;       \
  template void llmk::rope_kernel::operator()<A, T>(A, T*, const T*, const std::int64_t*,      \
                                                    const T*, const T*, std::size_t,           \
                                                    std::size_t, std::size_t, bool, bool) const; \
  template void llmk::attention_tile_kernel::operator()<A, T>(                                 \
      A, const llmk::attn_params<T>&, const llmk::attn_item&, T*, T*, T*, T*,                  \
      std::uint8_t*) const;

#define LLMK_INSTANTIATE(A)                                                                  \
  LLMK_INSTANTIATE_T(A, float)                                                               \
  LLMK_INSTANTIATE_T(A, double)                                                              \
  template void llmk::fma_probe_kernel::operator()<A>(A, std::size_t, double*, float*) const; \
  template void llmk::triad_kernel::operator()<A>(A, float*, const float*, const float*, float, \
                                                  std::size_t) const;
