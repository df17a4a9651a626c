#include "ops/common.hpp"

namespace llmk::ops {

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
    fail(fn,
         "eps must be a finite number >= 0, got " + py::repr(py::float_(v)).cast<std::string>());
  return v;
}

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

void direct_operands(const char* fn, std::initializer_list<std::pair<const char*, py::handle>> ops,
                     py::handle out) {
  const py::array* first = nullptr;
  py::array arrays[4];
  std::size_t i = 0;
  for (const auto& [name, h] : ops) {
    if (!h || h.is_none()) continue;
    arrays[i] = py::reinterpret_borrow<py::array>(h);
    check_operand(fn, name, arrays[i], first, false);
    if (!first) first = &arrays[i];
    ++i;
  }
  if (!out || !first) return;
  auto o = py::reinterpret_borrow<py::array>(out);
  check_operand(fn, "out", o, first, true);
  check_same_shape(fn, "out", o, *first);
}

py::object not_plain(const char* fn, Entry entry) {
  if (entry == Entry::direct)
    fail(fn, "operands must be NumPy arrays (not subclasses) that do not overlap out");
  return py::none();
}

}  // namespace llmk::ops
