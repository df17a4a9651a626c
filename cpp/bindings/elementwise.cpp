// Bindings of the row-wise and elementwise kernels. Thin: check operands, release the GIL,
// split rows across the thread pool, dispatch to the active ISA. Public argument handling
// (dtype promotion, copies, out=) lives in python/llmkernels/_ops.py.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "bindings/common.hpp"
#include "common/isa.hpp"
#include "common/rope_tables.hpp"
#include "common/thread_pool.hpp"
#include "ffn.hpp"
#include "kernels/ops.hpp"

namespace llmk::bind {
namespace {

using opt_array = std::optional<py::array>;

// Non-temporal stores pay off when the output is much larger than the caches (each output line
// then skips its read-for-ownership). The row kernels peel a scalar head to reach vector
// alignment; rope streams only when rows and halves are 64-byte aligned (row_bytes), which holds
// for the usual head sizes since llmkernels allocates its outputs 64-byte aligned.
constexpr std::size_t kStreamBytes = std::size_t(16) << 20;

bool use_stream(const py::array& out) {
  auto addr = reinterpret_cast<std::uintptr_t>(out.data());
  return static_cast<std::size_t>(out.nbytes()) >= kStreamBytes &&
         addr % static_cast<std::uintptr_t>(out.itemsize()) == 0;
}

bool use_stream_aligned_rows(const py::array& out, std::size_t row_bytes) {
  auto addr = reinterpret_cast<std::uintptr_t>(out.data());
  return use_stream(out) && addr % 64 == 0 && row_bytes % 64 == 0;
}

// The dispatch of each op on operands already checked (by the _core entry or the fast path).
void run_rms_norm(const py::array& x, const py::array* weight, double eps, py::array& out) {
  std::size_t rows, n;
  rows_cols(x, &rows, &n);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* wp = weight ? cptr<T>(*weight) : nullptr;
    T* op = ptr<T>(out);
    const bool stream = use_stream(out);
    py::gil_scoped_release nogil;
    parallel_for(rows, 1, static_cast<double>(n), [&](std::size_t b, std::size_t e) {
      dispatch(rms_norm_kernel{}, op + b * n, xp + b * n, wp, e - b, n, eps, stream);
    });
  };
  if (is_f32(x)) run(float{}); else run(double{});
}

void rms_norm(py::array x, opt_array weight, double eps, py::array out) {
  const char* fn = "rms_norm";
  check_operand(fn, "x", x, nullptr, false);
  check_operand(fn, "out", out, &x, true);
  check_same_shape(fn, "out", out, x);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension");
  std::size_t rows, n;
  rows_cols(x, &rows, &n);
  if (weight) {
    check_operand(fn, "weight", *weight, &x, false);
    check_vector(fn, "weight", *weight, static_cast<py::ssize_t>(n));
  }
  if (!(eps >= 0.0)) fail(fn, "eps must be >= 0, got " + std::to_string(eps));
  run_rms_norm(x, weight ? &*weight : nullptr, eps, out);
}

void run_layer_norm(const py::array& x, const py::array* weight, const py::array* bias,
                    double eps, py::array& out) {
  std::size_t rows, n;
  rows_cols(x, &rows, &n);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* wp = weight ? cptr<T>(*weight) : nullptr;
    const T* bp = bias ? cptr<T>(*bias) : nullptr;
    T* op = ptr<T>(out);
    const bool stream = use_stream(out);
    py::gil_scoped_release nogil;
    parallel_for(rows, 1, 2.0 * static_cast<double>(n), [&](std::size_t b, std::size_t e) {
      dispatch(layer_norm_kernel{}, op + b * n, xp + b * n, wp, bp, e - b, n, eps, stream);
    });
  };
  if (is_f32(x)) run(float{}); else run(double{});
}

void layer_norm(py::array x, opt_array weight, opt_array bias, double eps, py::array out) {
  const char* fn = "layer_norm";
  check_operand(fn, "x", x, nullptr, false);
  check_operand(fn, "out", out, &x, true);
  check_same_shape(fn, "out", out, x);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension");
  std::size_t rows, n;
  rows_cols(x, &rows, &n);
  if (weight) {
    check_operand(fn, "weight", *weight, &x, false);
    check_vector(fn, "weight", *weight, static_cast<py::ssize_t>(n));
  }
  if (bias) {
    check_operand(fn, "bias", *bias, &x, false);
    check_vector(fn, "bias", *bias, static_cast<py::ssize_t>(n));
  }
  if (!(eps >= 0.0)) fail(fn, "eps must be >= 0, got " + std::to_string(eps));
  run_layer_norm(x, weight ? &*weight : nullptr, bias ? &*bias : nullptr, eps, out);
}

