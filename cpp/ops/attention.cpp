// attention: the op's Python-facing entries -- operands checked with the public messages,
// outputs allocated, the GIL released -- around the driver (drivers/attend.hpp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "drivers/attend.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {
namespace {

// The dispatch on checked operands (the _core entry or the fast path): q (B, Hq, Tq, D),
// k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), out (B, Hq, Tq, Dv), all C-contiguous, one dtype.
// Features (window, softcap, sinks, lse) default to none.
struct attn_features {
  std::int64_t window = 0;
  double softcap = 0.0;
  const py::array* sinks = nullptr;
  py::array* lse = nullptr;
};

void run_attention(const py::array& q, const py::array& k, const py::array& v, double scale,
                   bool causal, AttnMask mask_kind, const void* mask_data,
                   const std::int64_t* strides, py::array& out, py::array* weights,
                   const attn_features& f = {}) {
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
    p.window = f.window;
    p.softcap = f.softcap;
    p.sinks = f.sinks ? cptr<T>(*f.sinks) : nullptr;
    p.lse = f.lse ? ptr<T>(*f.lse) : nullptr;
    py::gil_scoped_release nogil;
    llmk::attention<T>(p);
  };
  if (is_f32(q))
    run(float{});
  else
    run(double{});
}

}  // namespace

namespace {

// lowest and one-past-highest byte an array (any strides) touches
std::pair<std::uintptr_t, std::uintptr_t> byte_bounds(const py::array& a) {
  auto lo = reinterpret_cast<std::uintptr_t>(a.data()), hi = lo;
  if (a.size() == 0) return {lo, lo};
  for (py::ssize_t i = 0; i < a.ndim(); ++i) {
    const py::ssize_t ext = (a.shape(i) - 1) * a.strides(i);
    if (ext < 0)
      lo -= static_cast<std::uintptr_t>(-ext);
    else
      hi += static_cast<std::uintptr_t>(ext);
  }
  return {lo, hi + static_cast<std::uintptr_t>(a.itemsize())};
}

bool may_overlap(const py::array& a, const py::array& b) {
  auto [alo, ahi] = byte_bounds(a);
  auto [blo, bhi] = byte_bounds(b);
  return alo < ahi && blo < bhi && alo < bhi && blo < ahi;
}

// window: None (0) or an int (int / numpy integer, not a bool) >= 1; wider than 2^62 (more than
// any sequence) is no window
std::int64_t window_arg(py::handle h) {
  const char* fn = "attention";
  if (h.is_none()) return 0;
  static py::handle np_integer = py::object(py::module_::import("numpy").attr("integer")).release();
  if (PyBool_Check(h.ptr()) || !(PyLong_Check(h.ptr()) || py::isinstance(h, np_integer)))
    throw py::type_error("[attention] window must be an int or None, got " + type_name(h));
  auto w = py::reinterpret_steal<py::object>(PyNumber_Long(h.ptr()));
  if (!w) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(w.ptr(), &overflow);
  if (overflow < 0 || (!overflow && v < 1))
    fail(fn, "window must be >= 1, got " + std::string(py::str(h)));
  constexpr std::int64_t kNoWindow = std::int64_t{1} << 62;
  return overflow > 0 ? kNoWindow : std::min<std::int64_t>(v, kNoWindow);
}

}  // namespace

