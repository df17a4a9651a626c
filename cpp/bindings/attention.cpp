#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_attention(py::module_& m) {
  using namespace pybind11::literals;
  using ops::Entry;
  // (one implementation, ops::attention, behind both: see cpp/ops/common.hpp's Entry)
  auto entry = [](Entry e) {
    return [e](py::handle q, py::handle k, py::handle v, py::handle causal, py::handle scale,
               py::handle out, py::handle mask, py::handle window, py::handle softcap,
               py::handle sinks, py::handle return_weights, py::handle return_lse) {
      return ops::attention(q, k, v, causal, scale, out, mask, window, softcap, sinks,
                            return_weights, return_lse, e);
    };
  };
  m.def("_fast_attention", entry(Entry::fast), "q"_a, "k"_a, "v"_a, "causal"_a, "scale"_a, "out"_a,
        "mask"_a = py::none(), "window"_a = py::none(), "softcap"_a = py::none(),
        "sinks"_a = py::none(), "return_weights"_a = false, "return_lse"_a = false,
        "llmkernels.attention with its arguments, all checked; None when an operand needs the "
        "Python layer's conversion (see llmkernels._ops).");
  m.def("attention", entry(Entry::direct), "q"_a, "k"_a, "v"_a, "causal"_a, "scale"_a, "out"_a,
        "mask"_a = py::none(), "window"_a = py::none(), "softcap"_a = py::none(),
        "sinks"_a = py::none(), "return_weights"_a = false, "return_lse"_a = false,
        "llmkernels.attention on converted operands (C-contiguous float32/float64 q, k, v, "
        "sinks of one dtype; mask bool or of their dtype; out not overlapping them): returns "
        "out, then weights and lse if asked for (a tuple).");
}

}  // namespace llmk::bind
