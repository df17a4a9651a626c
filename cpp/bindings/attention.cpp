#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_attention(py::module_& m) {
  using namespace pybind11::literals;
  m.def("attention", &ops::attention, "q"_a, "k"_a, "v"_a, "scale"_a, "causal"_a, "mask"_a, "out"_a,
        "weights"_a, "window"_a = 0, "softcap"_a = 0.0, "sinks"_a = py::none(),
        "lse"_a = py::none(),
        "Fused streaming attention on C-contiguous 4-D operands (see llmkernels.attention); "
        "window 0 and softcap 0 mean none, sinks (Hq,), lse (B, Hq, Tq) output.");
  m.def("_fast_attention", &ops::fast_attention, "q"_a, "k"_a, "v"_a, "causal"_a, "scale"_a,
        "out"_a, "attention's common case (no mask, no weights) in C++, or None.");
}

}  // namespace llmk::bind
