// The projection path: y = x . W (+ bias), the one function behind every matrix product of the
// package -- the functional swiglu_ffn's three projections and every projection of the modules
// (cpp/modules: QKV, O, the feed-forward's gate/up and down, the LM head). drivers/linear.cpp
// routes by weight format to the GEMM routes (drivers/gemm_routes.hpp) or to qlinear
// (drivers/qlinear.hpp); neither calls back into it.
#pragma once

#include <cstddef>

#include "drivers/gemm_routes.hpp"
#include "kernels/ops.hpp"

namespace llmk {

// WeightRef (a projection's weights in any WeightFormat): kernels/ops.hpp.

// y (m, n) [+]= x (m, k) . W^T [+ bias (n,) or null], W a WeightRef. float32 weights take
// linear<float>(..., WeightLayout::out_in, ...) and 16-bit weights linear_w16 (both
// drivers/gemm_routes.hpp: converted in registers, kernels/weight16.hpp). int8 / int4 weights go
// through drivers/qlinear.hpp's qlinear (the kernels of lk.quantized_linear): up to 16 tokens the
// codes are read in place with the tokens quantized per block of 32 (int8 activations,
// llama.cpp's q8_0), above that float activations and the packed GEMM (AVX-512: tiles
// dequantized in the cache, gemm_q). Results do not depend on the thread count.
void linear(const float* x, std::size_t m, std::size_t k, WeightRef w, std::size_t n,
            const float* bias, float* y, bool accumulate);

// SwiGLU feed-forward, (silu(x . w_gate + b_gate) * (x . w_up + b_up)) . w_down + b_down,
// weights in the functional API's (in, out) layout. x: (m, k); w_gate, w_up: (k, h); w_down:
// (h, n) or null; b_gate, b_up: (h,) or null; b_down: (n,) or null. gate, up: (m, h)
// workspaces; gate holds the hidden activation on return. out: (m, n) when w_down is given.
template <class T>
void swiglu_ffn(const T* x, std::size_t m, std::size_t k, const T* w_gate, const T* w_up,
                std::size_t h, const T* w_down, std::size_t n, const T* b_gate, const T* b_up,
                const T* b_down, T* gate, T* up, T* out);

// act (m, h) = silu(gate) * up (or, gelu_tanh: gelu_tanh(gate) * up -- GeGLU, Gemma), rows of
// gate and up with row stride ld (act: stride h); act may be gate when ld == h. The activation
// step of both feed-forwards.
template <class T>
void swiglu_rows(T* act, const T* gate, const T* up, std::size_t m, std::size_t h, std::size_t ld,
                 bool gelu_tanh = false);

}  // namespace llmk
