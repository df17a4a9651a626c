// swiglu_ffn: the functional SwiGLU feed-forward. The projections and the activation are the
// modules' own (ops/linear.cpp: linear, swiglu_rows).
#include "ops/linear.hpp"
#include "ops/ops.hpp"

namespace llmk::ops {

// x (m, k); w_gate, w_up (k, h); w_down (h, n) or None; biases optional. Returns (m, n), or the
// hidden activation (m, h) when w_down is None.
py::array swiglu_ffn(py::array x, py::array w_gate, py::array w_up, std::optional<py::array> w_down,
                     std::optional<py::array> b_gate, std::optional<py::array> b_up,
                     std::optional<py::array> b_down) {
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


}  // namespace llmk::ops
