#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_silu(py::module_& m) {
  using namespace pybind11::literals;
  using ops::Elementwise;
  using ops::Entry;
  m.def(
      "_fast_silu",
      [](py::handle x, py::handle out) {
        return ops::elementwise(Elementwise::silu, x, py::handle(), out, Entry::fast);
      },
      "x"_a, "out"_a, "silu's common case in C++, or None.");
  m.def(
      "_fast_swiglu",
      [](py::handle gate, py::handle up, py::handle out) {
        return ops::elementwise(Elementwise::swiglu, gate, up, out, Entry::fast);
      },
      "gate"_a, "up"_a, "out"_a, "swiglu's common case in C++, or None.");
  // the direct entries of the one-input maps
  auto direct = [](Elementwise op) {
    return [op](py::array x, py::array out) {
      ops::elementwise(op, x, py::handle(), out, Entry::direct);
    };
  };
  m.def("silu", direct(Elementwise::silu), "x"_a, "out"_a, "out = x * sigmoid(x), elementwise.");
  m.def(
      "swiglu",
      [](py::array gate, py::array up, py::array out) {
        ops::elementwise(Elementwise::swiglu, gate, up, out, Entry::direct);
      },
      "gate"_a, "up"_a, "out"_a, "out = silu(gate) * up, elementwise.");
  m.def("_exp", direct(Elementwise::exp), "x"_a, "out"_a,
        "The vectorized exp the kernels use (subnormal results flushed to 0).");
  m.def("_sigmoid", direct(Elementwise::sigmoid), "x"_a, "out"_a,
        "The vectorized sigmoid the kernels use.");
}

}  // namespace llmk::bind
