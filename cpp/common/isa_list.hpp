// The instruction sets the kernels are compiled for, lowest first: X(name, xsimd tag, compiler
// flags). This is the one list: common/isa.hpp derives the Isa enum, the names and the dispatch
// switch from it, CMakeLists.txt reads it (the X( lines) to generate one translation unit per
// entry (cpp/arch/arch.cpp.in, compiled with the entry's flags), and Python sees the names as
// _core.isa_names. Adding an ISA is one line here. F16C (float16 weights, kernels/weight16.hpp)
// is on every AVX2 CPU, so the AVX2 and AVX-512 entries enable it.
#pragma once

#define LLMK_ISA_LIST(X)                                                               \
  X(sse2, xsimd::sse2, "-msse2")                                                       \
  X(avx2, xsimd::fma3<xsimd::avx2>, "-mavx2 -mfma -mf16c")                             \
  X(avx512, xsimd::avx512bw, "-mavx512f -mavx512cd -mavx512dq -mavx512bw -mavx2 -mfma -mf16c")
