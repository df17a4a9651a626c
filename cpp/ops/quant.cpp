// quantize / dequantize / quantized_linear: the Python entries of the group-wise int8 and int4
// weights (format: kernels/quant.hpp, docs/quantization.md) -- operands checked, outputs
// allocated, the GIL released -- around the drivers of drivers/qlinear.hpp.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "drivers/qlinear.hpp"
#include "kernels/quant_types.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {
namespace {

int check_bits(const char* fn, long long bits) {
  if (bits != 4 && bits != 8) fail(fn, "bits must be 4 or 8, got " + std::to_string(bits));
  return static_cast<int>(bits);
}

std::size_t check_group(const char* fn, long long g) {
  if (g != 32 && g != 64 && g != 128)
    fail(fn, "group_size must be 32, 64 or 128, got " + std::to_string(g));
  return static_cast<std::size_t>(g);
}

void check_dtype(const char* fn, const char* name, const py::array& a, const py::dtype& dt,
                 const char* dt_name) {
  if (!same_dtype(a.dtype(), dt))
    throw py::type_error(std::string("[") + fn + "] " + name + " has dtype " +
                         std::string(py::str(a.dtype())) + ", expected " + dt_name);
  if (!(a.flags() & py::array::c_style)) fail(fn, std::string(name) + " must be C-contiguous");
}

py::dtype float16_dtype() { return py::dtype("float16"); }

// The checked quantized matrix (q, scales): its rows and k.
qweights check_qweights(const char* fn, const py::array& q, const py::array& scales, int bits,
                        std::size_t group) {
  if (bits == 8)
    check_dtype(fn, "q", q, py::dtype::of<std::int8_t>(), "int8 (bits=8)");
  else
    check_dtype(fn, "q", q, py::dtype::of<std::uint8_t>(), "uint8 (bits=4: two codes a byte)");
  check_dtype(fn, "scales", scales, float16_dtype(), "float16");
  if (q.ndim() != 2)
    fail(fn, "q must have shape (rows, " + std::string(bits == 8 ? "k" : "k / 2") + "), got " +
                 shape_str(q));
  const std::size_t rows = static_cast<std::size_t>(q.shape(0));
  const std::size_t k = static_cast<std::size_t>(q.shape(1)) * (bits == 8 ? 1 : 2);
  if (k % group != 0)
    fail(fn, "q's shape " + shape_str(q) + " gives k = " + std::to_string(k) +
                 ", not a multiple of group_size = " + std::to_string(group));
  if (scales.ndim() != 2 || static_cast<std::size_t>(scales.shape(0)) != rows ||
      static_cast<std::size_t>(scales.shape(1)) != k / group)
    fail(fn, "scales must have shape (" + std::to_string(rows) + ", " + std::to_string(k / group) +
                 ") for q " + shape_str(q) + " and group_size " + std::to_string(group) + ", got " +
                 shape_str(scales));
  return qweights{static_cast<const std::uint8_t*>(q.data()),
                  static_cast<const std::uint16_t*>(scales.data()), rows, k, group};
}}  // namespace

py::tuple quantize(py::array w, long long bits_arg, long long group_arg) {
  const char* fn = "quantize";
  const int bits = check_bits(fn, bits_arg);
  const std::size_t group = check_group(fn, group_arg);
  check_dtype(fn, "w", w, py::dtype::of<float>(), "float32");
  if (w.ndim() != 2) fail(fn, "w must have shape (rows, k), got " + shape_str(w));
  const std::size_t rows = static_cast<std::size_t>(w.shape(0));
  const std::size_t k = static_cast<std::size_t>(w.shape(1));
  if (k % group != 0)
    fail(fn, "w's k = " + std::to_string(k) + " (shape " + shape_str(w) +
                 ") must be a multiple of group_size = " + std::to_string(group));
  py::array q = bits == 8 ? py::array(py::array_t<std::int8_t>({rows, k}))
                          : py::array(py::array_t<std::uint8_t>({rows, k / 2}));
  py::array scales(float16_dtype(), std::vector<py::ssize_t>{static_cast<py::ssize_t>(rows),
                                                             static_cast<py::ssize_t>(k / group)});
  const float* wp = static_cast<const float*>(w.data());
  auto* qp = static_cast<std::uint8_t*>(q.mutable_data());
  auto* sp = static_cast<std::uint16_t*>(scales.mutable_data());
  QuantStatus st;
  {
    py::gil_scoped_release nogil;
    st = quantize_rows(wp, rows, k, group, bits, qp, sp);
  }
  if (st.code) fail(fn, quant_status_message(st, bits));
  return py::make_tuple(q, scales);
}

py::array dequantize(py::array q, py::array scales, long long bits_arg, long long group_arg) {
  const char* fn = "dequantize";
  const int bits = check_bits(fn, bits_arg);
  const std::size_t group = check_group(fn, group_arg);
  const qweights w = check_qweights(fn, q, scales, bits, group);
  py::array_t<float> out({w.rows, w.k});
  float* op = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    dequantize_rows(w, bits, op);
  }
  return std::move(out);
}

py::array quantized_linear(py::array x, py::array q, py::array scales, long long bits_arg,
                           long long group_arg, std::optional<py::array> bias,
                           const std::string& activations) {
  const char* fn = "quantized_linear";
  const int bits = check_bits(fn, bits_arg);
  const std::size_t group = check_group(fn, group_arg);
  const qweights w = check_qweights(fn, q, scales, bits, group);
  if (activations != "float32" && activations != "int8")
    fail(fn, "activations must be 'float32' or 'int8', got '" + activations + "'");
  check_dtype(fn, "x", x, py::dtype::of<float>(), "float32");
  if (x.ndim() != 2 || static_cast<std::size_t>(x.shape(1)) != w.k)
    fail(fn, "x must have shape (m, " + std::to_string(w.k) + ") for q " + shape_str(q) + ", got " +
                 shape_str(x));
  if (bias) {
    check_dtype(fn, "bias", *bias, py::dtype::of<float>(), "float32");
    check_vector(fn, "bias", *bias, static_cast<py::ssize_t>(w.rows));
  }
  const std::size_t m = static_cast<std::size_t>(x.shape(0));
  py::array_t<float> out({m, w.rows});
  if (m == 0 || w.rows == 0) return std::move(out);
  const float* xp = static_cast<const float*>(x.data());
  const float* bp = bias ? static_cast<const float*>(bias->data()) : nullptr;
  float* yp = out.mutable_data();
  if (w.k == 0) {  // an empty sum: the bias (or zeros), as x @ W.T + b with k = 0
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < w.rows; ++j) yp[i * w.rows + j] = bp ? bp[j] : 0.0f;
    return std::move(out);
  }
  const bool int8_acts = activations == "int8";
  {
    py::gil_scoped_release nogil;
    qlinear(xp, m, w, bits, bp, yp, false, int8_acts);
  }
  return std::move(out);
}

}  // namespace llmk::ops
