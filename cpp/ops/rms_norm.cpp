// rms_norm: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight (kernels/rms_norm.hpp)
#include "kernels/ops.hpp"
#include "ops/norm.hpp"
#include "ops/entry.hpp"

namespace llmk::ops {

py::object rms_norm(py::handle x, py::handle weight, py::handle eps, py::handle out, Entry entry) {
  return norm_entry<1>("rms_norm", rms_norm_kernel{}, x, {{{"weight", weight}}}, eps, out, entry,
                       1.0);
}

}  // namespace llmk::ops
