// The kernels, one line each: X(functor, (parameters after the architecture tag)). T is the
// element type. ops.hpp declares a functor per line (its operator() a template over the xsimd
// architecture tag and T) and instantiate.hpp instantiates each one for every ISA of
// common/isa_list.hpp and for float and double. The shape of every buffer is documented at the
// kernel's definition (kernels/<op>.hpp). Adding a kernel: its header, one line here, and its
// #include in instantiate.hpp.
//
// Conventions (llama2.c style): out first, then inputs, then sizes. All pointers are to
// C-contiguous buffers; `out` may alias `x` exactly (never partially). Kernels assume valid
// input. `stream`: write `out` with non-temporal stores (for outputs far larger than the
// caches: saves the read-for-ownership of every output line); only passed as true when `out`
// and every row start are aligned to the vector size (the op's driver checks).
#pragma once

#include "kernels/quant_types.hpp"

#define LLMK_KERNELS(X, T)                                                                   \
  X(rms_norm_kernel, (T* out, const T* x, const T* weight, std::size_t rows, std::size_t n, \
                      double eps, bool stream))                                              \
  X(layer_norm_kernel, (T* out, const T* x, const T* weight, const T* bias, std::size_t rows, \
                        std::size_t n, double eps, bool stream))                             \
  X(silu_kernel, (T* out, const T* x, const T* up, std::size_t n, bool stream))             \
  X(swiglu_kernel, (T* out, const T* x, const T* up, std::size_t n, bool stream))           \
  X(geglu_kernel, (T* out, const T* x, const T* up, std::size_t n, bool stream))            \
  X(exp_kernel, (T* out, const T* x, const T* up, std::size_t n, bool stream))              \
  X(sigmoid_kernel, (T* out, const T* x, const T* up, std::size_t n, bool stream))          \
  X(rope_kernel, (T* out, const T* x, const std::int64_t* table_row, const T* cos_tab,      \
                  const T* sin_tab, std::size_t rows, std::size_t d, std::size_t rotary_dim, \
                  bool interleaved, bool stream))                                            \
  X(attention_tile_kernel, (const attn_params<T>& p, const attn_item& it, T* workspace,      \
                            T* part_m, T* part_l, T* part_o, std::uint8_t* flags))           \
  X(gemv_kernel, (T* y, std::size_t ldy, const T* w, const T* x, std::size_t ldx,           \
                  std::size_t m, std::size_t rows, std::size_t k, bool accumulate,           \
                  const T* bias))                                                            \
  X(gemm_xt_kernel, (T* y, std::size_t ldy, const T* xt, std::size_t m, const T* w,         \
                     std::size_t n, std::size_t k, bool accumulate, const T* bias))          \
  X(gemm_pack_x_kernel, (T* xp, const T* x, std::size_t ldx, std::size_t m, std::size_t k,  \
                         std::size_t t0, std::size_t t1))                                    \
  X(gemm_packed_kernel, (T* y, std::size_t ldy, const T* xp, std::size_t m, std::size_t k,  \
                         const T* w, std::size_t ldw, bool in_out, std::size_t n, T* wpack,  \
                         bool accumulate, const T* bias))

// Kernels of float only (the roofline probes; projections with 16-bit weights, kernels/
// weight16.hpp; the quantized-weight products of quant.hpp and their activation quantizer,
// quant_acts.hpp; the packed GEMM on weights of any WeightFormat, gemm_packed_w.hpp):
// X(functor, (parameters)),
// operator() a template over the architecture tag alone.
#define LLMK_FLOAT_KERNELS(X)                                                                 \
  X(fma_probe_kernel, (std::size_t iterations, double* flops, float* sink))                  \
  X(triad_kernel, (float* a, const float* b, const float* c, float s, std::size_t n))        \
  X(read_kernel, (const float* a, std::size_t n, float* sum))                                \
  X(gemv_w16_kernel, (float* y, std::size_t ldy, const std::uint16_t* w, WeightFormat fmt,  \
                      const float* x, std::size_t ldx, std::size_t m, std::size_t rows,      \
                      std::size_t k, bool accumulate, const float* bias))                    \
  X(gemm_xt_w16_kernel, (float* y, std::size_t ldy, const float* xt, std::size_t m,         \
                         const std::uint16_t* w, WeightFormat fmt, std::size_t n,            \
                         std::size_t k, bool accumulate, const float* bias))                 \
  X(widen_w16_kernel, (float* out, const std::uint16_t* w, WeightFormat fmt, std::size_t n)) \
  X(gemv_q8_kernel, (const qgemv_args& a))                                                   \
  X(gemv_q4_kernel, (const qgemv_args& a))                                                   \
  X(gemm_q_kernel, (const qgemv_args& a, int bits))                                         \
  X(quantize_acts_kernel, (std::int8_t* q, std::int16_t* q16, float* s, bool* in_range,      \
                           const float* x, std::size_t m, std::size_t k))                    \
  X(gemm_packed_w_kernel, (float* y, std::size_t ldy, const float* xp, std::size_t m,       \
                           std::size_t k, const WeightRef& w, std::size_t n, float* wpack,  \
                           bool accumulate, const float* bias))

#define LLMK_UNPAREN(...) __VA_ARGS__