// Elementwise map over the flat array; chunk boundaries on multiples of 64 elements.
template <class Kernel>
void run_elementwise(const Kernel& kernel, const py::array& x, const py::array* up,
                     py::array& out) {
  std::size_t n = static_cast<std::size_t>(x.size());
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* up_p = up ? cptr<T>(*up) : nullptr;
    T* op = ptr<T>(out);
    const bool stream = use_stream(out);
    py::gil_scoped_release nogil;
    parallel_for(n, 64, 4.0, [&](std::size_t b, std::size_t e) {
      dispatch(kernel, op + b, xp + b, up_p ? up_p + b : nullptr, e - b, stream);
    });
  };
  if (is_f32(x)) run(float{}); else run(double{});
}

template <class Kernel>
void elementwise(const char* fn, const Kernel& kernel, py::array x, opt_array up, py::array out) {
  check_operand(fn, "x", x, nullptr, false);
  check_operand(fn, "out", out, &x, true);
  check_same_shape(fn, "out", out, x);
  if (up) {
    check_operand(fn, "up", *up, &x, false);
    check_same_shape(fn, "up", *up, x);
  }
  run_elementwise(kernel, x, up ? &*up : nullptr, out);
}

// exp / sigmoid kernels have no `up` operand: adapt their signature to elementwise().
template <class Kernel>
struct unary_adapter {
  template <class Arch, class T>
  void operator()(Arch a, T* out, const T* x, const T*, std::size_t n, bool) const {
    Kernel{}(a, out, x, n);
  }
};

// cos/sin tables (P, half) for positions (P,) int64 and inv_freq (half,) float64: the angle
// pos * inv_freq is formed and reduced in double (exact for positions up to 2^53), then
// cos/sin are scaled by attention_factor and rounded to the output dtype.
py::tuple rope_tables(py::array_t<std::int64_t, py::array::c_style> positions,
                      py::array_t<double, py::array::c_style> inv_freq, double attention_factor,
                      py::dtype dtype) {
  const char* fn = "rope";
  if (positions.ndim() != 1) fail(fn, "positions table must be 1-D");
  if (inv_freq.ndim() != 1) fail(fn, "inv_freq must be 1-D");
  std::size_t p = static_cast<std::size_t>(positions.shape(0));
  std::size_t half = static_cast<std::size_t>(inv_freq.shape(0));
  auto build = [&](auto tag) {
    using T = decltype(tag);
    py::array_t<T> cos_tab({p, half}), sin_tab({p, half});
    const std::int64_t* pos = positions.data();
    const double* f = inv_freq.data();
    T* c = cos_tab.mutable_data();
    T* s = sin_tab.mutable_data();
    {
      py::gil_scoped_release nogil;
      parallel_for(p, 1, 40.0 * static_cast<double>(half), [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i)
          rope_table_row(pos[i], f, half, attention_factor, c + i * half, s + i * half);
      });
    }
    return py::make_tuple(cos_tab, sin_tab);
  };
  if (same_dtype(dtype, py::dtype::of<float>())) return build(float{});
  if (same_dtype(dtype, py::dtype::of<double>())) return build(double{});
  throw py::type_error("[rope] dtype must be float32 or float64");
}

// rows of x (..., d) rotated with table row table_row[r] for row r
void run_rope(const py::array& x, const std::int64_t* tr, const py::array& cos_tab,
              const py::array& sin_tab, std::size_t rotary_dim, bool interleaved,
              py::array& out) {
  std::size_t rows, d;
  rows_cols(x, &rows, &d);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* cp = cptr<T>(cos_tab);
    const T* sp = cptr<T>(sin_tab);
    T* op = ptr<T>(out);
    // streamed stores at o + i and o + half + i: both row starts and halves must be aligned
    const bool stream = !interleaved && rotary_dim == d &&
                        use_stream_aligned_rows(out, d * sizeof(T)) &&
                        (rotary_dim / 2 * sizeof(T)) % 64 == 0;
    py::gil_scoped_release nogil;
    parallel_for(rows, 1, static_cast<double>(d), [&](std::size_t b, std::size_t e) {
      dispatch(rope_kernel{}, op + b * d, xp + b * d, tr + b, cp, sp, e - b, d, rotary_dim,
               interleaved, stream);
    });
  };
  if (is_f32(x)) run(float{}); else run(double{});
}

