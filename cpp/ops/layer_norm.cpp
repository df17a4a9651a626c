// layer_norm: out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight + bias
// (kernels/layer_norm.hpp)
#include "kernels/ops.hpp"
#include "ops/norm.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {

py::object layer_norm(py::handle x, py::handle weight, py::handle bias, py::handle eps,
                      py::handle out, Entry entry) {
  return norm_entry<2>("layer_norm", layer_norm_kernel{}, x, {{{"weight", weight}, {"bias", bias}}},
                       eps, out, entry, 2.0);
}

}  // namespace llmk::ops
