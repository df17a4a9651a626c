// Operand checks and helpers shared by the ops' entries (cpp/ops/<op>.cpp). Each entry checks
// its operands (ValueError/TypeError with the public "[op] " messages), chooses threads and
// streaming, and dispatches: _core itself is safe to call directly, a wrong call never reaches
// a kernel.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/thread_pool.hpp"

namespace llmk::ops {

namespace py = pybind11;

[[noreturn]] inline void fail(const char* fn, const std::string& msg) {
  throw py::value_error(std::string("[") + fn + "] " + msg);
}

// a shape as Python prints the tuple: (), (4,), (2, 3)
inline std::string tuple_str(const py::ssize_t* dims, py::ssize_t n) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < n; ++i) {
    s += std::to_string(dims[i]);
    if (n == 1 || i + 1 < n) s += n == 1 ? "," : ", ";
  }
  return s + ")";
}
inline std::string tuple_str(const std::vector<py::ssize_t>& dims) {
  return tuple_str(dims.data(), static_cast<py::ssize_t>(dims.size()));
}
inline std::string shape_str(const py::array& a) { return tuple_str(a.shape(), a.ndim()); }

// dtypes are compared as NumPy compares them (PyArray_EquivTypes), not by identity: a dtype that
// went through pickle, or carries metadata, is a different object equal to float32. Non-native
// byte order is not equivalent (the Python layer converts it before calling).
inline bool same_dtype(const py::dtype& a, const py::dtype& b) {
  return py::detail::npy_api::get().PyArray_EquivTypes_(a.ptr(), b.ptr());
}
template <class T>
inline bool dtype_is(const py::array& a) {
  return same_dtype(a.dtype(), py::dtype::of<T>());
}
inline bool is_f32(const py::array& a) { return dtype_is<float>(a); }
inline bool is_f64(const py::array& a) { return dtype_is<double>(a); }

// Checks a kernel operand: C-contiguous, of dtype `like` (or float32/float64 if like is null),
// writeable if it is an output.
inline void check_operand(const char* fn, const char* name, const py::array& a,
                          const py::array* like, bool writeable) {
  if (like ? !same_dtype(a.dtype(), like->dtype()) : !(is_f32(a) || is_f64(a)))
    throw py::type_error(std::string("[") + fn + "] " + name + " has dtype " +
                         std::string(py::str(a.dtype())) + ", expected " +
                         (like ? std::string(py::str(like->dtype())) : "float32 or float64"));
  if (!(a.flags() & py::array::c_style)) fail(fn, std::string(name) + " must be C-contiguous");
  if (writeable && !a.writeable()) fail(fn, std::string(name) + " must be writeable");
}

inline void check_same_shape(const char* fn, const char* name, const py::array& a,
                             const py::array& ref) {
  bool same = a.ndim() == ref.ndim();
  for (py::ssize_t i = 0; same && i < a.ndim(); ++i) same = a.shape(i) == ref.shape(i);
  if (!same)
    fail(fn, std::string(name) + " must have shape " + shape_str(ref) + ", got " + shape_str(a));
}

inline void check_vector(const char* fn, const char* name, const py::array& a, py::ssize_t n) {
  if (a.ndim() != 1 || a.shape(0) != n)
    fail(fn,
         std::string(name) + " must have shape (" + std::to_string(n) + ",), got " + shape_str(a));
}

// (rows, n) view of an array of shape (..., n); a 0-d array is one row of one element.
inline void rows_cols(const py::array& a, std::size_t* rows, std::size_t* n) {
  *n = a.ndim() == 0 ? 1 : static_cast<std::size_t>(a.shape(a.ndim() - 1));
  std::size_t size = static_cast<std::size_t>(a.size());
  *rows = *n == 0 ? 0 : size / *n;
}

template <class T>
inline T* ptr(py::array& a) {
  return static_cast<T*>(a.mutable_data());
}
template <class T>
inline const T* cptr(const py::array& a) {
  return static_cast<const T*>(a.data());
}
template <class T>
inline const T* cptr_or_null(const std::optional<py::array>& a) {
  return a ? static_cast<const T*>(a->data()) : nullptr;
}

// ---------------------------------------------------------------------------------------------
// The fast path. Each public op's `_fast_<op>` entry takes the Python
// arguments as they came and handles the common case entirely in C++: plain ndarrays of native
// float32/float64, C-contiguous, one dtype, `out` absent or not overlapping an input (other than
// an exact alias where the op allows it), valid shapes and scalars. For anything else it returns
// None, and the Python wrapper takes the conversion path (array-likes, promotion, copies, and the
// error messages) -- so both paths give the same results and the same errors.

// 1 for a plain C-contiguous ndarray of native float32, 2 for float64, 0 for anything else
// (subclasses, other dtypes, byte-swapped, strided). Dtypes are compared as NumPy compares them,
// so a pickled float32 dtype or one with metadata counts as float32.
inline int plain_kind(py::handle h) {
  const auto& api = py::detail::npy_api::get();
  if (Py_TYPE(h.ptr()) != reinterpret_cast<PyTypeObject*>(api.PyArray_Type_)) return 0;
  auto a = py::reinterpret_borrow<py::array>(h);
  if (!(a.flags() & py::array::c_style)) return 0;
  if (is_f32(a)) return 1;
  if (is_f64(a)) return 2;
  return 0;
}

inline bool same_shape(const py::array& a, const py::array& b) {
  if (a.ndim() != b.ndim()) return false;
  for (py::ssize_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) != b.shape(i)) return false;
  return true;
}