void rope(py::array x, py::array_t<std::int64_t, py::array::c_style> table_row, py::array cos_tab,
          py::array sin_tab, std::size_t rotary_dim, bool interleaved, py::array out) {
  const char* fn = "rope";
  check_operand(fn, "x", x, nullptr, false);
  check_operand(fn, "out", out, &x, true);
  check_same_shape(fn, "out", out, x);
  check_operand(fn, "cos", cos_tab, &x, false);
  check_operand(fn, "sin", sin_tab, &x, false);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension");
  std::size_t rows, d;
  rows_cols(x, &rows, &d);
  if (rotary_dim % 2 != 0 || rotary_dim > d) fail(fn, "rotary_dim must be even and <= D");
  std::size_t half = rotary_dim / 2;
  if (cos_tab.ndim() != 2 || cos_tab.shape(1) != static_cast<py::ssize_t>(half))
    fail(fn, "cos table must have shape (P, rotary_dim/2)");
  check_same_shape(fn, "sin", sin_tab, cos_tab);
  if (table_row.ndim() != 1 || table_row.shape(0) != static_cast<py::ssize_t>(rows))
    fail(fn, "table_row must have one entry per row");
  const std::int64_t* tr = table_row.data();
  const std::int64_t n_tab = cos_tab.shape(0);
  for (std::size_t r = 0; r < rows; ++r)
    if (tr[r] < 0 || tr[r] >= n_tab) fail(fn, "table_row entry out of range");
  run_rope(x, tr, cos_tab, sin_tab, rotary_dim, interleaved, out);
}

// x (m, k); w_gate, w_up (k, h); w_down (h, n) or None; biases optional. Returns (m, n), or the
// hidden activation (m, h) when w_down is None.
py::array swiglu_ffn(py::array x, py::array w_gate, py::array w_up, opt_array w_down,
                     opt_array b_gate, opt_array b_up, opt_array b_down) {
  const char* fn = "swiglu_ffn";
  check_operand(fn, "x", x, nullptr, false);
  if (x.ndim() != 2) fail(fn, "x must be 2-D (m, k)");
  check_operand(fn, "w_gate", w_gate, &x, false);
  check_operand(fn, "w_up", w_up, &x, false);
  py::ssize_t m = x.shape(0), k = x.shape(1);
  if (w_gate.ndim() != 2 || w_gate.shape(0) != k) fail(fn, "w_gate must have shape (in, hidden)");
  py::ssize_t h = w_gate.shape(1);
  check_same_shape(fn, "w_up", w_up, w_gate);
  py::ssize_t n = 0;
  if (w_down) {
    check_operand(fn, "w_down", *w_down, &x, false);
    if (w_down->ndim() != 2 || w_down->shape(0) != h)
      fail(fn, "w_down must have shape (hidden, out)");
    n = w_down->shape(1);
  }
  if (b_gate) { check_operand(fn, "b_gate", *b_gate, &x, false); check_vector(fn, "b_gate", *b_gate, h); }
  if (b_up) { check_operand(fn, "b_up", *b_up, &x, false); check_vector(fn, "b_up", *b_up, h); }
  if (b_down) {
    if (!w_down) fail(fn, "b_down given without w_down");
    check_operand(fn, "b_down", *b_down, &x, false);
    check_vector(fn, "b_down", *b_down, n);
  }
  auto run = [&](auto tag) -> py::array {
    using T = decltype(tag);
    py::array_t<T> gate({m, h}), up({m, h});
    py::array_t<T> out({w_down ? m : py::ssize_t(0), n});
    const T* xp = cptr<T>(x);
    const T* wg = cptr<T>(w_gate);
    const T* wu = cptr<T>(w_up);
    const T* wd = cptr_or_null<T>(w_down);
    const T* bg = cptr_or_null<T>(b_gate);
    const T* bu = cptr_or_null<T>(b_up);
    const T* bd = cptr_or_null<T>(b_down);
    T* gp = gate.mutable_data();
    T* upp = up.mutable_data();
    T* op = out.mutable_data();
    {
      py::gil_scoped_release nogil;
      llmk::swiglu_ffn<T>(xp, m, k, wg, wu, h, wd, n, bg, bu, bd, gp, upp, op);
    }
    if (w_down) return out;
    return gate;
  };
  return is_f32(x) ? run(float{}) : run(double{});
}


