// The Python-facing entry of each op (cpp/ops/<op>.cpp): it checks the operands (ValueError /
// TypeError, messages starting "[op] " and naming the argument), allocates the output, releases
// the GIL, splits the work over the thread pool and dispatches the kernel (kernels/<op>.hpp).
// The bindings (cpp/bindings/<op>.cpp) only m.def these. Entry::fast entries return None when
// an operand needs the Python layer's conversion (array-likes, dtype promotion, strides, `out`
// overlapping an input); see common.hpp.
#pragma once

#include "ops/common.hpp"

namespace llmk::ops {

// ops/rms_norm.cpp, ops/layer_norm.cpp: out = norm(x) over the last axis
py::object rms_norm(py::handle x, py::handle weight, py::handle eps, py::handle out, Entry entry);
py::object layer_norm(py::handle x, py::handle weight, py::handle bias, py::handle eps,
                      py::handle out, Entry entry);

// ops/silu.cpp: elementwise maps (up: only for swiglu, else a null handle)
enum class Elementwise { silu, swiglu, exp, sigmoid };
py::object elementwise(Elementwise op, py::handle x, py::handle up, py::handle out, Entry entry);

// ops/rope.cpp
py::tuple rope_tables(py::array_t<std::int64_t, py::array::c_style> positions,
                      py::array_t<double, py::array::c_style> inv_freq, double attention_factor,
                      py::dtype dtype);
void rope(py::array x, py::array_t<std::int64_t, py::array::c_style> table_row, py::array cos_tab,
          py::array sin_tab, std::size_t rotary_dim, bool interleaved, py::array out);
py::object fast_rope(py::handle x, py::handle positions, py::handle theta, py::handle inv_freq,
                     py::handle interleaved, py::handle rotary_dim, py::handle attention_factor,
                     py::handle out, py::handle tables);

// ops/attention.cpp
py::object attention(py::handle q, py::handle k, py::handle v, py::handle causal, py::handle scale,
                     py::handle out, py::handle mask, py::handle window, py::handle softcap,
                     py::handle sinks, py::handle return_weights, py::handle return_lse,
                     Entry entry);

// ops/swiglu_ffn.cpp
py::array swiglu_ffn(py::array x, py::array w_gate, py::array w_up, std::optional<py::array> w_down,
                     std::optional<py::array> b_gate, std::optional<py::array> b_up,
                     std::optional<py::array> b_down);

// ops/runtime.cpp: the checked setters of the thread count and the SIMD path; roofline probes
// (GFLOP/s of FMA, GB/s of a STREAM triad and of reading only; the bf16 / int8 dot-product
// instructions' peaks, G operations/s, where the CPU has them)
void set_threads(long long n);
void set_simd_arch(const std::string& name);
double probe_fma_gflops(int threads, std::size_t iterations);
double probe_triad_gbs(int threads, std::size_t n, int repeats);
double probe_read_gbs(int threads, std::size_t n, int repeats);
double probe_dot_gops(const std::string& instruction, int threads, std::size_t iterations);
// family name -> the SIMD path that kernel family runs now (common/isa.hpp's Family)
py::dict family_simd_archs();
// drivers/gemm_routes.hpp's GemmRoute by name (auto, blas, packed, tokens); returns the previous
// one's name (tests, bench_gemm.py)
std::string set_gemm_route_by_name(const std::string& name);

// ops/quant.cpp: group-wise int8 / int4 weights (format: kernels/quant.hpp)
py::tuple quantize(py::array w, long long bits, long long group_size);
py::array dequantize(py::array q, py::array scales, long long bits, long long group_size);
py::array quantized_linear(py::array x, py::array q, py::array scales, long long bits,
                           long long group_size, std::optional<py::array> bias,
                           const std::string& activations);

}  // namespace llmk::ops
