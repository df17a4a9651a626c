// rms_norm: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight (kernels/rms_norm.hpp)
#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"
#include "ops/ops.hpp"

namespace llmk::ops {

py::object rms_norm(py::handle x_h, py::handle w_h, py::handle eps_h, py::handle out_h,
                    Entry entry) {
  const char* fn = "rms_norm";
  if (entry == Entry::direct) direct_operands(fn, {{"x", x_h}, {"weight", w_h}}, out_h);
  if (!plain_operands({x_h, w_h})) return not_plain(fn, entry);
  auto x = py::reinterpret_borrow<py::array>(x_h);
  const double eps = public_eps(fn, eps_h);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension, got a 0-d array");
  const py::ssize_t n = x.shape(x.ndim() - 1);
  std::optional<py::array> w;
  if (!w_h.is_none()) {
    w = py::reinterpret_borrow<py::array>(w_h);
    check_vector(fn, "weight", *w, n);
  }
  py::array out = public_out(fn, out_h, x);
  // x may be out exactly (rows are read before written); the weight must not overlap it
  if ((overlaps(x, out) && x.data() != out.data()) || (w && overlaps(*w, out)))
    return not_plain(fn, entry);
  if (!x.size()) return std::move(out);
  std::size_t rows, cols;
  rows_cols(x, &rows, &cols);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* wp = w ? cptr<T>(*w) : nullptr;
    T* op = ptr<T>(out);
    const bool stream = use_stream(out);
    py::gil_scoped_release nogil;
    parallel_for(rows, 1, static_cast<double>(cols), [&](std::size_t b, std::size_t e) {
      dispatch(rms_norm_kernel{}, op + b * cols, xp + b * cols, wp, e - b, cols, eps, stream);
    });
  };
  if (is_f32(x)) run(float{}); else run(double{});
  return std::move(out);
}

}  // namespace llmk::ops