// ---------------------------------------------------------------------------------------------
// fast paths (see common.hpp): the result, or None for the Python conversion path

// The public checks of the four ops, with the messages of the Python layer (the order is the
// Python layer's too: conversion errors there first, then these). All operands are plain
// arrays of one kind by now; `out` is checked here whatever it is.

// eps: a real number (not a bool), representable as a float, finite and >= 0
double public_eps(const char* fn, py::handle h) {
  if (!PyFloat_CheckExact(h.ptr())) {
    static py::handle real = py::object(py::module_::import("numbers").attr("Real")).release();
    if (PyBool_Check(h.ptr()) || !py::isinstance(h, real))
      throw py::type_error(std::string("[") + fn + "] eps must be a real number, got " +
                           py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>());
  }
  double v = PyFloat_AsDouble(h.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw py::error_already_set();
    PyErr_Clear();
    fail(fn, "eps must be finite (got an integer beyond float range)");
  }
  if (!(v >= 0.0) || !std::isfinite(v))
    fail(fn, "eps must be a finite number >= 0, got " +
                 py::repr(py::float_(v)).cast<std::string>());
  return v;
}

// out: None (a new array of like's shape and dtype), or an ndarray of like's dtype and shape,
// C-contiguous and writeable
py::array public_out(const char* fn, py::handle out_h, const py::array& like) {
  if (out_h.is_none())
    return is_f32(like) ? new_output<float>(shape_of(like)) : new_output<double>(shape_of(like));
  if (!py::isinstance<py::array>(out_h))
    throw py::type_error(std::string("[") + fn + "] out must be a numpy.ndarray, got " +
                         py::str(py::type::handle_of(out_h).attr("__name__")).cast<std::string>());
  auto out = py::reinterpret_borrow<py::array>(out_h);
  if (!same_dtype(out.dtype(), like.dtype()))
    throw py::type_error(std::string("[") + fn + "] out must have dtype " +
                         std::string(py::str(like.dtype())) + ", got " +
                         std::string(py::str(out.dtype())));
  if (!same_shape(out, like))
    fail(fn, "out must have shape " + shape_str(like) + ", got " + shape_str(out));
  if (!(out.flags() & py::array::c_style)) fail(fn, "out must be C-contiguous");
  if (!out.writeable()) fail(fn, "out must be writeable (got a read-only array)");
  return out;
}

// a (n,) vector operand of a row-wise op
void public_vector(const char* fn, const char* name, const py::array& a, py::ssize_t n) {
  if (a.ndim() != 1 || a.shape(0) != n)
    fail(fn, std::string(name) + " must have shape (" + std::to_string(n) + ",), got " +
                 shape_str(a));
}

// The public entries of rms_norm, layer_norm, silu and swiglu: None when an operand needs the
// Python layer's conversion (array-likes, other/mixed dtypes, byte order, strides) or overlaps
// `out` other than as allowed (the Python layer copies it); otherwise the arguments are checked
// (ValueError/TypeError with the public messages) and the result computed.

// the operands (null handles skipped) are plain arrays of one kind; that kind, or 0
int plain_operands(std::initializer_list<py::handle> hs) {
  int kind = 0;
  for (py::handle h : hs) {
    if (!h || h.is_none()) continue;
    int k = plain_kind(h);
    if (!k || (kind && k != kind)) return 0;
    kind = k;
  }
  return kind;
}

