// swiglu_ffn: the functional SwiGLU feed-forward. The projections and the activation are the
// modules' own (drivers/linear.hpp: linear, swiglu_rows).
#include <utility>
#include <vector>

#include "drivers/linear.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {

// x (..., k); w_gate, w_up (k, h); w_down (h, n) or None; biases optional. Returns (..., n), or
// the hidden activation (..., h) when w_down is None. The public checks (llmkernels._ops
// converts the operands -- array-likes, dtype promotion, contiguity -- and calls this). Empty
// sizes follow NumPy's matmul: a product over an empty inner dimension is zeros (plus bias).
py::array swiglu_ffn(py::array x, py::array w_gate, py::array w_up, std::optional<py::array> w_down,
                     std::optional<py::array> b_gate, std::optional<py::array> b_up,
                     std::optional<py::array> b_down) {
  const char* fn = "swiglu_ffn";
  check_operand(fn, "x", x, nullptr, false);
  check_operand(fn, "w_gate", w_gate, &x, false);
  check_operand(fn, "w_up", w_up, &x, false);
  const std::pair<const char*, std::optional<py::array>*> optional_operands[] = {
      {"w_down", &w_down}, {"b_gate", &b_gate}, {"b_up", &b_up}, {"b_down", &b_down}};
  for (const auto& [name, a] : optional_operands)
    if (*a) check_operand(fn, name, **a, &x, false);
  if (x.ndim() < 1) fail(fn, "x must have shape (..., in), got a 0-d array");
  const py::ssize_t k = x.shape(x.ndim() - 1);
  if (w_gate.ndim() != 2 || w_gate.shape(0) != k)
    fail(fn,
         "w_gate must have shape (" + std::to_string(k) + ", hidden), got " + shape_str(w_gate));
  const py::ssize_t h = w_gate.shape(1);
  if (!same_shape(w_up, w_gate))
    fail(fn, "w_up must have shape " + shape_str(w_gate) + " like w_gate, got " + shape_str(w_up));
  if (w_down && (w_down->ndim() != 2 || w_down->shape(0) != h))
    fail(fn, "w_down must have shape (" + std::to_string(h) + ", out), got " + shape_str(*w_down));
  if (b_gate) check_vector(fn, "b_gate", *b_gate, h);
  if (b_up) check_vector(fn, "b_up", *b_up, h);
  const py::ssize_t n = w_down ? w_down->shape(1) : 0;
  if (b_down) {
    if (!w_down) fail(fn, "b_down was given but w_down is None");
    check_vector(fn, "b_down", *b_down, n);
  }
  std::vector<py::ssize_t> lead(x.shape(), x.shape() + x.ndim() - 1), out_shape = lead;
  out_shape.push_back(w_down ? n : h);
  py::ssize_t m = 1;
  for (py::ssize_t s : lead) m *= s;
  py::array result;
  with_dtype(x, [&](auto tag) {
    using T = decltype(tag);
    py::array_t<T> gate({m, h}), up({m, h}), out({w_down ? m : py::ssize_t(0), n});
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
    result = (w_down ? py::array(out) : py::array(gate)).reshape(out_shape);
  });
  return result;
}

}  // namespace llmk::ops
