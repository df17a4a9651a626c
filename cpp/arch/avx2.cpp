// Kernels instantiated for avx2 (this file is compiled with the avx2 flags, see CMakeLists.txt).
#include "kernels/instantiate.hpp"

using arch_tag = xsimd::fma3<xsimd::avx2>;
LLMK_INSTANTIATE(arch_tag)