py::object fast_rms_norm(py::handle x_h, py::handle w_h, py::handle eps_h, py::handle out_h) {
  const char* fn = "rms_norm";
  if (!plain_operands({x_h, w_h})) return py::none();
  auto x = py::reinterpret_borrow<py::array>(x_h);
  const double eps = public_eps(fn, eps_h);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension, got a 0-d array");
  const py::ssize_t n = x.shape(x.ndim() - 1);
  std::optional<py::array> w;
  if (!w_h.is_none()) {
    w = py::reinterpret_borrow<py::array>(w_h);
    public_vector(fn, "weight", *w, n);
  }
  py::array out = public_out(fn, out_h, x);
  // x may be out exactly (rows are read before written); the weight must not overlap it
  if ((overlaps(x, out) && x.data() != out.data()) || (w && overlaps(*w, out)))
    return py::none();
  if (x.size()) run_rms_norm(x, w ? &*w : nullptr, eps, out);
  return std::move(out);
}

py::object fast_layer_norm(py::handle x_h, py::handle w_h, py::handle b_h, py::handle eps_h,
                           py::handle out_h) {
  const char* fn = "layer_norm";
  if (!plain_operands({x_h, w_h, b_h})) return py::none();
  auto x = py::reinterpret_borrow<py::array>(x_h);
  const double eps = public_eps(fn, eps_h);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension, got a 0-d array");
  const py::ssize_t n = x.shape(x.ndim() - 1);
  std::optional<py::array> vec[2];
  const py::handle hs[2] = {w_h, b_h};
  const char* names[2] = {"weight", "bias"};
  for (int i = 0; i < 2; ++i) {
    if (hs[i].is_none()) continue;
    vec[i] = py::reinterpret_borrow<py::array>(hs[i]);
    public_vector(fn, names[i], *vec[i], n);
  }
  py::array out = public_out(fn, out_h, x);
  if ((overlaps(x, out) && x.data() != out.data()) || (vec[0] && overlaps(*vec[0], out)) ||
      (vec[1] && overlaps(*vec[1], out)))
    return py::none();
  if (x.size())
    run_layer_norm(x, vec[0] ? &*vec[0] : nullptr, vec[1] ? &*vec[1] : nullptr, eps, out);
  return std::move(out);
}

// silu (no up) and swiglu; each input may be `out` exactly (elements read before written)
template <class Kernel>
py::object fast_elementwise(const char* fn, const Kernel& kernel, py::handle x_h, py::handle up_h,
                            py::handle out_h) {
  if (!plain_operands({x_h, up_h})) return py::none();
  auto x = py::reinterpret_borrow<py::array>(x_h);
  std::optional<py::array> up;
  if (up_h) {
    up = py::reinterpret_borrow<py::array>(up_h);
    if (!same_shape(*up, x))
      fail(fn, "up must have the shape of gate " + shape_str(x) + ", got " + shape_str(*up));
  }
  py::array out = public_out(fn, out_h, x);
  if ((overlaps(x, out) && x.data() != out.data()) ||
      (up && overlaps(*up, out) && up->data() != out.data()))
    return py::none();
  if (x.size()) run_elementwise(kernel, x, up ? &*up : nullptr, out);
  return std::move(out);
}

// rope with the default positions (arange(T)) and rotary_dim = D: cos/sin are the (T, D/2)
// tables _ops.rope cached for this (T, D, theta, attention_factor, dtype); row r of x (..., T, D)
// uses table row r % T.
py::object fast_rope(py::handle x_h, py::handle cos_h, py::handle sin_h, py::handle inter_h,
                     py::handle out_h) {
  const int kind = plain_kind(x_h);
  if (!kind || plain_kind(cos_h) != kind || plain_kind(sin_h) != kind) return py::none();
  if (inter_h.ptr() != Py_True && inter_h.ptr() != Py_False) return py::none();
  const bool interleaved = inter_h.ptr() == Py_True;
  auto x = py::reinterpret_borrow<py::array>(x_h);
  auto c = py::reinterpret_borrow<py::array>(cos_h), s = py::reinterpret_borrow<py::array>(sin_h);
  if (x.ndim() < 2) return py::none();
  const py::ssize_t t = x.shape(x.ndim() - 2), d = x.shape(x.ndim() - 1);
  if (d % 2 || c.ndim() != 2 || c.shape(0) != t || c.shape(1) * 2 != d || !same_shape(c, s))
    return py::none();
  py::array out;
  if (out_h.is_none()) {
    out = kind == 1 ? new_output<float>(shape_of(x)) : new_output<double>(shape_of(x));
  } else {
    if (!plain_out(out_h, kind, x)) return py::none();
    out = py::reinterpret_borrow<py::array>(out_h);
    if ((overlaps(x, out) && x.data() != out.data()) || overlaps(c, out) || overlaps(s, out))
      return py::none();
  }
  if (x.size() == 0 || d == 0) {
    if (x.size() && out.data() != x.data())
      std::memcpy(out.mutable_data(), x.data(), static_cast<std::size_t>(x.nbytes()));
    return std::move(out);
  }
  const std::size_t rows = static_cast<std::size_t>(x.size() / d);
  std::vector<std::int64_t> table_row(rows);
  for (std::size_t r = 0; r < rows; ++r) table_row[r] = static_cast<std::int64_t>(r % t);
  run_rope(x, table_row.data(), c, s, static_cast<std::size_t>(d), interleaved, out);
  return std::move(out);
}

}  // namespace

