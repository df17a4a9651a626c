// AMX tiles (Intel Sapphire Rapids and later): eight 2-D registers of up to 16 rows x 64 bytes
// and one multiply-accumulate of a whole tile product per instruction -- tdpbf16ps (bf16 pairs
// -> float32, 16 x 16 x 32 multiply-adds) and tdpbssd (s8 x s8 quadruples -> int32, up to
// 16 x 16 x 64). The kernels shape the tiles
// (palette 1) and name them by number: tiles 0-3 C (float32 / int32 sums, 16 tokens x 16
// features each), 4-5 A (16 tokens x k), 6-7 B (k in pairs / quadruples x 16 features, the
// "VNNI" layout).
//
// Built natively (-mamx-tile -mamx-bf16 -mamx-int8: the intrinsics) or, with LLMK_AMX_EMU, on
// a portable emulation of the same instructions written from their pseudo-code in Intel's
// Architecture Instruction Set Extensions Programming Reference: the test suite runs the AMX
// kernels through it on every host (slow, scalar), and on an AMX host compares the two.
// tdpbssd's integer sums are exact: the emulation equals the hardware bit for bit. tdpbf16ps
// treats bf16 subnormal inputs as zero, flushes subnormal results and rounds each float32 add
// to nearest even; the emulation does the same, adding a pair's two products one after the
// other (the odd element's first, in the order of vdpbf16ps: on normal numbers the emulated
// AMX kernel equals the vdpbf16ps kernel bit for bit). The hardware orders the adds of a row
// otherwise (measured: it differs from both in the last bits), so the tests hold native and
// emulated AMX to the float32 bound of the sum, not to bit equality.
//
// Linux hands out the tile state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM):
// common/dot.cpp asks once before the first native use, and chooses the AMX paths only where
// it was granted. Each call of a kernel configures the tiles of its thread (amx::Session) and
// leaves them as it found them: released (tilerelease: the thread's context switches stop saving
// 8 KiB of tiles), or -- when another library in the process had configured them -- that
// library's configuration loaded again. (llama.cpp configures a thread's tiles once and remembers
// it: released under it, its next tile instruction faulted with SIGILL in the same process.)
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

constexpr int kRows = 16;      // rows of a whole tile
constexpr int kRowBytes = 64;  // bytes of a whole tile row

// ldtilecfg's 64-byte operand (palette 1): every tile 16 rows x 64 bytes unless shaped. The
// kernels load constant configurations (kWholeTiles, kInt8Tiles below: read-only data), never
// one built on the stack: GCC does not see ldtilecfg read its operand and may drop the stores
// that fill it (the tiles then stay unconfigured and the next tile instruction faults).
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
  constexpr TileConfig() {
    for (int i = 0; i < 8; ++i) colsb[i] = kRowBytes, rows[i] = kRows;
  }
  constexpr TileConfig shaped(int tile, int nrows, int nbytes) const {
    TileConfig c = *this;
    c.rows[tile] = static_cast<std::uint8_t>(nrows);
    c.colsb[tile] = static_cast<std::uint16_t>(nbytes);
    return c;
  }
};
// every tile whole (the bf16 kernel)
inline constexpr TileConfig kWholeTiles{};
// the int8 kernel: C tiles 0-3 whole, A tiles 4-5 16 tokens x one block (32 bytes), B tiles 6-7
// one block's 8 quadruple rows x 16 features
inline constexpr TileConfig kInt8Tiles =
    TileConfig{}.shaped(4, 16, 32).shaped(5, 16, 32).shaped(6, 8, 64).shaped(7, 8, 64);

