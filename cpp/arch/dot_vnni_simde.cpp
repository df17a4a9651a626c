// kernels/quant_vnni.hpp built on the AVX2 baseline against SIMDe's portable vpdpbusd (test
// path: the same source as dot_vnni.cpp, runnable on any AVX2 host; integer sums are exact, so
// its results equal the native ones bit for bit); the AMX kernel on the emulated tiles of
// kernels/amx.hpp (the same: exact integer sums, then the same float arithmetic).
#define LLMK_DOT_NS vnni_simde
#define LLMK_DOT_ENTRY simde_entry
#define LLMK_DOT_SIMDE 1
#define LLMK_AMX_EMU 1
#include "common/dot.hpp"
#include "kernels/quant_vnni.hpp"
