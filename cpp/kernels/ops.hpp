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

// --- attention -----------------------------------------------------------------------------
// Tiles: up to kAttnRowTile query rows (of one KV head's group) against kAttnKeyTile keys.
constexpr std::size_t kAttnRowTile = 64;
constexpr std::size_t kAttnKeyTile = 64;

// Dv rounded up to a multiple of 64 bytes' worth of elements (a whole number of vectors on
// every ISA).
template <class T>
constexpr std::size_t attn_dv_pad_t(std::size_t dv) {
  constexpr std::size_t e = 64 / sizeof(T);
  return (dv + e - 1) / e * e;
}

template <class T>
struct attn_params {
  const T* q;  // (B, Hq, Tq, D)   element (b, h, i, :) at q + b*qs[0] + h*qs[1] + i*qs[2]
  const T* k;  // (B, Hkv, Tk, D)  likewise with ks
  const T* v;  // (B, Hkv, Tk, Dv) likewise with vs
  T* out;      // (B, Hq, Tq, Dv)  likewise with os
  T* weights;  // (B, Hq, Tq, Tk) C-contiguous, or null
  std::size_t b, hq, hkv, tq, tk, d, dv;
  // (batch, head, row) strides in elements; the last axis is contiguous. They let a module read
  // q/k/v straight from a fused projection output or a KV cache and write (B, T, H*Dv) rows.
  std::size_t qs[3], ks[3], vs[3], os[3];
  // score multiplier, in double whatever T: a scale outside T's normal range (1e-50, 1e40 in
  // float32) must still give the float64 reference's answer (the driver then runs the exact path)
  double scale;
  bool causal;             // bottom-right aligned: query i sees key j iff j <= i + Tk - Tq
  int mask_kind;           // 0 none, 1 bool (uint8, nonzero = may attend), 2 additive (T)
  const void* mask;        // broadcast view of (B, Hq, Tq, Tk)
  std::int64_t mask_strides[4];  // in elements; 0 on broadcast axes
};

// One work item: rows [row0, row0 + nrows) of KV head g's group (rows are (h, i) pairs,
// h-major) in batch b, against keys [k0, k1).
struct attn_item {
  std::size_t b, g, row0, nrows, k0, k1;
};

// Elements of scratch one item needs (per thread).
template <class T>
constexpr std::size_t attn_workspace_size(std::size_t d, std::size_t dv) {
  return d * kAttnRowTile + kAttnKeyTile * kAttnRowTile +
         (kAttnRowTile + kAttnKeyTile) * attn_dv_pad_t<T>(dv) + 3 * kAttnRowTile;
}

// Runs one item. part_o == null: writes the normalised rows to p.out (and p.weights);
// otherwise writes the unnormalised running state (m, l: (nrows,), O: (nrows, dv_pad)) for a
// later merge of key splits. flags (nrows,): per row, kAttnNonFinite when a score of the row
// was +inf or NaN (the running max is +inf or the running sum NaN), kAttnAllNegInf when the row
// had keys it may attend but every score of them was -inf. Both can come from scores that
// overflow T while the float64 reference's stay finite; the driver recomputes such rows exactly
// (attention_row_exact).
constexpr std::uint8_t kAttnNonFinite = 1, kAttnAllNegInf = 2;
struct attention_tile_kernel {
  template <class Arch, class T>
  void operator()(Arch, const attn_params<T>& p, const attn_item& it, T* workspace, T* part_m,
                  T* part_l, T* part_o, std::uint8_t* flags) const;
};

// out[r, :] += bias      (rows, n) -- used to fold biases into the BLAS matmul outputs
struct add_bias_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* out, const T* bias, std::size_t rows, std::size_t n) const;
};

// y[t, r] (+)= dot(w[r, :], x[t, :]) (+ bias[r])   y (m, rows) row stride ldy, w (rows, k)
// row-major, x (m, k) row stride ldx, bias (rows,) or null -- decode projections (one token, or
// a few); the bias is added in the final store
struct gemv_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* y, std::size_t ldy, const T* w, const T* x, std::size_t ldx,
                  std::size_t m, std::size_t rows, std::size_t k, bool accumulate,
                  const T* bias) const;
};

// y (m, n) (+)= x (m, k) . w (n, k)^T (+ bias) for a few dozen tokens (prefill projections), x
// given packed by pack_panels: xt[(p * k + kk) * kGemmPanel + i] = x[p * kGemmPanel + i, kk],
// zero past row m. y has row stride ldy; bias (n,) or null, added in the final store.
constexpr std::size_t kGemmPanel = 64;
struct gemm_xt_kernel {
  template <class Arch, class T>
  void operator()(Arch, T* y, std::size_t ldy, const T* xt, std::size_t m, const T* w,
                  std::size_t n, std::size_t k, bool accumulate, const T* bias) const;
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
