// kernels/quant_vnni.hpp's prefill with its integer side on AVX2 (maddubs + madd, the sign
// trick for int8 weights, unsigned nibbles for int4): the int8-activation prefill on CPUs
// without VNNI. Integer sums are exact, so it equals the VNNI kernel -- and the AVX2 GEMV, token
// by token -- bit for bit.
#define LLMK_DOT_NS maddubs_avx2
#define LLMK_DOT_ENTRY avx2_entry
#define LLMK_DOT_MADDUBS 1
#include "common/dot.hpp"
#include "kernels/quant_vnni.hpp"
