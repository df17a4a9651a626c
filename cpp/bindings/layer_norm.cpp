#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_layer_norm(py::module_& m) {
  using namespace pybind11::literals;
  using ops::Entry;
  m.def(
      "_fast_layer_norm",
      [](py::handle x, py::handle weight, py::handle bias, py::handle eps, py::handle out) {
        return ops::layer_norm(x, weight, bias, eps, out, Entry::fast);
      },
      "x"_a, "weight"_a, "bias"_a, "eps"_a, "out"_a, "layer_norm's common case in C++, or None.");
  m.def(
      "layer_norm",
      [](py::array x, std::optional<py::array> weight, std::optional<py::array> bias, double eps,
         py::array out) {
        ops::layer_norm(x, weight ? py::handle(*weight) : py::none(),
                        bias ? py::handle(*bias) : py::none(), py::float_(eps), out, Entry::direct);
      },
      "x"_a, "weight"_a, "bias"_a, "eps"_a, "out"_a,
      "LayerNorm (biased variance) over the last axis into `out`.");
}

}  // namespace llmk::bind
