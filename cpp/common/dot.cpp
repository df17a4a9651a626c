#include "common/dot.hpp"

#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <cstdlib>
#include <vector>

#include "common/isa.hpp"

namespace llmk {
namespace {

// AVX512_VNNI (cpuid 7.0 ecx bit 11) with AVX512F / DQ / CD / BW / VL (7.0 ebx bits 16, 17,
// 28, 30, 31: the units are built with all of them), the OS saving the AVX-512 state (xgetbv:
// XMM, YMM, opmask, ZMM halves = bits 1, 2, 5, 6, 7)
bool detect_vnni() {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0xe6u) != 0xe6u) return false;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned need = (1u << 16) | (1u << 17) | (1u << 28) | (1u << 30) | (1u << 31);
  return (b & need) == need && (c & (1u << 11));
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

// AMX-TILE, AMX-BF16 and AMX-INT8 (cpuid 7.0 edx bits 24, 22, 25) with AVX512_BF16, the OS
// saving the tile state (XCR0 bits 17, 18), and Linux granting this process the tile data
// (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA: asked once, here; a child forked later
// keeps the grant)
bool detect_amx() {
  if (!detect_bf16()) return false;
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned need = (1u << 22) | (1u << 24) | (1u << 25);
  if ((d & need) != need) return false;
  unsigned lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & 0x60000u) != 0x60000u) return false;
#if defined(__linux__)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

bool always() { return true; }

// the portable twins (SIMDe, emulated tiles) are built on the AVX2 baseline
bool runs_twins() { return best_supported_isa() >= Isa::avx2; }

// One value of a dot-product choice: its name, whether this CPU can run it, and whether the
// automatic choice may take it (the native instructions; never "none" nor a portable twin)
struct DotValue {
  const char* name;
  bool (*runs)();
  int rank;  // the automatic choice takes the highest the CPU runs (0: never automatic)
  Isa isa = Isa::avx512;  // ... and only where this xsimd path (or a higher one) is active
  bool (*suits)() = always;  // ... and this CPU suits it (which of two widths)
};

bool splits_512() { return cpu_splits_512(); }
bool full_512() { return !cpu_splits_512(); }

// One dot-product choice (Int8Dot or Bf16Dot alike): value 0 is none. Forced by the environment
// variable (read at first use) or a setter, else automatic: the highest-ranked value the CPU
// runs whose xsimd path is active.
struct DotChoice {
  const char* env;
  std::vector<DotValue> values;
  std::atomic<int> forced{-2};  // -2: the environment not read yet; -1: automatic

  bool available(int v) const {
    return v >= 0 && v < static_cast<int>(values.size()) && values[v].runs();
  }
  bool parse(const std::string& name, int* v) const {
    for (std::size_t i = 0; i < values.size(); ++i)
      if (name == values[i].name) return *v = static_cast<int>(i), true;
    return false;
  }
  int active() {
    int f = forced.load(std::memory_order_relaxed);
    if (f == -2) {  // first use: the environment (a lost race stores the same value)
      int v;
      const char* e = std::getenv(env);
      f = e && parse(e, &v) ? (available(v) ? v : 0) : -1;
      int expected = -2;
      forced.compare_exchange_strong(expected, f, std::memory_order_relaxed);
      f = forced.load(std::memory_order_relaxed);
    }
    if (f >= 0) return f;
    return automatic_value(active_isa());
  }
  // (per choice: each has its own list; the CPU checks are cached by their functions)
  int automatic_value(Isa isa) const {
    int v = 0, rank = 0;
    for (std::size_t i = 0; i < values.size(); ++i)
      if (values[i].rank > rank && isa >= values[i].isa && values[i].runs() &&
          values[i].suits())
        v = static_cast<int>(i), rank = values[i].rank;
    return v;
  }
  void force(int v) { forced.store(available(v) ? v : 0, std::memory_order_relaxed); }
  void automatic() { forced.store(-1, std::memory_order_relaxed); }
};

// the two choices, each value {name, runs here, automatic rank[, lowest xsimd path]}
DotChoice* choices() {
  static DotChoice c[2] = {
      {"LLMKERNELS_INT8_DOT",
       {{"none", always, 0}, {"vnni", cpu_has_avx512_vnni, 2, Isa::avx512, splits_512},
        {"vnni_simde", runs_twins, 0}, {"amx", cpu_has_amx, 3}, {"amx_emu", runs_twins, 0},
        {"avx2", runs_twins, 1, Isa::avx2},
        {"vnni512", cpu_has_avx512_vnni, 2, Isa::avx512, full_512},
        {"vnni512_simde", runs_twins, 0}}},
      {"LLMKERNELS_BF16_DOT",
       {{"none", always, 0}, {"avx512bf16", cpu_has_avx512_bf16, 1}, {"bf16_simde", runs_twins, 0},
        {"amx", cpu_has_amx, 2}, {"amx_emu", runs_twins, 0}}}};
  return c;
}
DotChoice& int8_choice() { return choices()[0]; }
DotChoice& bf16_choice() { return choices()[1]; }

std::vector<std::string> names_of(const DotChoice& c) {
  std::vector<std::string> names;
  for (const DotValue& v : c.values) names.emplace_back(v.name);
  return names;
}

}  // namespace

bool cpu_has_avx512_vnni() {
  static const bool has = detect_vnni();
  return has;
}

bool cpu_has_avx512_bf16() {
  static const bool has = detect_bf16();
  return has;
}

bool cpu_has_amx() {
  static const bool has = detect_amx();
  return has;
}