#if !defined(LLMK_AMX_EMU)
// The tiles configured for one kernel call on this thread; the thread's previous configuration
// (sttilecfg: all zero when none) restored at the end, or the tiles released.
class Session {
 public:
  explicit Session(const TileConfig& config) {
    _tile_storeconfig(&saved_);
    asm volatile("" ::: "memory");  // (the compiler does not see sttilecfg write saved_)
    had_ = saved_.palette != 0;
    _tile_loadconfig(&config);
  }
  ~Session() {
    if (had_) {
      asm volatile("" ::: "memory");
      _tile_loadconfig(&saved_);
    } else {
      _tile_release();
    }
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

 private:
  TileConfig saved_;
  bool had_;
};
#define LLMK_TILE_ZERO(t) _tile_zero(t)
#define LLMK_TILE_LOAD(t, p, stride) _tile_loadd(t, p, static_cast<long>(stride))
#define LLMK_TILE_STORE(t, p, stride) _tile_stored(t, p, static_cast<long>(stride))
#define LLMK_TILE_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)
#define LLMK_TILE_DPBSSD(c, a, b) _tile_dpbssd(c, a, b)
#else
// The eight tiles of this thread and their shapes
struct Tiles {
  TileConfig config;
  alignas(64) unsigned char t[8][kRows * kRowBytes];
};
inline Tiles& tiles() {
  thread_local Tiles state;
  return state;
}
class Session {
 public:
  explicit Session(const TileConfig& config) {
    std::memset(tiles().t, 0, sizeof tiles().t);
    tiles().config = config;
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};
inline void zero(int t) { std::memset(tiles().t[t], 0, sizeof tiles().t[t]); }
inline void load(int t, const void* p, std::size_t stride) {
  const TileConfig& c = tiles().config;
  std::memset(tiles().t[t], 0, sizeof tiles().t[t]);  // (rows and bytes past the shape: 0)
  for (int r = 0; r < c.rows[t]; ++r)
    std::memcpy(tiles().t[t] + r * kRowBytes, static_cast<const unsigned char*>(p) + r * stride,
                c.colsb[t]);
}
inline void store(int t, void* p, std::size_t stride) {
  const TileConfig& c = tiles().config;
  for (int r = 0; r < c.rows[t]; ++r)
    std::memcpy(static_cast<unsigned char*>(p) + r * stride, tiles().t[t] + r * kRowBytes,
                c.colsb[t]);
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
// C (M x N float32) += A (M x K pairs of bf16) . B (K rows x N pairs); M = rows of C, N =
// its bytes / 4, K = A's bytes / 4
inline void dpbf16ps(int c, int a, int b) {
  Tiles& s = tiles();
  const int M = s.config.rows[c], N = s.config.colsb[c] / 4, K = s.config.colsb[a] / 4;
  for (int m = 0; m < M; ++m) {
    float* crow = reinterpret_cast<float*>(s.t[c] + m * kRowBytes);
    const auto* arow = reinterpret_cast<const std::uint16_t*>(s.t[a] + m * kRowBytes);
    for (int k = 0; k < K; ++k) {
      const auto* brow = reinterpret_cast<const std::uint16_t*>(s.t[b] + k * kRowBytes);
      const float a0 = bf16_daz(arow[2 * k]), a1 = bf16_daz(arow[2 * k + 1]);
      for (int n = 0; n < N; ++n) {
        crow[n] = ftz(crow[n] + a1 * bf16_daz(brow[2 * n + 1]));
        crow[n] = ftz(crow[n] + a0 * bf16_daz(brow[2 * n]));
      }
    }
  }
}
// C (M x N int32) += A (M x K quadruples of s8) . B (K rows x N quadruples of s8), wrapping as
// the hardware does (exact for the kernels' sums)
inline void dpbssd(int c, int a, int b) {
  Tiles& s = tiles();
  const int M = s.config.rows[c], N = s.config.colsb[c] / 4, K = s.config.colsb[a] / 4;
  for (int m = 0; m < M; ++m) {
    auto* crow = reinterpret_cast<std::int32_t*>(s.t[c] + m * kRowBytes);
    const auto* arow = reinterpret_cast<const std::int8_t*>(s.t[a] + m * kRowBytes);
    for (int k = 0; k < K; ++k) {
      const auto* brow = reinterpret_cast<const std::int8_t*>(s.t[b] + k * kRowBytes);
      for (int n = 0; n < N; ++n) {
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
#define LLMK_TILE_DPBSSD(c, a, b) amx::dpbssd(c, a, b)
#endif

}  // namespace amx
}  // namespace LLMK_DOT_NS
}  // namespace llmk
