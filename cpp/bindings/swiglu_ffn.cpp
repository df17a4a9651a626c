#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_swiglu_ffn(py::module_& m) {
  using namespace pybind11::literals;
  m.def("swiglu_ffn", &ops::swiglu_ffn, "x"_a, "w_gate"_a, "w_up"_a, "w_down"_a, "b_gate"_a,
        "b_up"_a, "b_down"_a,
        "SwiGLU feed-forward of x (..., in), weights (in, out), checked (see "
        "llmkernels.swiglu_ffn).");
}

}  // namespace llmk::bind