// byte ranges of two C-contiguous arrays intersect
inline bool overlaps(const py::array& a, const py::array& b) {
  auto pa = reinterpret_cast<std::uintptr_t>(a.data());
  auto pb = reinterpret_cast<std::uintptr_t>(b.data());
  auto na = static_cast<std::uintptr_t>(a.nbytes()), nb = static_cast<std::uintptr_t>(b.nbytes());
  return na && nb && pa < pb + nb && pb < pa + na;
}

// `out` is usable as is: a plain array of kind `kind` and like's shape, writeable
inline bool plain_out(py::handle out, int kind, const py::array& like) {
  if (plain_kind(out) != kind) return false;
  auto o = py::reinterpret_borrow<py::array>(out);
  return o.writeable() && same_shape(o, like);
}

// Outputs of at least kAlignBytes are 64-byte aligned (as _ops._empty does), so the kernels can
// use aligned streaming stores on large outputs; small ones are a plain NumPy allocation.
constexpr std::size_t kAlignBytes = std::size_t(1) << 20;

template <class T>
py::array new_output(const std::vector<py::ssize_t>& shape) {
  std::size_t n = 1;
  for (auto s : shape) n *= static_cast<std::size_t>(s);
  if (n * sizeof(T) < kAlignBytes) return py::array_t<T>(shape);
  py::array_t<std::uint8_t> raw(static_cast<py::ssize_t>(n * sizeof(T) + 64));
  auto addr = reinterpret_cast<std::uintptr_t>(raw.data());
  std::size_t offset = (64 - addr % 64) % 64;
  return py::array_t<T>(shape, reinterpret_cast<T*>(raw.mutable_data() + offset), raw);
}

inline std::vector<py::ssize_t> shape_of(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

// f(T{}) for x's float type (float32 or float64): an op's code written once for both
template <class F>
void with_dtype(const py::array& x, F&& f) {
  if (is_f32(x))
    f(float{});
  else
    f(double{});
}

// parallel_for (common/thread_pool.hpp) with the GIL released: take every pointer first
template <class Body>
void parallel_nogil(std::size_t n, std::size_t grain, double cost_per_item, const Body& body) {
  py::gil_scoped_release nogil;
  parallel_for(n, grain, cost_per_item, body);
}

// Non-temporal stores pay off when the output is much larger than the caches (each output line
// then skips its read-for-ownership). The row kernels peel a scalar head to reach vector
// alignment; rope streams only when rows and halves are 64-byte aligned (row_bytes), which holds
// for the usual head sizes since llmkernels allocates its outputs 64-byte aligned.
constexpr std::size_t kStreamBytes = std::size_t(16) << 20;

inline bool use_stream(const py::array& out) {
  auto addr = reinterpret_cast<std::uintptr_t>(out.data());
  return static_cast<std::size_t>(out.nbytes()) >= kStreamBytes &&
         addr % static_cast<std::uintptr_t>(out.itemsize()) == 0;
}

inline bool use_stream_aligned_rows(const py::array& out, std::size_t row_bytes) {
  auto addr = reinterpret_cast<std::uintptr_t>(out.data());
  return use_stream(out) && addr % 64 == 0 && row_bytes % 64 == 0;
}

// ---------------------------------------------------------------------------------------------
// The public checks of the fast entries, with the messages of the Python layer (the order is
// the Python layer's too: conversion errors there first, then these).

// type(h).__name__, for messages
std::string type_name(py::handle h);
// repr(float(v)), for messages: 1e-06, inf, nan
std::string float_repr(double v);

// a real number (numbers.Real, not a bool) as a double; an int beyond float range is a
// ValueError "{name} must be finite (got an integer beyond float range)"
double real_arg(const char* fn, const char* name, py::handle h);
// eps: a real number (not a bool), representable as a float, finite and >= 0
double public_eps(const char* fn, py::handle h);
// a real number that is finite ("{name} must be finite, got inf")
double public_finite(const char* fn, const char* name, py::handle h);
// a bool or numpy.bool_ ("{name} must be a bool, got int")
bool public_bool(const char* fn, const char* name, py::handle h);

// out: None (a new array of like's shape and dtype), or an ndarray of like's dtype and shape,
// C-contiguous and writeable
py::array public_out(const char* fn, py::handle out_h, const py::array& like);
// the same for an output of the given shape and dtype (float32 or float64)
py::array public_out(const char* fn, py::handle out_h, const std::vector<py::ssize_t>& shape,
                     const py::dtype& dtype);

// the operands (null handles and None skipped) are plain arrays of one kind; that kind, or 0
int plain_operands(std::initializer_list<py::handle> hs);

// How an entry treats operands that are not plain arrays (see plain_kind): `fast` (the
// _core._fast_<op> entries) returns None, for the Python layer's conversion path; `direct` (the
// older _core.<op> entries, kept for callers of _core itself) raises the operand's error
// (check_operand) -- one implementation behind both.
enum class Entry { fast, direct };

// What an entry returns for operands it does not take as they are: None for a fast entry, a
// ValueError for a direct one.
py::object not_plain(const char* fn, Entry entry);

// direct entries: each (name, operand) is an array of `like`'s dtype (of float32/float64 for
// the first), C-contiguous; `out`, if given, also writeable and of the first operand's shape
void direct_operands(const char* fn, std::initializer_list<std::pair<const char*, py::handle>> ops,
                     py::handle out);

}  // namespace llmk::ops
