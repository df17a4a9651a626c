// One declaration per op. Each functor's operator() is a template over the xsimd architecture
// tag and the element type; its body lives in the op's header (kernels/<op>.hpp) and is
// instantiated once per ISA in cpp/arch/<isa>.cpp. Call through llmk::dispatch (common/isa.hpp).
//
// Conventions (llama2.c style): out first, then inputs, then sizes. All pointers are to
// C-contiguous buffers; `out` may alias `x` exactly (never partially). Kernels assume valid input.
// `stream`: write `out` with non-temporal stores (for outputs far larger than the caches: saves
// the read-for-ownership of every output line). Only passed as true when `out` and every row
// start are aligned to the vector size (the binding checks).
#pragma once

#include <cstddef>
#include <cstdint>

namespace llmk {

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight        x, out: (rows, n); weight: (n,) or null
struct rms_norm_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* x, const T* weight, std::size_t rows, std::size_t n,
                  double eps, bool stream) const;
};

// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias    x, out: (rows, n); weight, bias: (n,) or null
struct layer_norm_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* x, const T* weight, const T* bias, std::size_t rows,
                  std::size_t n, double eps, bool stream) const;
};

// Gated = false: out = silu(x)              out, x: (n,)
// Gated = true:  out = silu(x) * up         out, x (the gate), up: (n,)
// One kernel serves both (fusion as a template flag, not a copied loop).
template <bool Gated>
struct silu_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* x, const T* up, std::size_t n, bool stream) const;
};

// Elementwise exp / sigmoid with the same vector code the activations use (for accuracy tests).
struct exp_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* x, std::size_t n) const;
};
struct sigmoid_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* x, std::size_t n) const;
};

// Rotary embedding of rows. x, out: (rows, d); table_row: (rows,) index into the tables;
// cos_tab, sin_tab: (n_table, rotary_dim / 2), already multiplied by the attention factor.
// Half-split pairs (x[i], x[i + r/2]); interleaved pairs (x[2i], x[2i+1]). Features
// [rotary_dim, d) are copied through.
struct rope_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* x, const std::int64_t* table_row, const T* cos_tab,
                  const T* sin_tab, std::size_t rows, std::size_t d, std::size_t rotary_dim,
                  bool interleaved, bool stream) const;
};

// out[r, :] += bias      (rows, n) -- used to fold biases into the BLAS matmul outputs
struct add_bias_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* bias, std::size_t rows, std::size_t n) const;
};

// Roofline probes: FMA throughput (*flops = floating-point operations done; *sink keeps the
// result alive) and a STREAM triad a = b + s * c.
struct fma_probe_kernel {
  template <class Arch>
  void operator()(Arch, std::size_t iterations, double* flops, float* sink) const;
};
struct triad_kernel {
  template <class Arch>
  void operator()(Arch, float* a, const float* b, const float* c, float s, std::size_t n) const;
};

}  // namespace llmk
