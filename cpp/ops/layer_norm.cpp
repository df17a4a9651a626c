// layer_norm: out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias
// (kernels/layer_norm.hpp)
#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"
#include "ops/ops.hpp"

namespace llmk::ops {

py::object layer_norm(py::handle x_h, py::handle w_h, py::handle b_h, py::handle eps_h,
                      py::handle out_h, Entry entry) {
  const char* fn = "layer_norm";
  if (entry == Entry::direct)
    direct_operands(fn, {{"x", x_h}, {"weight", w_h}, {"bias", b_h}}, out_h);
  if (!plain_operands({x_h, w_h, b_h})) return not_plain(fn, entry);
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
    check_vector(fn, names[i], *vec[i], n);
  }
  py::array out = public_out(fn, out_h, x);
  if ((overlaps(x, out) && x.data() != out.data()) || (vec[0] && overlaps(*vec[0], out)) ||
      (vec[1] && overlaps(*vec[1], out)))
    return not_plain(fn, entry);
  if (!x.size()) return std::move(out);
  std::size_t rows, cols;
  rows_cols(x, &rows, &cols);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* wp = vec[0] ? cptr<T>(*vec[0]) : nullptr;
    const T* bp = vec[1] ? cptr<T>(*vec[1]) : nullptr;
    T* op = ptr<T>(out);
    const bool stream = use_stream(out);
    py::gil_scoped_release nogil;
    parallel_for(rows, 1, 2.0 * static_cast<double>(cols), [&](std::size_t b, std::size_t e) {
      dispatch(layer_norm_kernel{}, op + b * cols, xp + b * cols, wp, bp, e - b, cols, eps,
               stream);
    });
  };
  if (is_f32(x)) run(float{}); else run(double{});
  return std::move(out);
}

}  // namespace llmk::ops
