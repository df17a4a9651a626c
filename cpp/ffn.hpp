// SwiGLU feed-forward through BLAS: (silu(x @ w_gate + b_gate) * (x @ w_up + b_up)) @ w_down + b_down
#pragma once

#include <cstddef>

namespace llmk {

// x: (m, k); w_gate, w_up: (k, h); w_down: (h, n) or null; b_gate, b_up: (h,) or null;
// b_down: (n,) or null. gate, up: (m, h) workspaces; gate holds the hidden activation on return.
// out: (m, n) when w_down is given (otherwise unused).
template <class T>
void swiglu_ffn(const T* x, std::size_t m, std::size_t k, const T* w_gate, const T* w_up,
                std::size_t h, const T* w_down, std::size_t n, const T* b_gate, const T* b_up,
                const T* b_down, T* gate, T* up, T* out);

// C (m, n) = A (m, k) @ B (k, n), all row-major, via CBLAS.
template <class T>
void matmul(const T* a, const T* b, T* c, std::size_t m, std::size_t k, std::size_t n);

}  // namespace llmk
