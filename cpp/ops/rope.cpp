// rope: rotary position embedding of rows (kernels/rope.hpp); cos/sin tables built in
// common/rope_tables.hpp (shared with the attention module)
#include <cstring>
#include <vector>

#include "common/isa.hpp"
#include "common/rope_tables.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"
#include "ops/ops.hpp"

namespace llmk::ops {
namespace {

// rows of x (..., d) rotated with table row table_row[r] for row r
void run_rope(const py::array& x, const std::int64_t* tr, const py::array& cos_tab,
              const py::array& sin_tab, std::size_t rotary_dim, bool interleaved, py::array& out) {
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
  if (is_f32(x))
    run(float{});
  else
    run(double{});
}

}  // namespace

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

}  // namespace llmk::ops