// The attention op (_ops.attention) with its public arguments: q (..., Hq, Tq, D), k
// (..., Hkv, Tk, D), v (..., Hkv, Tk, Dv) 3-D or 4-D; every argument checked here with the
// public messages, outputs allocated (out, then weights, then lse). Entry::fast returns None
// when an operand needs the Python layer's conversion: q/k/v/sinks not plain arrays of one
// dtype, mask not an ndarray (or neither bool nor of q's dtype), causal not a bool, scale not
// None or a float, out overlapping an input. Entry::direct raises instead.
py::object attention(py::handle q_h, py::handle k_h, py::handle v_h, py::handle causal_h,
                     py::handle scale_h, py::handle out_h, py::handle mask_h, py::handle window_h,
                     py::handle softcap_h, py::handle sinks_h, py::handle weights_h,
                     py::handle lse_h, Entry entry) {
  const char* fn = "attention";
  if (entry == Entry::direct) {
    // (direct_operands reads its operands as arrays: anything else is refused first)
    auto array = [](py::handle h) { return py::isinstance<py::array>(h); };
    if (!array(q_h) || !array(k_h) || !array(v_h) || (!sinks_h.is_none() && !array(sinks_h)))
      return not_plain(fn, entry);
    direct_operands(fn, {{"q", q_h}, {"k", k_h}, {"v", v_h}}, {});
  }
  const int kind = plain_operands({q_h, k_h, v_h});
  if (!kind) return not_plain(fn, entry);
  auto q = py::reinterpret_borrow<py::array>(q_h);
  auto k = py::reinterpret_borrow<py::array>(k_h);
  auto v = py::reinterpret_borrow<py::array>(v_h);
  const auto& api = py::detail::npy_api::get();
  const bool mask_given = !mask_h.is_none(), sinks_given = !sinks_h.is_none();
  if (entry == Entry::fast) {
    if ((causal_h.ptr() != Py_True && causal_h.ptr() != Py_False) ||
        (!scale_h.is_none() && !PyFloat_CheckExact(scale_h.ptr())) ||
        (sinks_given && plain_kind(sinks_h) != kind))
      return py::none();
    if (mask_given) {
      if (Py_TYPE(mask_h.ptr()) != reinterpret_cast<PyTypeObject*>(api.PyArray_Type_))
        return py::none();
      auto m = py::reinterpret_borrow<py::array>(mask_h);
      // (other dtypes: converted, or refused with the public message, by the Python layer)
      if (m.dtype().kind() != 'b' && !same_dtype(m.dtype(), q.dtype())) return py::none();
    }
  } else {
    if (sinks_given) direct_operands(fn, {{"q", q_h}, {"sinks", sinks_h}}, {});
    if (mask_given && !py::isinstance<py::array>(mask_h))
      throw py::type_error("[attention] mask must be a numpy.ndarray");
  }

  // shapes
  const auto nd = q.ndim();
  if (nd != 3 && nd != 4)
    fail(fn, "q must have shape (B, Hq, Tq, D) or (Hq, Tq, D), got " + shape_str(q));
  if (k.ndim() != nd || v.ndim() != nd)
    fail(fn, "q, k and v must have the same number of dimensions, got q " + shape_str(q) + ", k " +
                 shape_str(k) + ", v " + shape_str(v));
  if (nd == 4 && (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0)))
    fail(fn, "leading (batch) dimensions must match, got q " + shape_str(q) + ", k " +
                 shape_str(k) + ", v " + shape_str(v));
  const py::ssize_t B = nd == 4 ? q.shape(0) : 1;
  const py::ssize_t Hq = q.shape(nd - 3), Tq = q.shape(nd - 2), D = q.shape(nd - 1);
  const py::ssize_t Hkv = k.shape(nd - 3), Tk = k.shape(nd - 2), Dk = k.shape(nd - 1);
  const py::ssize_t Dv = v.shape(nd - 1);
  if (Dk != D)
    fail(fn, "k must have q's head dimension D=" + std::to_string(D) + ", got " +
                 std::to_string(Dk) + " (k " + shape_str(k) + ")");
  if (v.shape(nd - 3) != Hkv || v.shape(nd - 2) != Tk)
    fail(fn, "v must have k's heads and length (Hkv=" + std::to_string(Hkv) +
                 ", Tk=" + std::to_string(Tk) + "), got v " + shape_str(v));
  if (Hkv == 0 || Hq % Hkv != 0)
    fail(fn, "Hq % Hkv must be 0 (grouped-query), got Hq=" + std::to_string(Hq) +
                 ", Hkv=" + std::to_string(Hkv));
  if (D == 0) fail(fn, "the head dimension D must be >= 1");

  // scalars
  const bool causal = public_bool(fn, "causal", causal_h);
  const bool want_weights = public_bool(fn, "return_weights", weights_h);
  const bool want_lse = public_bool(fn, "return_lse", lse_h);
  attn_features f;
  f.window = window_arg(window_h);
  if (!softcap_h.is_none()) {
    f.softcap = public_finite(fn, "softcap", softcap_h);
    if (f.softcap <= 0.0)
      fail(fn, "softcap must be finite and > 0, got " + std::string(py::repr(softcap_h)));
  }
  const double scale = scale_h.is_none() ? 1.0 / std::sqrt(static_cast<double>(D))
                                         : public_finite(fn, "scale", scale_h);

  // the batch shape () or (B,) of 3-D / 4-D inputs, then each output's shape
  std::vector<py::ssize_t> lead(q.shape(), q.shape() + (nd - 3));
  auto with = [&](std::initializer_list<py::ssize_t> tail) {
    std::vector<py::ssize_t> s = lead;
    s.insert(s.end(), tail);
    return s;
  };
  const std::vector<py::ssize_t> scores_shape = with({Hq, Tq, Tk});

  // mask: bool (True = may attend) or additive of q's dtype, broadcast to (..., Hq, Tq, Tk)
  AttnMask mask_kind = AttnMask::none;
  std::int64_t strides[4] = {0, 0, 0, 0};
  std::optional<py::array> mask;
  if (mask_given) {
    mask = py::reinterpret_borrow<py::array>(mask_h);
    const py::array& m = *mask;
    const char mk = m.dtype().kind();
    if (mk == 'b') {
      mask_kind = AttnMask::boolean;
    } else if (mk == 'f') {
      if (!same_dtype(m.dtype(), q.dtype()))
        throw py::type_error("[attention] mask must be bool or of q's dtype");
      mask_kind = AttnMask::additive;
    } else {
      throw py::type_error(
          "[attention] mask must be boolean (True = may attend) or additive float, got dtype " +
          std::string(py::str(m.dtype())));
    }
    const auto ns = static_cast<py::ssize_t>(scores_shape.size());
    bool ok = m.ndim() <= ns;
    for (py::ssize_t a = 0; ok && a < m.ndim(); ++a) {
      const py::ssize_t md = m.shape(m.ndim() - 1 - a), sd = scores_shape[ns - 1 - a];
      ok = md == sd || md == 1;
    }
    if (!ok)
      fail(fn, "mask of shape " + shape_str(m) +
                   " is not broadcastable to (..., Hq, Tq, Tk) = " + tuple_str(scores_shape));
    const auto item = static_cast<py::ssize_t>(m.itemsize());
    for (py::ssize_t a = 0; a < m.ndim(); ++a) {
      if (m.shape(a) == 1) continue;  // broadcast (or a single entry): stride 0
      if (m.strides(a) % item != 0) fail(fn, "mask strides must be multiples of its item size");
      strides[4 - m.ndim() + a] = m.strides(a) / item;
    }
  }
  std::optional<py::array> sinks;
  if (sinks_given) {
    sinks = py::reinterpret_borrow<py::array>(sinks_h);
    if (sinks->ndim() != 1 || sinks->shape(0) != Hq)
      fail(fn,
           "sinks must have shape (Hq,) = (" + std::to_string(Hq) + ",), got " + shape_str(*sinks));
    f.sinks = &*sinks;
  }

  // outputs: out is checked last, as the Python layer did; it must not overlap an input (its
  // rows are written while q, k, v, the mask and the sinks are still read)
  py::array out = public_out(fn, out_h, with({Hq, Tq, Dv}), q.dtype());
  if (!out_h.is_none()) {
    bool overlap = overlaps(q, out) || overlaps(k, out) || overlaps(v, out) ||
                   (sinks && overlaps(*sinks, out)) || (mask && may_overlap(*mask, out));
    if (overlap) return not_plain(fn, entry);
  }
  std::optional<py::array> weights, lse;
  if (want_weights) {
    weights = kind == 1 ? new_output<float>(scores_shape) : new_output<double>(scores_shape);
    std::memset(weights->mutable_data(), 0, static_cast<std::size_t>(weights->nbytes()));
  }
  if (want_lse) {
    lse = kind == 1 ? new_output<float>(with({Hq, Tq})) : new_output<double>(with({Hq, Tq}));
    with_dtype(q, [&](auto tag) {
      using T = decltype(tag);
      std::fill(ptr<T>(*lse), ptr<T>(*lse) + lse->size(), -std::numeric_limits<T>::infinity());
    });
  }
  if (out.size() || (weights && weights->size()) || (lse && lse->size())) {
    auto as4 = [&](const py::array& a) {
      if (a.ndim() == 4) return a;
      std::vector<py::ssize_t> s{B};
      s.insert(s.end(), a.shape() + (a.ndim() - 3), a.shape() + a.ndim());
      return py::array(a.dtype(), s, a.data(), a);
    };
    py::array q4 = as4(q), k4 = as4(k), v4 = as4(v), o4 = as4(out);
    std::optional<py::array> w4, l3;
    if (weights) w4 = as4(*weights);
    if (lse) {
      l3 = lse->ndim() == 3
               ? *lse
               : py::array(lse->dtype(), std::vector<py::ssize_t>{B, Hq, Tq}, lse->data(), *lse);
      f.lse = &*l3;
    }
    run_attention(q4, k4, v4, scale, causal, mask_kind, mask ? mask->data() : nullptr, strides, o4,
                  w4 ? &*w4 : nullptr, f);
  }
  if (!weights && !lse) return std::move(out);
  py::list result;
  result.append(out);
  if (weights) result.append(*weights);
  if (lse) result.append(*lse);
  return py::tuple(result);
}

}  // namespace llmk::ops
