// Runtime instruction-set selection.
//
// Kernels are compiled once per ISA (cpp/arch/*.cpp). At first use we pick the best ISA the
// CPU supports; the environment variable LLMKERNELS_ARCH=sse2|avx2|avx512 forces a lower one
// (a request above what the CPU supports is clamped down, never up: that would SIGILL).
#pragma once

#include <string>

#include <xsimd/xsimd.hpp>

namespace llmk {

enum class Isa { sse2 = 0, avx2 = 1, avx512 = 2 };

// The xsimd architecture tag behind each Isa value.
using arch_sse2 = xsimd::sse2;
using arch_avx2 = xsimd::fma3<xsimd::avx2>;
using arch_avx512 = xsimd::avx512bw;

Isa best_supported_isa();        // what the CPU can run
Isa active_isa();                // what kernels use now
void set_active_isa(Isa isa);    // clamped to best_supported_isa()
const char* isa_name(Isa isa);
bool parse_isa(const std::string& name, Isa* isa);

// Calls f(ArchTag{}, args...) for the active ISA. Every kernel functor has an explicit
// instantiation for the three tags (cpp/arch/*.cpp), so this is a plain switch. Arguments are
// validated before this point: kernels assume valid input. Kernels neither allocate nor throw:
// their scratch is allocated by the calling thread before the parallel region
// (common/scratch.hpp). dispatch is deliberately not noexcept, so should a kernel ever throw,
// the exception travels to the thread pool, which stops the job and rethrows it in the caller
// instead of calling std::terminate.
template <class F, class... Args>
void dispatch(const F& f, Args... args) {
  switch (active_isa()) {
    case Isa::avx512:
      f(arch_avx512{}, args...);
      break;
    case Isa::avx2:
      f(arch_avx2{}, args...);
      break;
    default:
      f(arch_sse2{}, args...);
      break;
  }
}

}  // namespace llmk
