#include "common/isa.hpp"

#include <cpuid.h>

#include <algorithm>
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

// LLMKERNELS_ARCH, when it names an ISA (forced for every kernel)
bool env_isa(Isa* isa) {
  const char* env = std::getenv("LLMKERNELS_ARCH");
  return env && parse_isa(env, isa);
}

Isa initial_isa() {
  Isa isa = best_supported_isa();
  Isa wanted;
  if (env_isa(&wanted) && wanted < isa) isa = wanted;
  return isa;
}

std::atomic<int>& active_slot() {
  static std::atomic<int> slot{static_cast<int>(initial_isa())};
  return slot;
}

std::atomic<bool>& automatic_slot() {
  static std::atomic<bool> slot{[] {
    Isa ignored;
    return !env_isa(&ignored);
  }()};
  return slot;
}

// The highest ISA each family runs in the automatic mode on this CPU (see isa.hpp)
struct FamilyCaps {
  Isa cap[static_cast<int>(Family::count)];
};
const FamilyCaps& family_caps() {
  static const FamilyCaps caps = [] {
    FamilyCaps c{};
    for (Isa& isa : c.cap) isa = best_supported_isa();
    const auto cap_avx2 = [&](Family f) {
      c.cap[static_cast<int>(f)] = std::min(best_supported_isa(), Isa::avx2);
    };
    cap_avx2(Family::qgemv);  // no 512-bit code (isa.hpp)
    if (cpu_splits_512())
      for (Family f : {Family::norm, Family::rope, Family::attention, Family::quant,
                       Family::packed})
        cap_avx2(f);
    return c;
  }();
  return caps;
}

}  // namespace

Isa best_supported_isa() {
  static const Isa best = detect();
  return best;
}

Isa active_isa() { return static_cast<Isa>(active_slot().load(std::memory_order_relaxed)); }

void set_active_isa(Isa isa) {
  if (isa > best_supported_isa()) isa = best_supported_isa();
  automatic_slot().store(false, std::memory_order_relaxed);
  active_slot().store(static_cast<int>(isa), std::memory_order_relaxed);
}

bool isa_automatic() { return automatic_slot().load(std::memory_order_relaxed); }

void set_isa_automatic() {
  active_slot().store(static_cast<int>(best_supported_isa()), std::memory_order_relaxed);
  automatic_slot().store(true, std::memory_order_relaxed);
}

Isa family_isa(Family family) {
  const Isa active = active_isa();
  if (!isa_automatic()) return active;
  return std::min(active, family_caps().cap[static_cast<int>(family)]);
}

const char* family_name(Family family) {
#define LLMK_FAMILY_NAME(name) #name,
  static const char* const names[] = {LLMK_FAMILY_LIST(LLMK_FAMILY_NAME)};
#undef LLMK_FAMILY_NAME
  return names[static_cast<int>(family)];
}

bool cpu_splits_512() {
  static const bool splits = [] {
    if (best_supported_isa() < Isa::avx512) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    const bool amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;  // AuthenticAMD
    if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned base = (a >> 8) & 0xf, ext = (a >> 20) & 0xff;
    const unsigned family = base == 0xf ? base + ext : base;
    return family == 0x19;  // Zen 3 and Zen 4; of them only Zen 4 has AVX-512
  }();
  return splits;
}

bool cpu_is_intel() {
  static const bool intel = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    return b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // GenuineIntel
  }();
  return intel;
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