void bind_elementwise(py::module_& m) {
  using namespace pybind11::literals;
  m.def("rms_norm", &rms_norm, "x"_a, "weight"_a, "eps"_a, "out"_a,
        "RMSNorm over the last axis into `out` (C-contiguous operands of one float dtype).");
  m.def("layer_norm", &layer_norm, "x"_a, "weight"_a, "bias"_a, "eps"_a, "out"_a,
        "LayerNorm (biased variance) over the last axis into `out`.");
  m.def("silu", [](py::array x, py::array out) {
        elementwise("silu", silu_kernel<false>{}, x, std::nullopt, out); },
        "x"_a, "out"_a, "out = x * sigmoid(x), elementwise.");
  m.def("swiglu", [](py::array gate, py::array up, py::array out) {
        elementwise("swiglu", silu_kernel<true>{}, gate, up, out); },
        "gate"_a, "up"_a, "out"_a, "out = silu(gate) * up, elementwise.");
  m.def("_exp", [](py::array x, py::array out) {
        elementwise("exp", unary_adapter<exp_kernel>{}, x, std::nullopt, out); },
        "x"_a, "out"_a, "The vectorized exp the kernels use (subnormal results flushed to 0).");
  m.def("_sigmoid", [](py::array x, py::array out) {
        elementwise("sigmoid", unary_adapter<sigmoid_kernel>{}, x, std::nullopt, out); },
        "x"_a, "out"_a, "The vectorized sigmoid the kernels use.");
  m.def("rope_tables", &rope_tables, "positions"_a, "inv_freq"_a, "attention_factor"_a, "dtype"_a,
        "cos/sin tables (P, len(inv_freq)) for int64 positions (P,), angles in float64.");
  m.def("rope", &rope, "x"_a, "table_row"_a, "cos"_a, "sin"_a, "rotary_dim"_a, "interleaved"_a,
        "out"_a, "Rotate rows of x (..., D) using table row table_row[r] for row r.");
  m.def("swiglu_ffn", &swiglu_ffn, "x"_a, "w_gate"_a, "w_up"_a, "w_down"_a, "b_gate"_a, "b_up"_a,
        "b_down"_a, "SwiGLU feed-forward on 2-D x through BLAS.");
  m.def("_fast_rms_norm", &fast_rms_norm, "x"_a, "weight"_a, "eps"_a, "out"_a,
        "rms_norm's common case in C++, or None (see llmkernels._ops).");
  m.def("_fast_layer_norm", &fast_layer_norm, "x"_a, "weight"_a, "bias"_a, "eps"_a, "out"_a,
        "layer_norm's common case in C++, or None.");
  m.def("_fast_silu", [](py::handle x, py::handle out) {
        return fast_elementwise("silu", silu_kernel<false>{}, x, py::handle(), out); },
        "x"_a, "out"_a, "silu's common case in C++, or None.");
  m.def("_fast_swiglu", [](py::handle gate, py::handle up, py::handle out) {
        return fast_elementwise("swiglu", silu_kernel<true>{}, gate, up, out); },
        "gate"_a, "up"_a, "out"_a, "swiglu's common case in C++, or None.");
  m.def("_fast_rope", &fast_rope, "x"_a, "cos"_a, "sin"_a, "interleaved"_a, "out"_a,
        "rope's common case (default positions, full rotary_dim, cached tables), or None.");
}

}  // namespace llmk::bind
