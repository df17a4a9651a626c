#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_quant(py::module_& m) {
  using namespace pybind11::literals;
  m.def("quantize", &ops::quantize, "w"_a, "bits"_a, "group_size"_a,
        "Group-wise quantization of w (rows, k) float32: (q, scales float16 (rows, k / "
        "group_size)); q int8 (rows, k) for bits=8, uint8 (rows, k / 2) for bits=4 (see "
        "llmkernels.quantize).");
  m.def("dequantize", &ops::dequantize, "q"_a, "scales"_a, "bits"_a, "group_size"_a,
        "The float32 (rows, k) matrix of quantize's (q, scales) (see llmkernels.dequantize).");
  m.def("quantized_linear", &ops::quantized_linear, "x"_a, "q"_a, "scales"_a, "bits"_a,
        "group_size"_a, "bias"_a = py::none(), "activations"_a = "int8",
        "x (m, k) float32 times the quantized W (rows, k) transposed, plus bias: (m, rows) "
        "float32; activations 'float32' or 'int8' (per token, blocks of 32) for m <= 8 (see "
        "llmkernels.quantized_linear).");
}

}  // namespace llmk::bind
