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
Isa active_isa();              // what kernels use now
void set_active_isa(Isa isa);  // clamped to best_supported_isa()
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
  switch (active_isa()) {
#define LLMK_ISA_CASE(name, tag, flags) \
  case Isa::name:                       \
    f(tag{}, args...);                  \
    break;
    LLMK_ISA_LIST(LLMK_ISA_CASE)
#undef LLMK_ISA_CASE
  }
}

}  // namespace llmk
