// The bindings: one file per op (cpp/bindings/<op>.cpp), each only m.def of the op's entries
// (cpp/ops/<op>.cpp) with their docstrings; module.cpp calls every bind_<op>.
#pragma once

#include "ops/entry.hpp"

namespace llmk::bind {

namespace py = pybind11;

void bind_rms_norm(py::module_& m);
void bind_layer_norm(py::module_& m);
void bind_silu(py::module_& m);
void bind_rope(py::module_& m);
void bind_attention(py::module_& m);
void bind_swiglu_ffn(py::module_& m);
void bind_runtime(py::module_& m);
void bind_modules(py::module_& m);
void bind_quant(py::module_& m);

}  // namespace llmk::bind
