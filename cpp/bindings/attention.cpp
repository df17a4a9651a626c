// Binding of the fused attention kernel. The Python layer (llmkernels/_ops.py) validates shapes,
// broadcasts the mask (as a strided view) and prepares C-contiguous q, k, v.
#include "attention.hpp"

#include "bindings/common.hpp"

#include <cmath>
#include <vector>

namespace llmk::bind {
namespace {

// The dispatch on checked operands (the _core entry or the fast path): q (B, Hq, Tq, D),
// k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), out (B, Hq, Tq, Dv), all C-contiguous, one dtype.
void run_attention(const py::array& q, const py::array& k, const py::array& v, double scale,
                   bool causal, int mask_kind, const void* mask_data,
                   const std::int64_t* strides, py::array& out, py::array* weights) {
  const auto B = q.shape(0), Hq = q.shape(1), Tq = q.shape(2), D = q.shape(3);
  const auto Hkv = k.shape(1), Tk = k.shape(2), Dv = v.shape(3);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    attn_params<T> p{};
    p.q = cptr<T>(q);
    p.k = cptr<T>(k);
    p.v = cptr<T>(v);
    p.out = ptr<T>(out);
    p.weights = weights ? ptr<T>(*weights) : nullptr;
    p.b = B, p.hq = Hq, p.hkv = Hkv, p.tq = Tq, p.tk = Tk, p.d = D, p.dv = Dv;
    auto contiguous = [](std::size_t* s, std::size_t heads, std::size_t rows, std::size_t cols) {
      s[2] = cols, s[1] = rows * cols, s[0] = heads * rows * cols;
    };
    contiguous(p.qs, Hq, Tq, D);
    contiguous(p.ks, Hkv, Tk, D);
    contiguous(p.vs, Hkv, Tk, Dv);
    contiguous(p.os, Hq, Tq, Dv);
    p.scale = scale;  // double: applied exactly when it is outside T's normal range
    p.causal = causal;
    p.mask_kind = mask_kind;
    p.mask = mask_data;
    for (int a = 0; a < 4; ++a) p.mask_strides[a] = strides[a];
    py::gil_scoped_release nogil;
    llmk::attention<T>(p);
  };
  if (is_f32(q)) run(float{}); else run(double{});
}

// q (B, Hq, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), out (B, Hq, Tq, Dv),
// weights (B, Hq, Tq, Tk) or None; mask: None or a 4-D view broadcast to (B, Hq, Tq, Tk),
// uint8 (bool) or of q's dtype (additive).
void attention(py::array q, py::array k, py::array v, double scale, bool causal,
               std::optional<py::array> mask, py::array out, std::optional<py::array> weights) {
  const char* fn = "attention";
  check_operand(fn, "q", q, nullptr, false);
  check_operand(fn, "k", k, &q, false);
  check_operand(fn, "v", v, &q, false);
  check_operand(fn, "out", out, &q, true);
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || out.ndim() != 4)
    fail(fn, "q, k, v and out must be 4-D");
  const auto B = q.shape(0), Hq = q.shape(1), Tq = q.shape(2), D = q.shape(3);
  const auto Hkv = k.shape(1), Tk = k.shape(2), Dv = v.shape(3);
  if (k.shape(0) != B || v.shape(0) != B) fail(fn, "k and v must have q's batch size");
  if (Hkv == 0 || Hq % Hkv != 0) fail(fn, "Hq must be a multiple of Hkv");
  if (k.shape(3) != D) fail(fn, "k must have q's head dimension");
  if (v.shape(1) != Hkv || v.shape(2) != Tk) fail(fn, "v must have k's heads and length");
  if (out.shape(0) != B || out.shape(1) != Hq || out.shape(2) != Tq || out.shape(3) != Dv)
    fail(fn, "out must have shape (B, Hq, Tq, Dv)");
  if (weights) {
    check_operand(fn, "weights", *weights, &q, true);
    if (weights->ndim() != 4 || weights->shape(0) != B || weights->shape(1) != Hq ||
        weights->shape(2) != Tq || weights->shape(3) != Tk)
      fail(fn, "weights must have shape (B, Hq, Tq, Tk)");
  }
  int mask_kind = 0;
  std::int64_t strides[4] = {0, 0, 0, 0};
  if (mask) {
    const py::array& m = *mask;
    if (m.ndim() != 4 || m.shape(0) != B || m.shape(1) != Hq || m.shape(2) != Tq ||
        m.shape(3) != Tk)
      fail(fn, "mask must be a (B, Hq, Tq, Tk) view");
    if (dtype_is<std::uint8_t>(m) || dtype_is<bool>(m)) {
      mask_kind = 1;
    } else if (same_dtype(m.dtype(), q.dtype())) {
      mask_kind = 2;
    } else {
      throw py::type_error("[attention] mask must be bool or of q's dtype");
    }
    for (int a = 0; a < 4; ++a) {
      if (m.strides(a) % static_cast<py::ssize_t>(m.itemsize()) != 0)
        fail(fn, "mask strides must be multiples of its item size");
      strides[a] = m.strides(a) / static_cast<py::ssize_t>(m.itemsize());
    }
  }
  run_attention(q, k, v, scale, causal, mask_kind, mask ? mask->data() : nullptr, strides, out,
                weights ? &*weights : nullptr);
}


