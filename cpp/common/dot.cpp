#include "common/dot.hpp"

#include <cpuid.h>

#include <atomic>
#include <cstdlib>

#include "common/isa.hpp"

namespace llmk {
namespace {

// AVX512_VNNI (cpuid 7.0 ecx bit 11) and AVX512VL (7.0 ebx bit 31), with the OS saving the
// AVX-512 state (xgetbv: XMM, YMM, opmask, ZMM halves = bits 1, 2, 5, 6, 7)
bool detect_vnni() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xe6u) != 0xe6u) return false;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx512f = b & (1u << 16), avx512vl = b & (1u << 31), vnni = c & (1u << 11);
  return avx512f && avx512vl && vnni;
}

constexpr const char* kNames[] = {"none", "vnni", "vnni_simde"};

// -1: automatic; else a forced Int8Dot
std::atomic<int>& forced_slot() {
  static std::atomic<int> slot{[] {
    Int8Dot dot;
    const char* env = std::getenv("LLMKERNELS_INT8_DOT");
    if (env && parse_int8_dot(env, &dot)) return int8_dot_available(dot) ? int(dot) : 0;
    return -1;
  }()};
  return slot;
}

}  // namespace

bool cpu_has_avx512_vnni() {
  static const bool has = detect_vnni();
  return has;
}

bool int8_dot_available(Int8Dot dot) {
  return dot != Int8Dot::vnni || cpu_has_avx512_vnni();
}

Int8Dot int8_dot() {
  const int forced = forced_slot().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Int8Dot>(forced);
  return cpu_has_avx512_vnni() && active_isa() == Isa::avx512 ? Int8Dot::vnni : Int8Dot::none;
}

void set_int8_dot(Int8Dot dot) {
  forced_slot().store(int8_dot_available(dot) ? int(dot) : 0, std::memory_order_relaxed);
}

void set_int8_dot_auto() { forced_slot().store(-1, std::memory_order_relaxed); }

const char* int8_dot_name(Int8Dot dot) { return kNames[static_cast<int>(dot)]; }

bool parse_int8_dot(const std::string& name, Int8Dot* dot) {
  for (int i = 0; i < 3; ++i)
    if (name == kNames[i]) return *dot = static_cast<Int8Dot>(i), true;
  return false;
}

}  // namespace llmk
