#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_rms_norm(py::module_& m) {
  using namespace pybind11::literals;
  using ops::Entry;
  m.def(
      "_fast_rms_norm",
      [](py::handle x, py::handle weight, py::handle eps, py::handle out) {
        return ops::rms_norm(x, weight, eps, out, Entry::fast);
      },
      "x"_a, "weight"_a, "eps"_a, "out"_a,
      "rms_norm's common case in C++, or None (see llmkernels._ops).");
  m.def(
      "rms_norm",
      [](py::array x, std::optional<py::array> weight, double eps, py::array out) {
        ops::rms_norm(x, weight ? py::handle(*weight) : py::none(), py::float_(eps), out,
                      Entry::direct);
      },
      "x"_a, "weight"_a, "eps"_a, "out"_a,
      "RMSNorm over the last axis into `out` (C-contiguous operands of one float dtype).");
}

}  // namespace llmk::bind
