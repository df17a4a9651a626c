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

// AVX512_BF16: cpuid 7.1 eax bit 5 (with AVX512F and the OS state as above)
bool detect_bf16() {
  if (!detect_vnni()) return false;  // (every AVX512_BF16 CPU has VNNI and VL)
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  if (a < 1) return false;
  __cpuid_count(7, 1, a, b, c, d);
  return a & (1u << 5);
}

constexpr const char* kNames[] = {"none", "vnni", "vnni_simde"};
constexpr const char* kBf16Names[] = {"none", "avx512bf16", "bf16_simde"};

std::atomic<int>& bf16_forced_slot() {
  static std::atomic<int> slot{[] {
    Bf16Dot dot;
    const char* env = std::getenv("LLMKERNELS_BF16_DOT");
    if (env && parse_bf16_dot(env, &dot)) return bf16_dot_available(dot) ? int(dot) : 0;
    return -1;
  }()};
  return slot;
}

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

bool cpu_has_avx512_bf16() {
  static const bool has = detect_bf16();
  return has;
}

bool bf16_dot_available(Bf16Dot dot) {
  return dot != Bf16Dot::avx512bf16 || cpu_has_avx512_bf16();
}

Bf16Dot bf16_dot() {
  const int forced = bf16_forced_slot().load(std::memory_order_relaxed);
  if (forced >= 0) return static_cast<Bf16Dot>(forced);
  return cpu_has_avx512_bf16() && active_isa() == Isa::avx512 ? Bf16Dot::avx512bf16
                                                              : Bf16Dot::none;
}

void set_bf16_dot(Bf16Dot dot) {
  bf16_forced_slot().store(bf16_dot_available(dot) ? int(dot) : 0, std::memory_order_relaxed);
}

void set_bf16_dot_auto() { bf16_forced_slot().store(-1, std::memory_order_relaxed); }

const char* bf16_dot_name(Bf16Dot dot) { return kBf16Names[static_cast<int>(dot)]; }

bool parse_bf16_dot(const std::string& name, Bf16Dot* dot) {
  for (int i = 0; i < 3; ++i)
    if (name == kBf16Names[i]) return *dot = static_cast<Bf16Dot>(i), true;
  return false;
}

namespace dot {
// the two builds of kernels/gemm_bf16.hpp (cpp/arch/dot_bf16*.cpp); the choice is made here, in
// a unit built for the baseline ISA (the AVX-512 unit's own code never runs on a CPU without it)
#define LLMK_BF16_ENTRIES(ns)                                                                  \
  namespace ns {                                                                               \
  void round_x(std::uint16_t* xb, std::size_t kp, const float* x, std::size_t ldx,           \
               std::size_t m, std::size_t k);                                                 \
  void block(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp,             \
             std::size_t m, const std::uint16_t* w, std::size_t k, std::size_t nc,           \
             bool accumulate, const float* bias, std::uint32_t* wpack);                       \
  }
LLMK_BF16_ENTRIES(bf16_native_entry)
LLMK_BF16_ENTRIES(bf16_simde_entry)
#undef LLMK_BF16_ENTRIES

void round_x_bf16(Bf16Dot dot, std::uint16_t* xb, std::size_t kp, const float* x, std::size_t ldx,
                  std::size_t m, std::size_t k) {
  if (dot == Bf16Dot::avx512bf16)
    bf16_native_entry::round_x(xb, kp, x, ldx, m, k);
  else
    bf16_simde_entry::round_x(xb, kp, x, ldx, m, k);
}

void gemm_bf16_block(Bf16Dot dot, float* y, std::size_t ldy, const std::uint16_t* xb,
                     std::size_t kp, std::size_t m, const std::uint16_t* w, std::size_t k,
                     std::size_t nc, bool accumulate, const float* bias, std::uint32_t* wpack) {
  if (dot == Bf16Dot::avx512bf16)
    bf16_native_entry::block(y, ldy, xb, kp, m, w, k, nc, accumulate, bias, wpack);
  else
    bf16_simde_entry::block(y, ldy, xb, kp, m, w, k, nc, accumulate, bias, wpack);
}
}  // namespace dot

}  // namespace llmk
