#include "common/isa.hpp"

#include <atomic>
#include <cstdlib>

namespace llmk {
namespace {

struct IsaInfo {
  Isa isa;
  const char* name;
  unsigned version;  // xsimd's ordering of architectures
};
#define LLMK_ISA_INFO(name, tag, flags) {Isa::name, #name, tag::version()},
constexpr IsaInfo kIsas[] = {LLMK_ISA_LIST(LLMK_ISA_INFO)};
#undef LLMK_ISA_INFO

// Other spellings LLMKERNELS_ARCH and set_simd_arch accept (xsimd's names of the same paths).
struct Alias {
  const char* name;
  Isa isa;
};
constexpr Alias kAliases[] = {{"sse", Isa::sse2}, {"fma3", Isa::avx2}, {"avx512bw", Isa::avx512}};

// the best ISA of the list whose xsimd architecture the CPU supports
Isa detect() {
  const unsigned best = xsimd::available_architectures().best;
  Isa isa = kIsas[0].isa;
  for (const IsaInfo& info : kIsas)
    if (info.version <= best) isa = info.isa;
  return isa;
}

Isa initial_isa() {
  Isa isa = best_supported_isa();
  if (const char* env = std::getenv("LLMKERNELS_ARCH")) {
    Isa wanted;
    if (parse_isa(env, &wanted) && wanted < isa) isa = wanted;
  }
  return isa;
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}

}  // namespace

Isa best_supported_isa() {
  static const Isa best = detect();
  return best;
}

Isa active_isa() { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  if (isa > best_supported_isa()) isa = best_supported_isa();
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

const char* isa_name(Isa isa) { return kIsas[static_cast<int>(isa)].name; }

bool parse_isa(const std::string& name, Isa* isa) {
  for (const IsaInfo& info : kIsas)
    if (name == info.name) return *isa = info.isa, true;
  for (const Alias& alias : kAliases)
    if (name == alias.name) return *isa = alias.isa, true;
  return false;
}

std::vector<std::string> isa_names() {
  std::vector<std::string> names;
  for (const IsaInfo& info : kIsas) names.emplace_back(info.name);
  return names;
}

}  // namespace llmk
