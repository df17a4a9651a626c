// Kernels instantiated for sse2 (this file is compiled with the sse2 flags, see CMakeLists.txt).
#include "kernels/instantiate.hpp"

using arch_tag = xsimd::sse2;
LLMK_INSTANTIATE(arch_tag)
