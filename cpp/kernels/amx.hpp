// AMX tiles (Intel Sapphire Rapids and later): eight 2-D registers of up to 16 rows x 64 bytes
// and one multiply-accumulate of a whole tile product per instruction -- tdpbf16ps (bf16 pairs
// -> float32, 16 x 16 x 32 multiply-adds) and tdpbusd (u8 x s8 quadruples -> int32, 16 x 16 x 64).
// The kernels configure every tile as 16 rows x 64 bytes (palette 1) and name tiles by number:
//   tiles 0-3  C, the float32 / int32 accumulators of a 32 x 32 output block (2 x 2 tiles)
//   tiles 4-5  A, 16 rows (tokens) x 64 bytes of k each
//   tiles 6-7  B, 16 rows (pairs / quadruples of k) x 16 features, "VNNI" layout
//
// Built natively (-mamx-tile -mamx-bf16 -mamx-int8: the intrinsics) or, with LLMK_AMX_EMU, on
// a portable emulation of the same instructions written from their pseudo-code in Intel's
// Architecture Instruction Set Extensions Programming Reference: the test suite runs the AMX
// kernels through it on every host (slow, scalar), and on an AMX host compares the two.
// tdpbusd's integer sums are exact: the emulation equals the hardware bit for bit. tdpbf16ps
// treats bf16 subnormal inputs as zero, flushes subnormal results and rounds each float32 add
// to nearest even; the emulation does the same, adding a pair's two products one after the
// other (the odd element's first, in the order of vdpbf16ps: on normal numbers the emulated
// AMX kernel equals the vdpbf16ps kernel bit for bit). The hardware orders the adds of a row
// otherwise (measured: it differs from both in the last bits), so the tests hold native and
// emulated AMX to the float32 bound of the sum, not to bit equality.
//
// Linux hands out the tile state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM):
// common/dot.cpp asks once before the first native use, and chooses the AMX paths only where
// it was granted. Each call of a kernel configures the tiles of its thread and releases them at
// the end (tilerelease: the thread's context switches stop saving 8 KiB of tiles).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if !defined(LLMK_AMX_EMU)
#include <immintrin.h>
#if !defined(__AMX_TILE__) || !defined(__AMX_BF16__) || !defined(__AMX_INT8__)
#error "amx.hpp: build with -mamx-tile -mamx-bf16 -mamx-int8, or define LLMK_AMX_EMU"
#endif
#endif

namespace llmk {
namespace LLMK_DOT_NS {
namespace amx {

constexpr int kRows = 16;      // rows of every tile
constexpr int kRowBytes = 64;  // bytes of every tile row

// ldtilecfg's 64-byte operand (palette 1)
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
  TileConfig() {
    for (int i = 0; i < 8; ++i) colsb[i] = kRowBytes, rows[i] = kRows;
  }
};

#if !defined(LLMK_AMX_EMU)
inline void configure() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}
inline void release() { _tile_release(); }
#define LLMK_TILE_ZERO(t) _tile_zero(t)
#define LLMK_TILE_LOAD(t, p, stride) _tile_loadd(t, p, static_cast<long>(stride))
#define LLMK_TILE_STORE(t, p, stride) _tile_stored(t, p, static_cast<long>(stride))
#define LLMK_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define LLMK_TILE_DPBUSD(c, a, b) _tile_dpbusd(c, a, b)
#else
// The eight tiles of this thread
struct Tiles {
  alignas(64) unsigned char t[8][kRows * kRowBytes];
};
inline Tiles& tiles() {
  thread_local Tiles state;
  return state;
}
inline void configure() { std::memset(&tiles(), 0, sizeof(Tiles)); }
inline void release() {}
inline void zero(int t) { std::memset(tiles().t[t], 0, sizeof tiles().t[t]); }
inline void load(int t, const void* p, std::size_t stride) {
  for (int r = 0; r < kRows; ++r)
    std::memcpy(tiles().t[t] + r * kRowBytes, static_cast<const unsigned char*>(p) + r * stride,
                kRowBytes);
}
inline void store(int t, void* p, std::size_t stride) {
  for (int r = 0; r < kRows; ++r)
    std::memcpy(static_cast<unsigned char*>(p) + r * stride, tiles().t[t] + r * kRowBytes,
                kRowBytes);
}
// bf16 -> float32, a subnormal input read as a zero of its sign (DAZ)
inline float bf16_daz(std::uint16_t h) {
  std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// a float32 sum rounded to nearest even, a subnormal result flushed to a zero of its sign (FTZ)
inline float ftz(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) == 0) u &= 0x80000000u;
  std::memcpy(&v, &u, 4);
  return v;
}
// C (16 x 16 float32) += A (16 x 32 bf16) . B (16 pairs x 16 x 2 bf16)
inline void dpbf16ps(int c, int a, int b) {
  Tiles& s = tiles();
  for (int m = 0; m < kRows; ++m) {
    float* crow = reinterpret_cast<float*>(s.t[c] + m * kRowBytes);
    const auto* arow = reinterpret_cast<const std::uint16_t*>(s.t[a] + m * kRowBytes);
    for (int k = 0; k < kRows; ++k) {
      const auto* brow = reinterpret_cast<const std::uint16_t*>(s.t[b] + k * kRowBytes);
      const float a0 = bf16_daz(arow[2 * k]), a1 = bf16_daz(arow[2 * k + 1]);
      for (int n = 0; n < 16; ++n) {
        crow[n] = ftz(crow[n] + a1 * bf16_daz(brow[2 * n + 1]));
        crow[n] = ftz(crow[n] + a0 * bf16_daz(brow[2 * n]));
      }
    }
  }
}
// C (16 x 16 int32) += A (16 x 64 u8) . B (16 quadruples x 16 x 4 s8), wrapping as the hardware
inline void dpbusd(int c, int a, int b) {
  Tiles& s = tiles();
  for (int m = 0; m < kRows; ++m) {
    auto* crow = reinterpret_cast<std::int32_t*>(s.t[c] + m * kRowBytes);
    const unsigned char* arow = s.t[a] + m * kRowBytes;
    for (int k = 0; k < kRows; ++k) {
      const auto* brow = reinterpret_cast<const std::int8_t*>(s.t[b] + k * kRowBytes);
      for (int n = 0; n < 16; ++n) {
        std::int32_t sum = 0;
        for (int j = 0; j < 4; ++j) sum += arow[4 * k + j] * brow[4 * n + j];
        crow[n] = static_cast<std::int32_t>(static_cast<std::uint32_t>(crow[n]) +
                                            static_cast<std::uint32_t>(sum));
      }
    }
  }
}
#define LLMK_TILE_ZERO(t) amx::zero(t)
#define LLMK_TILE_LOAD(t, p, stride) amx::load(t, p, stride)
#define LLMK_TILE_STORE(t, p, stride) amx::store(t, p, stride)
#define LLMK_TILE_DPBF16PS(c, a, b) amx::dpbf16ps(c, a, b)
#define LLMK_TILE_DPBUSD(c, a, b) amx::dpbusd(c, a, b)
#endif

}  // namespace amx
}  // namespace LLMK_DOT_NS
}  // namespace llmk
