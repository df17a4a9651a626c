// Runtime instruction-set selection.
//
// Kernels are compiled once per ISA of common/isa_list.hpp (cpp/arch/arch.cpp.in). At first use
// we pick the best ISA the CPU supports; the environment variable LLMKERNELS_ARCH=<name> forces
// a lower one (a request above what the CPU supports is clamped down, never up: that would
// SIGILL).
#pragma once

#include <string>
#include <vector>
#include <xsimd/xsimd.hpp>

#include "common/isa_list.hpp"

namespace llmk {

#define LLMK_ISA_ENUM(name, tag, flags) name,
enum class Isa { LLMK_ISA_LIST(LLMK_ISA_ENUM) };
#undef LLMK_ISA_ENUM

Isa best_supported_isa();      // what the CPU can run
Isa active_isa();              // what kernels use now (the automatic choice: the best)
void set_active_isa(Isa isa);  // clamped to best_supported_isa(); forces it for every kernel

// Kernel families whose path is chosen by measured speed. In the automatic mode (no
// LLMKERNELS_ARCH, no set_simd_arch since start or since set_isa_automatic) a kernel of a family
// runs on family_isa(family): the active ISA, or a lower one where that family measured faster
// on this CPU. AMD Zen 4 executes 512-bit instructions as two 256-bit halves; there the avx2
// path of RMSNorm / LayerNorm, rope, attention and the quantized float-activation GEMV / GEMM
// was as fast or faster than the avx512 one (benchmarks/bench_dispatch.py, TinyLlama shapes, 1
// and 2 threads: rms_norm up to 1.15x, rope up to 1.14x, causal attention up to 1.15x, decode
// attention up to 1.10x, float-activation quantized GEMV up to 1.37x and prefill 1.35-1.43x
// through the packed route), while the element-wise activations and the float32 / bfloat16
// projections run faster on avx512. The quantized GEMVs (qgemv: gemv_q8 / gemv_q4, decode) have
// no 512-bit code: their avx512 instantiation is the AVX2 source compiled with AVX-512 enabled,
// and it measured as fast or slower on every CPU with AVX-512 -- on Intel Emerald Rapids (full-
// width 512-bit units) up to 1.19x slower with int4 weights or float activations at 1 / 2
// threads (benchmarks/results/emerald_rapids/dispatch.md) -- so they run avx2 on both. On
// Emerald Rapids every other family runs avx512 (quant, i.e. gemm_q, also decides whether the
// decode GEMV of int8 weights runs on VNNI). AMD Zen 5 runs 512-bit instructions whole and
// every family runs avx512 there, though its rope measured faster on avx2 (1.18x / 1.23x at 512
// positions, 2 / 1 threads: benchmarks/results/zen5/dispatch.md): the two paths' rotations
// differ in the last bit, and with the avx2 one the serving test that holds batched replies to
// the single-sequence ones failed 5 runs of 6 on that host, so the switch waits for that to be
// understood. Every other kernel ("other") runs on the
// active ISA.
// Forcing an ISA (LLMKERNELS_ARCH, set_simd_arch) forces it for every family. Results depend
// only on the host, the mode and the thread count. (The timing loop shuffles the paths every
// round: alternating calls that allocate their outputs otherwise gave each path the same
// addresses every round, and a 10-15% bias either way on the norms.)
#define LLMK_FAMILY_LIST(X) X(other) X(norm) X(rope) X(attention) X(quant) X(qgemv) X(packed)
#define LLMK_FAMILY_ENUM(name) name,
enum class Family : int { LLMK_FAMILY_LIST(LLMK_FAMILY_ENUM) count };
#undef LLMK_FAMILY_ENUM
template <class F>
inline constexpr Family kernel_family = Family::other;  // specialized in kernels/ops.hpp
Isa family_isa(Family family);
const char* family_name(Family family);
bool isa_automatic();
void set_isa_automatic();  // the best ISA with the per-family choice (as at start without env)
bool cpu_splits_512();     // AMD family 19h with AVX-512 (Zen 4)
bool cpu_is_intel();       // GenuineIntel
const char* isa_name(Isa isa);
bool parse_isa(const std::string& name, Isa* isa);
std::vector<std::string> isa_names();  // every ISA of the list, lowest first

// Calls f(ArchTag{}, args...) for the active ISA. Every kernel functor has an explicit
// instantiation for each tag of the list (kernels/instantiate.hpp), so this is a plain switch.
// Arguments are validated before this point: kernels assume valid input. Kernels neither
// allocate nor throw: their scratch is allocated by the calling thread before the parallel
// region (common/scratch.hpp). dispatch is deliberately not noexcept, so should a kernel ever
// throw, the exception travels to the thread pool, which stops the job and rethrows it in the
// caller instead of calling std::terminate.
template <class F, class... Args>
void dispatch(const F& f, Args... args) {
  constexpr Family family = kernel_family<F>;
  switch (family == Family::other ? active_isa() : family_isa(family)) {
#define LLMK_ISA_CASE(name, tag, flags) \
  case Isa::name:                       \
    f(tag{}, args...);                  \
    break;
    LLMK_ISA_LIST(LLMK_ISA_CASE)
#undef LLMK_ISA_CASE
  }
}

}  // namespace llmk