// attention's common case (no mask, no weights; see common.hpp), or None. q, k, v: plain
// arrays of one kind, 3-D or 4-D; out must not overlap any of them (out rows are written while
// q/k/v are still read).
py::object fast_attention(py::handle q_h, py::handle k_h, py::handle v_h, py::handle causal_h,
                          py::handle scale_h, py::handle out_h) {
  const int kind = plain_kind(q_h);
  if (!kind || plain_kind(k_h) != kind || plain_kind(v_h) != kind) return py::none();
  if (causal_h.ptr() != Py_True && causal_h.ptr() != Py_False) return py::none();
  auto q = py::reinterpret_borrow<py::array>(q_h);
  auto k = py::reinterpret_borrow<py::array>(k_h);
  auto v = py::reinterpret_borrow<py::array>(v_h);
  const auto nd = q.ndim();
  if ((nd != 3 && nd != 4) || k.ndim() != nd || v.ndim() != nd) return py::none();
  if (nd == 4 && (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0))) return py::none();
  const auto Hq = q.shape(nd - 3), Tq = q.shape(nd - 2), D = q.shape(nd - 1);
  const auto Hkv = k.shape(nd - 3), Tk = k.shape(nd - 2), Dv = v.shape(nd - 1);
  if (k.shape(nd - 1) != D || v.shape(nd - 3) != Hkv || v.shape(nd - 2) != Tk || Hkv == 0 ||
      Hq % Hkv != 0 || D == 0)
    return py::none();
  double scale;
  if (scale_h.is_none()) {
    scale = 1.0 / std::sqrt(static_cast<double>(D));
  } else {
    if (!PyFloat_CheckExact(scale_h.ptr())) return py::none();
    scale = PyFloat_AS_DOUBLE(scale_h.ptr());
    if (!std::isfinite(scale)) return py::none();
  }
  std::vector<py::ssize_t> out_shape = shape_of(q);
  out_shape.back() = Dv;
  py::array out;
  if (out_h.is_none()) {
    out = kind == 1 ? new_output<float>(out_shape) : new_output<double>(out_shape);
  } else {
    if (plain_kind(out_h) != kind) return py::none();
    out = py::reinterpret_borrow<py::array>(out_h);
    if (!out.writeable() || shape_of(out) != out_shape || overlaps(q, out) || overlaps(k, out) ||
        overlaps(v, out))
      return py::none();
  }
  if (out.size() == 0) return std::move(out);
  auto as4 = [&](const py::array& a) {
    if (nd == 4) return a;
    std::vector<py::ssize_t> s{1, a.shape(0), a.shape(1), a.shape(2)};
    return py::array(a.dtype(), s, a.data(), a);
  };
  py::array q4 = as4(q), k4 = as4(k), v4 = as4(v), o4 = as4(out);
  const std::int64_t strides[4] = {0, 0, 0, 0};
  run_attention(q4, k4, v4, scale, causal_h.ptr() == Py_True, 0, nullptr, strides, o4, nullptr);
  return std::move(out);
}

}  // namespace

void bind_attention(py::module_& m) {
  using namespace pybind11::literals;
  m.def("attention", &attention, "q"_a, "k"_a, "v"_a, "scale"_a, "causal"_a, "mask"_a, "out"_a,
        "weights"_a,
        "Fused streaming attention on C-contiguous 4-D operands (see llmkernels.attention).");
  m.def("_fast_attention", &fast_attention, "q"_a, "k"_a, "v"_a, "causal"_a, "scale"_a, "out"_a,
        "attention's common case (no mask, no weights) in C++, or None.");
}

}  // namespace llmk::bind
