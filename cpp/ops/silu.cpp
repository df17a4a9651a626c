// silu, swiglu (and the bare exp / sigmoid the tests check): elementwise maps over the flat
// array (kernels/silu.hpp)
#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {
namespace {

// chunk boundaries on multiples of 64 elements
template <class Kernel>
void run(const py::array& x, const py::array* up, py::array& out) {
  with_dtype(x, [&](auto tag) {
    using T = decltype(tag);
    const T* xp = cptr<T>(x);
    const T* up_p = up ? cptr<T>(*up) : nullptr;
    T* op = ptr<T>(out);
    const bool stream = use_stream(out);
    parallel_nogil(static_cast<std::size_t>(x.size()), 64, 4.0, [&](std::size_t b, std::size_t e) {
      dispatch(Kernel{}, op + b, xp + b, up_p ? up_p + b : nullptr, e - b, stream);
    });
  });
}

}  // namespace

// each input may be `out` exactly (elements are read before written)
py::object elementwise(Elementwise op, py::handle x_h, py::handle up_h, py::handle out_h,
                       Entry entry) {
  static const char* const names[] = {"silu", "swiglu", "exp", "sigmoid"};
  const char* fn = names[static_cast<int>(op)];
  if (entry == Entry::direct) direct_operands(fn, {{"x", x_h}, {"up", up_h}}, out_h);
  if (!plain_operands({x_h, up_h})) return not_plain(fn, entry);
  auto x = py::reinterpret_borrow<py::array>(x_h);
  std::optional<py::array> up;
  if (up_h && !up_h.is_none()) {
    up = py::reinterpret_borrow<py::array>(up_h);
    if (!same_shape(*up, x))
      fail(fn, "up must have the shape of gate " + shape_str(x) + ", got " + shape_str(*up));
  }
  py::array out = public_out(fn, out_h, x);
  if ((overlaps(x, out) && x.data() != out.data()) ||
      (up && overlaps(*up, out) && up->data() != out.data()))
    return not_plain(fn, entry);
  if (!x.size()) return std::move(out);
  const py::array* u = up ? &*up : nullptr;
  // the kernel of each Elementwise value, in its order
  using Runner = void (*)(const py::array&, const py::array*, py::array&);
  static constexpr Runner runners[] = {&run<silu_kernel>, &run<swiglu_kernel>, &run<exp_kernel>,
                                       &run<sigmoid_kernel>};
  runners[static_cast<int>(op)](x, u, out);
  return std::move(out);
}

}  // namespace llmk::ops
