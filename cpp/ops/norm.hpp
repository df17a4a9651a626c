// The entry shared by the row-wise norms (ops/rms_norm.cpp, ops/layer_norm.cpp): x (..., n)
// normalised row by row, with optional (n,) vectors (weight, and bias for layer_norm).
#pragma once

#include <array>
#include <utility>

#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "ops/common.hpp"

namespace llmk::ops {

// kernel(out, x, vec[0], ..., vec[V-1], rows, n, eps, stream) on each chunk of rows; cost: the
// kernel's work per element (for the thread split). x may be out exactly (rows are read before
// written); the vectors must not overlap out.
template <std::size_t V, class Kernel>
py::object norm_entry(const char* fn, const Kernel& kernel, py::handle x_h,
                      const std::array<std::pair<const char*, py::handle>, V>& vec_h,
                      py::handle eps_h, py::handle out_h, Entry entry, double cost) {
  if (entry == Entry::direct) {
    if constexpr (V == 1) direct_operands(fn, {{"x", x_h}, vec_h[0]}, out_h);
    if constexpr (V == 2) direct_operands(fn, {{"x", x_h}, vec_h[0], vec_h[1]}, out_h);
  }
  bool plain = plain_operands({x_h});
  for (const auto& v : vec_h) plain = plain && plain_operands({x_h, v.second});
  if (!plain) return not_plain(fn, entry);
  auto x = py::reinterpret_borrow<py::array>(x_h);
  const double eps = public_eps(fn, eps_h);
  if (x.ndim() < 1) fail(fn, "x must have at least 1 dimension, got a 0-d array");
  std::size_t rows, n;
  rows_cols(x, &rows, &n);
  std::array<std::optional<py::array>, V> vec;
  for (std::size_t i = 0; i < V; ++i) {
    if (vec_h[i].second.is_none()) continue;
    vec[i] = py::reinterpret_borrow<py::array>(vec_h[i].second);
    check_vector(fn, vec_h[i].first, *vec[i], static_cast<py::ssize_t>(n));
  }
  py::array out = public_out(fn, out_h, x);
  bool overlap = overlaps(x, out) && x.data() != out.data();
  for (const auto& v : vec) overlap = overlap || (v && overlaps(*v, out));
  if (overlap) return not_plain(fn, entry);
  if (!x.size()) return std::move(out);
  with_dtype(x, [&](auto tag) {
    using T = decltype(tag);
    std::array<const T*, V> vp;
    for (std::size_t i = 0; i < V; ++i) vp[i] = vec[i] ? cptr<T>(*vec[i]) : nullptr;
    const T* xp = cptr<T>(x);
    T* op = ptr<T>(out);
    const bool stream = use_stream(out);
    parallel_nogil(rows, 1, cost * static_cast<double>(n), [&](std::size_t b, std::size_t e) {
      std::apply(
          [&](auto... v) { dispatch(kernel, op + b * n, xp + b * n, v..., e - b, n, eps, stream); },
          vp);
    });
  });
  return std::move(out);
}

}  // namespace llmk::ops
