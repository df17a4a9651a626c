#include "bindings/bindings.hpp"

namespace llmk::bind {

void bind_rope(py::module_& m) {
  using namespace pybind11::literals;
  m.def("rope_tables", &ops::rope_tables, "positions"_a, "inv_freq"_a, "attention_factor"_a,
        "dtype"_a,
        "cos/sin tables (P, len(inv_freq)) for int64 positions (P,), angles in float64.");
  m.def("rope", &ops::rope, "x"_a, "table_row"_a, "cos"_a, "sin"_a, "rotary_dim"_a, "interleaved"_a,
        "out"_a, "Rotate rows of x (..., D) using table row table_row[r] for row r.");
  m.def("_fast_rope", &ops::fast_rope, "x"_a, "positions"_a, "theta"_a, "inv_freq"_a,
        "interleaved"_a, "rotary_dim"_a, "attention_factor"_a, "out"_a, "tables"_a,
        "rope with llmkernels.rope's arguments, all checked; None when x is not a plain array, "
        "positions or inv_freq (float64) not ndarrays, or out overlaps x (see llmkernels._ops). "
        "tables(positions, inv_freq, attention_factor, dtype) -> (cos, sin), or None.");
}

}  // namespace llmk::bind
