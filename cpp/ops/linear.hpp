// The projection path: y = x . W (+ bias), the one function behind every matrix product of the
// package -- the functional swiglu_ffn's three projections and every projection of the modules
// (cpp/modules: QKV, O, the feed-forward's gate/up and down, the LM head).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.hpp"

namespace llmk {

// How W is stored: (n, k) row-major as HF checkpoints store projections (y = x . W^T), or
// (k, n) row-major as the functional API takes it (y = x . W).
enum class WeightLayout { out_in, in_out };

// y (m, n) [+]= x (m, k) . W [+ bias (n,) or null]; y has row stride n. accumulate: add to y
// instead of overwriting it. Work is split into blocks chosen from the shape only (each one
// single-threaded BLAS call or kernel call), so results do not depend on the thread count.
// The bias is added where y is written: in the final stores of the gemv / gemm_xt kernels, or
// as the C operand (beta = 1) of each BLAS block, written just before the block's call.
template <class T>
void linear(const T* x, std::size_t m, std::size_t k, const T* w, WeightLayout layout,
            std::size_t n, const T* bias, T* y, bool accumulate);

// Which matrix product linear<T> uses. automatic picks by shape (the crossovers measured in
// benchmarks/bench_gemm.py, ops/linear.cpp); the others force one product wherever it applies
// (tests sweep them; the benchmark compares them in one run): blas = OpenBLAS sgemm/dgemm in
// blocks of rows (or of columns for few rows), packed = gemm_packed_kernel (both operands
// packed), tokens = gemm_xt_kernel (x packed, (out, in) weights read in place; (in, out)
// weights take the automatic choice). Process-wide; not for concurrent use with other calls.
enum class GemmRoute : int { automatic = 0, blas = 1, packed = 2, tokens = 3 };
void set_gemm_route(GemmRoute route);
GemmRoute gemm_route();

// WeightRef (a projection's weights in any WeightFormat): kernels/ops.hpp.

// y (m, n) [+]= x (m, k) . W^T [+ bias (n,) or null], W a WeightRef. float32 weights take
// linear<float>(..., WeightLayout::out_in, ...) above; 16-bit weights are converted in registers
// (kernels/weight16.hpp): matrix-vector products up to 8 tokens, above that the packed GEMM with
// a converting weight pack (gemm_packed_w_kernel, kernels/gemm_packed_w.hpp: the float32
// kernel's bits on the widened matrix; on AVX-512, not measured there yet, packed tokens
// (gemm_xt_w16) below 512 and widened blocks for the BLAS from 512). int8 / int4 weights go
// through ops/quant.hpp's qlinear (the kernels of lk.quantized_linear): up to 16 tokens the
// codes are read in place with the tokens quantized per block of 32 (int8 activations,
// llama.cpp's q8_0), above that float activations and the packed GEMM (AVX-512: tiles
// dequantized in the cache, gemm_q). Results do not depend on the thread count.
void linear(const float* x, std::size_t m, std::size_t k, WeightRef w, std::size_t n,
            const float* bias, float* y, bool accumulate);

// Whether a projection of m tokens with weights in `format` (16-bit or quantized, float
// activations) takes the packed GEMM (the route, the ISA and m decide; never up to 8 tokens), and
// that product itself: y (m, n) [+]= x (m, k) . W^T [+ bias], W (n, k) any WeightRef (for
// ops/quant.cpp's qlinear). Results do not depend on the thread count.
bool packed_route_w(std::size_t m, WeightFormat format);
void linear_packed_w(const float* x, std::size_t m, std::size_t k, const WeightRef& w,
                     std::size_t n, const float* bias, float* y, bool accumulate);

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
