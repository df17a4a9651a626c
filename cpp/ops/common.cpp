#include "ops/common.hpp"

namespace llmk::ops {

std::string type_name(py::handle h) {
  return py::str(py::type::handle_of(h).attr("__name__")).cast<std::string>();
}

double real_arg(const char* fn, const char* name, py::handle h) {
  if (!PyFloat_CheckExact(h.ptr())) {
    static py::handle real = py::object(py::module_::import("numbers").attr("Real")).release();
    if (PyBool_Check(h.ptr()) || !py::isinstance(h, real))
      throw py::type_error(std::string("[") + fn + "] " + name + " must be a real number, got " +
                           type_name(h));
  }
  double v = PyFloat_AsDouble(h.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) throw py::error_already_set();
    PyErr_Clear();
    fail(fn, std::string(name) + " must be finite (got an integer beyond float range)");
  }
  return v;
}

double public_eps(const char* fn, py::handle h) {
  const double v = real_arg(fn, "eps", h);
  if (!(v >= 0.0) || !std::isfinite(v))
    fail(fn, "eps must be a finite number >= 0, got " + float_repr(v));
  return v;
}

double public_finite(const char* fn, const char* name, py::handle h) {
  const double v = real_arg(fn, name, h);
  if (!std::isfinite(v)) fail(fn, std::string(name) + " must be finite, got " + float_repr(v));
  return v;
}

bool public_bool(const char* fn, const char* name, py::handle h) {
  if (h.ptr() == Py_True) return true;
  if (h.ptr() == Py_False) return false;
  static py::handle np_bool = py::object(py::module_::import("numpy").attr("bool_")).release();
  if (!py::isinstance(h, np_bool))
    throw py::type_error(std::string("[") + fn + "] " + name + " must be a bool, got " +
                         type_name(h));
  return PyObject_IsTrue(h.ptr()) == 1;
}

std::string float_repr(double v) { return py::repr(py::float_(v)).cast<std::string>(); }

py::array public_out(const char* fn, py::handle out_h, const py::array& like) {
  return public_out(fn, out_h, shape_of(like), like.dtype());
}

py::array public_out(const char* fn, py::handle out_h, const std::vector<py::ssize_t>& shape,
                     const py::dtype& dtype) {
  if (out_h.is_none()) {
    if (same_dtype(dtype, py::dtype::of<float>())) return new_output<float>(shape);
    return new_output<double>(shape);
  }
  if (!py::isinstance<py::array>(out_h))
    throw py::type_error(std::string("[") + fn + "] out must be a numpy.ndarray, got " +
                         type_name(out_h));
  auto out = py::reinterpret_borrow<py::array>(out_h);
  if (!same_dtype(out.dtype(), dtype))
    throw py::type_error(std::string("[") + fn + "] out must have dtype " +
                         std::string(py::str(dtype)) + ", got " +
                         std::string(py::str(out.dtype())));
  if (shape_of(out) != shape)
    fail(fn, "out must have shape " + tuple_str(shape) + ", got " + shape_str(out));
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
