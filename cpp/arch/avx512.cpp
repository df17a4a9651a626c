// Kernels instantiated for avx512 (this file is compiled with the avx512 flags, see CMakeLists.txt).
#include "kernels/instantiate.hpp"

using arch_tag = xsimd::avx512bw;
LLMK_INSTANTIATE(arch_tag)
