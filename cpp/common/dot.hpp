// Dot-product extensions beyond the xsimd ISA list (common/isa_list.hpp): instructions xsimd 8.1
// has no architecture for, used by a few kernels through intrinsics in their own translation
// units (cpp/arch/dot_*.cpp, each built with its flags).
//
// Int8Dot: the int8 x int8 -> int32 product of the int8-activation prefill of int8 / int4
// weights (kernels/quant_vnni.hpp):
//   vnni        vpdpbusd, AVX512_VNNI + AVX512VL (Intel Ice Lake / Sapphire Rapids and later,
//               AMD Zen 4 and later); chosen automatically when the CPU has it and the active
//               xsimd path is avx512 (LLMKERNELS_ARCH=avx2 or sse2 turns it off).
//   vnni_simde  the same source compiled on the AVX2 baseline against SIMDe's portable
//               vpdpbusd: slow, never chosen automatically; it lets the test suite run the VNNI
//               kernel, and compare it bit for bit, on any AVX2 host.
//   none        the existing paths (the float-activation packed GEMM for prefill).
// LLMKERNELS_INT8_DOT=none|vnni|vnni_simde forces one (vnni only where the CPU has it).
#pragma once

#include <string>

#include "kernels/quant_types.hpp"

namespace llmk {

enum class Int8Dot : int { none = 0, vnni = 1, vnni_simde = 2 };

bool cpu_has_avx512_vnni();           // AVX512_VNNI and AVX512VL (cpuid), and OS-enabled AVX-512
Int8Dot int8_dot();                   // the one int8 prefill uses now
void set_int8_dot(Int8Dot dot);       // forced (vnni clamped to none without the CPU support)
void set_int8_dot_auto();             // back to the automatic choice
const char* int8_dot_name(Int8Dot dot);
bool parse_int8_dot(const std::string& name, Int8Dot* dot);
bool int8_dot_available(Int8Dot dot);  // runnable here (vnni_simde: built with SIMDe)

namespace dot {
// y (m, rows) (+)= x . W_deq^T (+ bias) with int8 activations prepared as for the AVX2 GEMV
// (qgemv_args.act), any m: kernels/quant_vnni.hpp natively / against SIMDe
void qgemm_int8_acts_vnni(const qgemv_args& a, int bits);
void qgemm_int8_acts_vnni_simde(const qgemv_args& a, int bits);
}  // namespace dot

}  // namespace llmk
