#include "common/isa.hpp"

#include <atomic>
#include <cstdlib>

namespace llmk {
namespace {

Isa detect() {
  auto avail = xsimd::available_architectures();
  if (avail.avx512bw) return Isa::avx512;
  if (avail.avx2 && avail.fma3_avx2) return Isa::avx2;
  return Isa::sse2;
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

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    default:
      return "sse2";
  }
}

bool parse_isa(const std::string& name, Isa* isa) {
  if (name == "sse2" || name == "sse") {
    *isa = Isa::sse2;
  } else if (name == "avx2" || name == "fma3") {
    *isa = Isa::avx2;
  } else if (name == "avx512" || name == "avx512bw") {
    *isa = Isa::avx512;
  } else {
    return false;
  }
  return true;
}

}  // namespace llmk