// The accessors of one choice (common/dot.hpp): fn() the active value, set_fn(), set_fn_auto(),
// fn_name(), fn_names(), fn_available(), parse_fn()
#define LLMK_DOT_ACCESSORS(E, fn, choice)                                                          \
  E fn() { return static_cast<E>(choice().active()); }                                             \
  void set_##fn(E dot) { choice().force(static_cast<int>(dot)); }                                  \
  void set_##fn##_auto() { choice().automatic(); }                                                 \
  const char* fn##_name(E dot) { return choice().values[static_cast<int>(dot)].name; }             \
  std::vector<std::string> fn##_names() { return names_of(choice()); }                             \
  bool fn##_available(E dot) { return choice().available(static_cast<int>(dot)); }                 \
  bool parse_##fn(const std::string& s, E* dot) {                                                  \
    int v;                                                                                         \
    return choice().parse(s, &v) ? (*dot = static_cast<E>(v), true) : false;                       \
  }
LLMK_DOT_ACCESSORS(Int8Dot, int8_dot, int8_choice)
LLMK_DOT_ACCESSORS(Bf16Dot, bf16_dot, bf16_choice)
#undef LLMK_DOT_ACCESSORS

namespace dot {
// the three builds of kernels/quant_vnni.hpp (cpp/arch/dot_vnni*.cpp, dot_avx2.cpp)
#define LLMK_INT8_ENTRIES(ns)                                                                      \
  namespace ns {                                                                                   \
  void qgemm(const qgemv_args& a, int bits, std::uint8_t* pack);                                   \
  void qgemm_amx(const qgemv_args& a, int bits, std::uint8_t* pack);                               \
  void qgemm512(const qgemv_args& a, int bits, std::uint8_t* pack);                                \
  void gemv(const qgemv_args& a);                                                                  \
  void gemv4(const qgemv_args& a);                                                                 \
  }
LLMK_INT8_ENTRIES(native_entry)
LLMK_INT8_ENTRIES(simde_entry)
LLMK_INT8_ENTRIES(avx2_entry)  // (qgemm only)
#undef LLMK_INT8_ENTRIES

void qgemm_int8_acts(Int8Dot dot, const qgemv_args& a, int bits, std::uint8_t* pack) {
  switch (dot) {
    case Int8Dot::vnni:
      return native_entry::qgemm(a, bits, pack);
    case Int8Dot::amx:
      return native_entry::qgemm_amx(a, bits, pack);
    case Int8Dot::amx_emu:
      return simde_entry::qgemm_amx(a, bits, pack);
    case Int8Dot::vnni512:
      return native_entry::qgemm512(a, bits, pack);
    case Int8Dot::vnni512_simde:
      return simde_entry::qgemm512(a, bits, pack);
    case Int8Dot::avx2:
      return avx2_entry::qgemm(a, bits, pack);
    default:
      return simde_entry::qgemm(a, bits, pack);
  }
}

void qgemv_int8_vnni(bool twin, const qgemv_args& a) {
  (twin ? simde_entry::gemv : native_entry::gemv)(a);
}

void qgemv_int4_vnni(bool twin, const qgemv_args& a) {
  (twin ? simde_entry::gemv4 : native_entry::gemv4)(a);
}

// the two builds of kernels/gemm_bf16.hpp (cpp/arch/dot_bf16*.cpp); the choice is made here, in
// a unit built for the baseline ISA (the AVX-512 unit's own code never runs on a CPU without it)
#define LLMK_BF16_ENTRIES(ns)                                                                      \
  namespace ns {                                                                                   \
  void round_x(std::uint16_t* xb, std::size_t kp, std::size_t ldxb, const float* x,                \
               std::size_t ldx, std::size_t m, std::size_t k);                                     \
  void block(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp, std::size_t ldxb, \
             std::size_t m, const std::uint16_t* w, std::size_t k, std::size_t nc,                 \
             bool accumulate, const float* bias, std::uint32_t* wpack);                            \
  void block_amx(float* y, std::size_t ldy, const std::uint16_t* xb, std::size_t kp,               \
                 std::size_t ldxb, std::size_t m, const std::uint16_t* w, std::size_t k,           \
                 std::size_t nc, bool accumulate, const float* bias, std::uint32_t* wpack);        \
  }
LLMK_BF16_ENTRIES(bf16_native_entry)
LLMK_BF16_ENTRIES(bf16_simde_entry)
#undef LLMK_BF16_ENTRIES

// (dot is not none: the driver calls these only then)
void round_x_bf16(Bf16Dot dot, std::uint16_t* xb, std::size_t kp, std::size_t ldxb,
                  const float* x, std::size_t ldx, std::size_t m, std::size_t k) {
  if (dot == Bf16Dot::avx512bf16 || dot == Bf16Dot::amx)
    bf16_native_entry::round_x(xb, kp, ldxb, x, ldx, m, k);
  else
    bf16_simde_entry::round_x(xb, kp, ldxb, x, ldx, m, k);
}

void gemm_bf16_block(Bf16Dot dot, float* y, std::size_t ldy, const std::uint16_t* xb,
                     std::size_t kp, std::size_t ldxb, std::size_t m, const std::uint16_t* w,
                     std::size_t k, std::size_t nc, bool accumulate, const float* bias,
                     std::uint32_t* wpack) {
  const auto fn = dot == Bf16Dot::avx512bf16 ? bf16_native_entry::block
                  : dot == Bf16Dot::amx        ? bf16_native_entry::block_amx
                  : dot == Bf16Dot::amx_emu    ? bf16_simde_entry::block_amx
                                               : bf16_simde_entry::block;
  fn(y, ldy, xb, kp, ldxb, m, w, k, nc, accumulate, bias, wpack);
}
}  // namespace dot

}  // namespace llmk
