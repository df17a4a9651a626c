// llmkernels._core: SIMD kernels for LLaMA-style layers. The public, documented API is the
// Python package (llmkernels/__init__.py), which converts arguments and calls into here.
#include <xsimd/xsimd.hpp>

#include "bindings/bindings.hpp"

#ifndef LLMK_VERSION
#define LLMK_VERSION "dev"
#endif
#ifndef LLMK_COMPILER
#define LLMK_COMPILER "unknown"
#endif

PYBIND11_MODULE(_core, m) {
  m.doc() = "llmkernels C++ core (xsimd kernels, pybind11 bindings)";
  m.attr("__version__") = LLMK_VERSION;
  m.attr("compiler") = LLMK_COMPILER;
  m.attr("xsimd_version") = std::to_string(XSIMD_VERSION_MAJOR) + "." +
                            std::to_string(XSIMD_VERSION_MINOR) + "." +
                            std::to_string(XSIMD_VERSION_PATCH);
  llmk::bind::bind_rms_norm(m);
  llmk::bind::bind_layer_norm(m);
  llmk::bind::bind_silu(m);
  llmk::bind::bind_rope(m);
  llmk::bind::bind_attention(m);
  llmk::bind::bind_swiglu_ffn(m);
  llmk::bind::bind_runtime(m);
  llmk::bind::bind_modules(m);
  llmk::bind::bind_quant(m);
}
