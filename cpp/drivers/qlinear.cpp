// The quantized-weight drivers (no Python): the group-wise int8 / int4 quantizer and its inverse
// (quantize_rows / dequantize_rows), and qlinear, the quantized projection -- the activations
// prepared (quantized per block of 32 by kernels/quant_acts.hpp, repacked for the int4 / VNNI /
// AMX kernels) and the product split over the thread pool. The weight quantization itself is
// scalar code here (it runs once per weight matrix), written so that llmkernels.quant's NumPy
// twin gives the same bits: float32 max, division and rint (round half to even), float16 scales
// rounded up in magnitude.
// Calls go one way: drivers/linear.cpp and the quantize / dequantize / quantized_linear entries
// (ops/quant.cpp) call these; these call the GEMM routes (drivers/gemm_routes.hpp: the packed
// GEMM of a prefill) and kernels, never drivers/linear.
#include "drivers/qlinear.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "common/dot.hpp"
#include "common/isa.hpp"
#include "common/mxcsr.hpp"
#include "common/scratch.hpp"
#include "common/thread_pool.hpp"
#include "drivers/gemm_routes.hpp"
#include "kernels/ops.hpp"
#include "kernels/quant_types.hpp"  // half_to_float

namespace llmk {
namespace {

constexpr std::size_t kRowBlock = 256;     // rows per task of the thread split (fixed by the shape)
constexpr std::size_t kGemvMaxTokens = 8;  // above: the tile GEMM
// The AVX2 int8-activation GEMV (decode) prefetches each row it reads this far ahead in software
// on Intel CPUs. Intel Xeon Emerald Rapids, DRAM-resident projections of a 22-layer TinyLlama
// shape, GB/s of codes and scales at 1 / 2 threads, medians of 7 interleaved runs (read probe
// ~12.5 / 23): int8 9.2 / 15.3 without, 11.0 / 18.2 at 2 KiB (1 KiB 11.2 / 17.2, 4 KiB 11.4 /
// 18.2); int4 10.1 / 14.1 without, 11.6 / 16.1 at 2 KiB. On AMD Zen 4 the stripes alone were the
// faster (a prefetch on each stripe: int8 16.0-16.4 against 22 GB/s on one core).
constexpr std::size_t kQGemvIntelPrefetch = 2048;

// out[c * 8 + l] = factor * the sum of block 8 c + l's codes of one token (nb blocks of kQBlock
// codes at x), 0 past the last block, for nch chunks of 8 blocks: the offset an unsigned operand
// (code + 128 on VNNI, nibble + 8 in the AVX2 int4 kernel) adds to each block's dot product
void scaled_block_sums(std::int32_t* out, const std::int8_t* x, std::size_t nb, std::size_t nch,
                       std::int32_t factor) {
  for (std::size_t b = 0; b < 8 * nch; ++b) {
    std::int32_t sum = 0;
    if (b < nb)
      for (std::size_t i = 0; i < kQBlock; ++i) sum += x[b * kQBlock + i];
    out[b] = factor * sum;
  }
}
// With int8 activations the GEMV runs up to 16 tokens (4 passes of 4 over the codes): its
// integer products outrun the packed GEMM's float ones, whose weight pack (dequantize +
// transpose of the whole matrix) 9-16 tokens do not pay back. Tokens/s of a 2048 -> 5632
// projection, AVX2 EPYC, 1 / 2 threads (int8 weights; int4 the same within 10%):
//   GEMV m = 8: 2748 / 4981;  packed m = 9: 1430 / 2254, 12: 1948 / 2898, 16: 2096 / 3097,
//   24: 2588 / 4056 (the GEMV's rate per token does not depend on m: 4-token passes).
constexpr std::size_t kGemvMaxTokensInt8 = 16;
// Except where the AVX2 integer tile kernel (kernels/quant_vnni.hpp on maddubs: Int8Dot::avx2)
// serves the tokens past the GEMV: it reads each 64-row block of codes once for all the tokens
// (the GEMV once per 4), and overtakes the GEMV from 6 tokens with int8 weights, 9 with int4
// (the same bits either way). AMD EPYC Zen 3 (AVX2), medians of 9 interleaved runs, GEMV time /
// tile time, 1 / 2 threads: int8 5632 x 2048 m = 4 0.96 / 0.97, 6 1.09 / 1.20, 8 1.29 / 1.16,
// 16 1.60 / 1.61 (2048 x 5632 and 2048 x 2048 alike); int4 m = 8 0.95 / 0.96, 9 1.01 / 1.07,
// 16 1.10 / 1.18.
// And where it runs on AMX: a call of up to 16 tokens takes one 16-token tile, at about the
// cost of the weight repack, flat in m. GEMV time / AMX time over one layer's seven
// projections of the TinyLlama-1.1B shape (weights from DRAM), Intel Xeon with AMX, medians of
// interleaved processes, 1 thread: int8 m = 4 0.76, 6 1.25, 9 1.60, 16 2.07; int4 m = 6 0.85,
// 8 1.04, 9 1.18, 16 1.66; 2 threads: int8 m = 8 0.93, 9 1.07, 12 1.12, 16 1.38; int4 m = 9
// 0.91, 10 1.02, 12 1.11, 16 1.20.
// And on the 512-bit VNNI kernel: the same seven projections, AMD EPYC Zen 5, 2 interleaved
// processes per choice (this host's bandwidth moves by up to 2x from minute to minute, so the
// crossings are loose), GEMV / tile time: 1 thread int8 m = 6 0.85, 8 1.05, 16 1.7-2.5; int4
// m = 6 0.99-1.24, 7 1.19-1.34, 16 2.0; 2 threads int8 m = 4 0.86-1.16, 6 1.44-1.61, 16 2.0-2.5;
// int4 m = 5 1.25-0.88, 6 1.30-1.05, 16 1.94.
// And on the 256-bit VNNI kernel (AMD EPYC Zen 4): a whole 22-layer TinyLlama-1.1B decode step
// of m sequences, ms, medians of 12 steps interleaved in one process, GEMV / tile kernel, 1 / 2
// threads: int8 m = 2 74 / 114, 37 / 60; 4 119 / 126, 86 / 83; 5 174 / 132, 130 / 104; 8 244 /
// 165, 116 / 86; 16 460 / 221, 240 / 115; int4 m = 6 98 / 112, 50 / 62; 8 122 / 133, 73 / 78;
// 10 159 / 150, 113 / 104; 16 237 / 197, 133 / 117.
std::size_t int8_gemv_max_tokens(Int8Dot dot, int bits) {
  if (dot == Int8Dot::avx2 || dot == Int8Dot::vnni || dot == Int8Dot::vnni_simde)
    return bits == 8 ? (dot == Int8Dot::avx2 ? 5 : 4) : 8;
  if (dot == Int8Dot::amx || dot == Int8Dot::amx_emu) {
    const bool one = get_num_threads() == 1;
    return bits == 8 ? (one ? 5 : 8) : (one ? 7 : 9);
  }
  if (dot == Int8Dot::vnni512 || dot == Int8Dot::vnni512_simde)
    return get_num_threads() == 1 ? 6 : 5;
  return kGemvMaxTokensInt8;
}

// The smallest float16 >= d (d >= 0 finite), as bits; >= 0x7c00 when d > 65504 (too large).
std::uint16_t half_ceil(float d) {
  if (d == 0.f) return 0;
  if (d < 0x1p-14f) return static_cast<std::uint16_t>(std::ceil(d * 0x1p24f));  // subnormal
  std::uint32_t b;
  std::memcpy(&b, &d, sizeof b);
  const int e = static_cast<int>(b >> 23) - 127;
  if (e > 15) return 0x7c00;
  const std::uint32_t m = b & 0x7fffffu;
  std::uint32_t h = (static_cast<std::uint32_t>(e + 15) << 10) | (m >> 13);
  if (m & 0x1fffu) h += 1;  // carries into the exponent when the mantissa was all ones
  return static_cast<std::uint16_t>(h);
}

// Status of one row's quantization: 0 fine, 1 non-finite value, 2 scale beyond float16.
struct RowStatus {
  std::uint8_t code = 0;
  std::size_t group = 0;
  float amax = 0.f;
};

RowStatus quantize_row(const float* w, std::size_t k, std::size_t group, int bits, std::uint8_t* q,
                       std::uint16_t* scales) {
  RowStatus st;
  for (std::size_t i = 0; i < k; ++i)
    if (!std::isfinite(w[i])) {
      st.code = 1;
      st.group = i / group;
      return st;
    }
  std::int8_t codes[128];
  for (std::size_t g = 0; g < k / group; ++g) {
    const float* wg = w + g * group;
    float amax = 0.f, extreme = 0.f;
    for (std::size_t i = 0; i < group; ++i)
      if (std::fabs(wg[i]) > amax) {  // the first element of largest magnitude
        amax = std::fabs(wg[i]);
        extreme = wg[i];
      }
    // int8: s >= max|w| / 127; int4 (Q4_0): s = extreme / -8 rounded away from zero
    const float d = bits == 8 ? amax / 127.f : extreme / -8.f;
    const std::uint16_t h = half_ceil(std::fabs(d));
    if (h >= 0x7c00u) {
      st.code = 2;
      st.group = g;
      st.amax = amax;
      return st;
    }
    const std::uint16_t sh = static_cast<std::uint16_t>(h | (d < 0.f ? 0x8000u : 0u));
    scales[g] = sh;
    const float s = half_to_float(sh);
    const float lo = bits == 8 ? -127.f : -8.f, hi = bits == 8 ? 127.f : 7.f;
    for (std::size_t i = 0; i < group; ++i) {
      const float c = s == 0.f ? 0.f : std::nearbyint(wg[i] / s);  // round half to even
      codes[i] = static_cast<std::int8_t>(std::min(hi, std::max(lo, c)));
    }
    if (bits == 8) {
      std::memcpy(q + g * group, codes, group);
    } else {
      std::uint8_t* dst = q + g * group / 2;
      for (std::size_t b = 0; b < group / kQBlock; ++b)
        for (std::size_t j = 0; j < kQBlock / 2; ++j)
          dst[b * 16 + j] = static_cast<std::uint8_t>((codes[b * 32 + j] + 8) |
                                                      ((codes[b * 32 + j + 16] + 8) << 4));
    }
  }
  return st;
}

// x (m, k) -> panels of kQPanel tokens, each transposed (k, kQPanel), zero past token m
void pack_panels(const float* x, std::size_t m, std::size_t k, float* xt) {
  constexpr std::size_t P = kQPanel, kTile = 16;
  for (std::size_t p0 = 0; p0 < m; p0 += P) {
    float* panel = xt + p0 * k;
    for (std::size_t i0 = 0; i0 < P; i0 += kTile)
      for (std::size_t k0 = 0; k0 < k; k0 += kTile) {
        const std::size_t k1 = std::min(k, k0 + kTile);
        for (std::size_t i = i0; i < i0 + kTile; ++i) {
          const std::size_t t = p0 + i;
          for (std::size_t kk = k0; kk < k1; ++kk) panel[kk * P + i] = t < m ? x[t * k + kk] : 0.f;
        }
      }
  }
}

}  // namespace

std::string quant_status_message(const QuantStatus& st, int bits) {
  if (st.code == 1)
    return "w must be finite: row " + std::to_string(st.row) + ", group " +
           std::to_string(st.group) + " holds NaN or Inf";
  return "w row " + std::to_string(st.row) + ", group " + std::to_string(st.group) +
         ": max |w| = " + std::to_string(st.amax) +
         " needs a scale beyond float16's range (max |w| must stay below " +
         (bits == 8 ? "8.3e6" : "5.2e5") + ")";
}

QuantStatus quantize_rows(const float* wp, std::size_t rows, std::size_t k, std::size_t group,
                          int bits, std::uint8_t* qp, std::uint16_t* sp) {
  const std::size_t row_bytes = bits == 8 ? k : k / 2;
  std::vector<RowStatus> status(rows);
  parallel_for(rows, 1, 4.0 * static_cast<double>(k), [&](std::size_t r0, std::size_t r1) {
    ExactSubnormals exact;  // float16 rounding of tiny scales must not see DAZ
    for (std::size_t r = r0; r < r1; ++r)
      status[r] =
          quantize_row(wp + r * k, k, group, bits, qp + r * row_bytes, sp + r * (k / group));
  });
  QuantStatus st;
  for (std::size_t r = 0; r < rows; ++r)
    if (status[r].code) {
      st.code = status[r].code;
      st.row = r;
      st.group = status[r].group;
      st.amax = status[r].amax;
      break;
    }
  return st;
}

void dequantize_rows(const qweights& w, int bits, float* op) {
  const std::size_t group = w.group;
  parallel_for(w.rows, 1, 2.0 * static_cast<double>(w.k), [&](std::size_t r0, std::size_t r1) {
    for (std::size_t r = r0; r < r1; ++r)
      for (std::size_t i = 0; i < w.k; ++i) {
        const float s = half_to_float(w.scales[r * (w.k / group) + i / group]);
        int c;
        if (bits == 8) {
          c = static_cast<std::int8_t>(w.q[r * w.k + i]);
        } else {
          const std::size_t b = i / kQBlock, j = i % kQBlock;
          const std::uint8_t byte = w.q[r * (w.k / 2) + b * 16 + j % 16];
          c = (j < 16 ? byte & 0x0f : byte >> 4) - 8;
        }
        op[r * w.k + i] = static_cast<float>(c) * s;
      }
  });
}

void tile_int8(const std::uint8_t* q, const std::uint16_t* scales, std::size_t rows,
               std::size_t k, std::size_t group, std::uint8_t* qdst, std::uint16_t* sdst,
               bool inverse) {
  const std::size_t nb = k / kQBlock, ng = k / group;
  parallel_for(rows / 16, 1, 32.0 * static_cast<double>(k), [&](std::size_t g0, std::size_t g1) {
    for (std::size_t g = g0; g < g1; ++g) {
      const std::size_t base = g * 16 * k, sbase = g * 16 * ng;
      for (std::size_t l = 0; l < 16; ++l) {  // row 16 g + l
        for (std::size_t b = 0; b < nb; ++b)
          for (std::size_t j = 0; j < 8; ++j) {  // codes 4j .. 4j + 3 of block b
            const std::size_t plain = base + l * k + b * kQBlock + 4 * j;
            const std::size_t tiled = base + b * 512 + j * 64 + l * 4;
            if (inverse)
              std::memcpy(qdst + plain, q + tiled, 4);
            else
              std::memcpy(qdst + tiled, q + plain, 4);
          }
        for (std::size_t sg = 0; sg < ng; ++sg) {
          const std::size_t plain = sbase + l * ng + sg, tiled = sbase + sg * 16 + l;
          if (inverse)
            sdst[plain] = scales[tiled];
          else
            sdst[tiled] = scales[plain];
        }
      }
    }
  });
}

bool int8_tiles_wanted() {
  const Int8Dot d = int8_dot();
  return (d == Int8Dot::amx || d == Int8Dot::amx_emu) && gemm_route() == GemmRoute::automatic;
}

void qlinear(const float* x, std::size_t m, const qweights& w, int bits, const float* bias,
             float* y, bool accumulate, bool int8_acts) {
  if (m == 0 || w.rows == 0) return;
  if (w.tiles && !(bits == 8 && int8_acts && w.k > 0 && int8_tiles_wanted())) {
    // codes in the tile layout where another kernel runs (a forced path, the float-activation
    // fallback below): the plain codes in scratch -- slower, never wrong
    const std::size_t nscales = w.rows * (w.k / w.group);
    ScratchLease plain_lease(w.rows * w.k + 64 + nscales * sizeof(std::uint16_t));
    qweights plain = w;
    plain.tiles = false;
    auto* codes = plain_lease.as<std::uint8_t>();
    auto* scales = reinterpret_cast<std::uint16_t*>(codes + (w.rows * w.k + 63) / 64 * 64);
    plain.q = codes;
    plain.scales = scales;
    tile_int8(w.q, w.scales, w.rows, w.k, w.group, codes, scales, /*inverse=*/true);
    qlinear(x, m, plain, bits, bias, y, accumulate, int8_acts);
    return;
  }
  // prefill (from 9 tokens, 17 with int8 activations; drivers/gemm_routes.cpp decides and gives
  // figures): the packed GEMM, the codes dequantized as its weight blocks are packed -- about
  // twice gemm_q's speed from 128 tokens, and the same bits (one fma chain per output over the
  // exact dequantized weights)
  const WeightFormat format = bits == 8 ? WeightFormat::q8 : WeightFormat::q4;
  // (a forced route keeps its meaning from 9 tokens: the tests pin each kernel)
  const bool automatic = gemm_route() == GemmRoute::automatic;
  const Int8Dot tile_dot = w.k > 0 ? int8_dot() : Int8Dot::none;
  // (codes stored in the tile layout: the AMX kernel at every m, no repack to pay back)
  const bool int8_gemv =
      int8_acts && automatic && !w.tiles && m <= int8_gemv_max_tokens(tile_dot, bits);
  // prefill with int8 activations on a dot-product extension (common/dot.hpp): the tokens of a
  // prefill go through the same integer arithmetic as decode's (kernels/quant_vnni.hpp)
  const Int8Dot dot = int8_acts && !int8_gemv && automatic ? tile_dot : Int8Dot::none;
  if (w.k > 0 && !int8_gemv && dot == Int8Dot::none && packed_route_w(m, format)) {
    linear_packed_w(x, m, w.k, WeightRef{w.q, format, w.scales, w.group}, w.rows, bias, y,
                    accumulate);
    return;
  }
  const std::size_t group = w.group;
  qgemv_args a{};
  a.y = y;
  a.ldy = w.rows;
  a.w = w;
  a.x = x;
  a.ldx = w.k;
  a.m = m;
  a.accumulate = accumulate;
  a.bias = bias;
  a.stripes = get_num_threads() > 1 ? 2 : 4;  // (kernels/quant.hpp's qgemv_tokens)
  a.prefetch = cpu_is_intel() ? kQGemvIntelPrefetch : 0;
  const bool gemv = m <= kGemvMaxTokens || int8_gemv || dot != Int8Dot::none;
  int8_acts = gemv && int8_acts;
  // decode with int8 / int4 weights on a dot-product extension: the GEMV on vpdpbusd, bit for
  // bit the AVX2 one (kernels/quant_vnni.hpp) -- natively where the quantized family runs the
  // AVX2 code or wider (whose GEMV it equals), the SIMDe twin wherever it is forced. int4 decode
  // is compute-bound on one thread: 22-layer TinyLlama shape, Zen 4, 1 thread, ms per step,
  // medians of 8 interleaved rounds in one process: 39.0 on maddubs, 34.1 on vpdpbusd; int8
  // (bandwidth-bound) 51.3 / 51.1.
  Int8Dot gemv_dot = Int8Dot::none;
  if (int8_gemv) {
    const Int8Dot d = int8_dot();
    if (int8_dot_is_twin(d) || (int8_dot_is_native(d) && family_isa(Family::quant) >= Isa::avx2))
      gemv_dot = d;
  }
  {
    // scratch before the parallel region (kernels never allocate): int8 activations, or the
    // packed tokens of the GEMM
    const std::size_t nb = w.k / kQBlock;
    const std::size_t np = nb / 2;
    // the VNNI prefill: the activations one block per lane (act.xi, act.sx8)
    // and a repacking buffer per thread (common/dot.hpp)
    const bool vnni = dot != Int8Dot::none;
    const bool amx = dot == Int8Dot::amx || dot == Int8Dot::amx_emu;
    const std::size_t nch = dot::vnni_chunks(w.k);
    const std::size_t mp = amx ? (m + 31) / 32 * 32 : m;  // AMX: whole pairs of 16-token tiles
    const std::size_t chunks = vnni ? std::min<std::size_t>(
                                           (w.rows + dot::kVnniRowBlock - 1) / dot::kVnniRowBlock,
                                           static_cast<std::size_t>(std::max(1, get_num_threads())))
                                     : 0;
    // (int8 weights on AVX2: also |x| in xi's layout, xa)
    const bool abs_x = dot == Int8Dot::avx2 && bits == 8;
    const std::size_t vnni_bytes =
        vnni ? mp * nch * ((abs_x ? 2 : 1) * dot::kVnniChunkBytes + 8 * sizeof(float)) +
                    chunks * dot::int8_pack_bytes(dot, w.k) + 64
              : 0;
    const std::size_t act_bytes =
        int8_acts ? m * w.k * 4 + m * nb * sizeof(float) + m * nch * 32 + 256 + vnni_bytes
                  : 0;
    const std::size_t panel_floats = gemv ? 0 : (m + kQPanel - 1) / kQPanel * kQPanel * w.k;
    std::optional<ScratchLease> lease;  // (released before a fallback below)
    std::uint8_t* vnni_pack = nullptr;
    lease.emplace(std::max<std::size_t>(act_bytes + panel_floats * sizeof(float), 64));
    auto* base = lease->as<std::uint8_t>();
    if (int8_acts) {
      auto* q16 = reinterpret_cast<std::int16_t*>(base);  // (m, k), 2 bytes each
      auto* sc = reinterpret_cast<float*>(base + m * w.k * 2);  // (m, nb)
      auto* xq = reinterpret_cast<std::int8_t*>(sc + m * nb);   // (m, k)
      auto* q4 = xq + m * w.k;                                  // (m, k)
      {
        // scales out of the int8 kernels' range (kActScaleMin, kernels/quant_acts.hpp): float
        // activations, a.act null.
        // The tokens split across the threads (a prefill of 512 tokens at k = 2048 took ~1 ms on
        // one thread, ~10% of the product itself at two); q16 only for the SSE2 GEMV.
        std::atomic<bool> in_range{true};
        std::int16_t* q16w = vnni ? nullptr : q16;
        parallel_for(m, 1, 16.0 * static_cast<double>(w.k), [&](std::size_t t0, std::size_t t1) {
          ExactSubnormals exact;
          bool ok = true;
          dispatch(quantize_acts_kernel{}, xq + t0 * w.k, q16w ? q16w + t0 * w.k : nullptr,
                   sc + t0 * nb, &ok, a.x + t0 * w.k, t1 - t0, w.k);
          if (!ok) in_range.store(false, std::memory_order_relaxed);
        });
        int8_acts = in_range.load();
      }
      if (!int8_acts && dot != Int8Dot::none) {
        // a scale out of the kernels' range: the float-activation prefill
        lease.reset();
        qlinear(x, m, w, bits, bias, y, accumulate, false);
        return;
      }
      auto* xs8 = reinterpret_cast<std::int32_t*>(q4 + m * w.k);  // (m, nch, 8)
      if (int8_acts) a.act = qacts{xq, q16, sc, nullptr, nullptr, nullptr, nullptr, nullptr,
                            nullptr};
      if (int8_acts && bits == 8 && gemv_dot != Int8Dot::none) {
        // 128 * each block's sum, in xs8's place (int4 keeps xs8: its nibbles are unsigned)
        for (std::size_t t = 0; t < m; ++t)
          scaled_block_sums(xs8 + t * nch * 8, xq + t * w.k, nb, nch, 128);
        a.act.xs128 = xs8;
      }
      if (int8_acts && w.tiles && vnni) {  // the tiled GEMV of a few tokens, as above
        for (std::size_t t = 0; t < m; ++t)
          scaled_block_sums(xs8 + t * nch * 8, xq + t * w.k, nb, nch, 128);
        a.act.xs128 = xs8;
      }
      if (int8_acts && bits == 4 && dot == Int8Dot::avx2) {  // the nibbles' offsets, as below
        parallel_for(m, 1, 2.0 * static_cast<double>(w.k), [&](std::size_t t0, std::size_t t1) {
          for (std::size_t t = t0; t < t1; ++t)
            scaled_block_sums(xs8 + t * nch * 8, xq + t * w.k, nb, nch, 8);
        });
        a.act.xs8 = xs8;
      }
      if (int8_acts && bits == 4 && !vnni) {  // the pair order of the AVX2 int4 kernel
        parallel_for(m, 1, 2.0 * static_cast<double>(w.k), [&](std::size_t t0, std::size_t t1) {
        for (std::size_t t = t0; t < t1; ++t) {
          const std::int8_t* src = xq + t * w.k;
          std::int8_t* dst = q4 + t * w.k;
          for (std::size_t p = 0; p < np; ++p) {
            const std::int8_t* b0 = src + 2 * p * kQBlock;
            std::int8_t* d = dst + 2 * p * kQBlock;
            std::memcpy(d, b0, 16);
            std::memcpy(d + 16, b0 + kQBlock, 16);
            std::memcpy(d + 32, b0 + 16, 16);
            std::memcpy(d + 48, b0 + kQBlock + 16, 16);
          }
          if (nb % 2) std::memcpy(dst + (nb - 1) * kQBlock, src + (nb - 1) * kQBlock, kQBlock);
          // the offset the unsigned nibbles (code + 8) add to each block's dot product
          scaled_block_sums(xs8 + t * nch * 8, src, nb, nch, 8);
        }
        });
        a.act.q4 = q4;
        a.act.xs8 = xs8;
      }
      if (int8_acts && vnni) {
        // after xs8 (m * nch * 32 bytes), 64-byte aligned
        const std::size_t at = (m * w.k * 4 + m * nb * sizeof(float) + m * nch * 32 + 63) / 64 * 64;
        auto* xi = base + at;                                                 // (mp, nch, 256)
        auto* sx8 = reinterpret_cast<float*>(xi + mp * nch * dot::kVnniChunkBytes);  // (m, nch, 8)
        auto* xa = abs_x ? reinterpret_cast<std::uint8_t*>(sx8 + mp * nch * 8) : nullptr;
        vnni_pack = reinterpret_cast<std::uint8_t*>(sx8 + mp * nch * 8) +
                    (abs_x ? mp * nch * dot::kVnniChunkBytes : 0);
        // vpdpbusd's unsigned operand is x + 128; AVX2's maddubs takes the codes as they are
        const std::uint32_t flip = dot == Int8Dot::avx2 ? 0u : 0x80808080u;
        // per token, split across the threads: tokens [t0, t1) of mp (those past m: zero codes)
        parallel_for(mp, 1, 2.0 * static_cast<double>(w.k), [&](std::size_t t0, std::size_t t1) {
        if (amx)  // the codes in 16-token tiles: [tile][block][16][32], tokens past m 0
          for (std::size_t t = t0; t < t1; ++t)
            for (std::size_t b = 0; b < nb; ++b) {
              std::uint8_t* dst = xi + (((t / 16) * nb + b) * 16 + t % 16) * kQBlock;
              if (t < m)
                std::memcpy(dst, xq + t * w.k + b * kQBlock, kQBlock);
              else
                std::memset(dst, 0, kQBlock);
            }
        for (std::size_t t = t0; t < std::min(t1, m); ++t)
          for (std::size_t c = 0; c < nch; ++c) {
            std::uint8_t* dst = xi + (t * nch + c) * dot::kVnniChunkBytes;
            float* sd = sx8 + (t * nch + c) * 8;
            for (std::size_t l = 0; l < 8; ++l) {
              const std::size_t b = 8 * c + l;
              sd[l] = b < nb ? sc[t * nb + b] : 0.f;
              if (amx) continue;  // (xi holds the tiles)
              for (std::size_t j = 0; j < 8; ++j) {
                std::uint32_t v = 0;
                if (b < nb) {
                  std::memcpy(&v, xq + t * w.k + b * kQBlock + 4 * j, 4);
                  v ^= flip;
                }
                std::memcpy(dst + 32 * j + 4 * l, &v, 4);
              }
            }
            if (xa) {  // |x| (codes in [-127, 127]: exact as unsigned bytes)
              std::uint8_t* da = xa + (t * nch + c) * dot::kVnniChunkBytes;
              for (std::size_t i = 0; i < dot::kVnniChunkBytes; ++i) {
                const auto v = static_cast<std::int8_t>(dst[i]);
                da[i] = static_cast<std::uint8_t>(v < 0 ? -v : v);
              }
            }
          }
        });
        a.act.xi = xi;
        a.act.sx8 = sx8;
        a.act.xa = xa;
      }
    }
    if (!gemv) {
      float* xt = reinterpret_cast<float*>(base + act_bytes);
      pack_panels(a.x, m, w.k, xt);
      a.x = xt;
    }
    const std::size_t row_bytes = bits == 8 ? w.k : w.k / 2;
    if (vnni_pack) {
      // blocks of kVnniRowBlock rows, each chunk of threads repacking into its own buffer
      const std::size_t vblocks = (w.rows + dot::kVnniRowBlock - 1) / dot::kVnniRowBlock;
      parallel_chunks(static_cast<int>(chunks), [&](int c, int nc) {
        ExactSubnormals exact;
        std::uint8_t* pack =
            vnni_pack + static_cast<std::size_t>(c) * dot::int8_pack_bytes(dot, w.k);
        for (std::size_t blk = c; blk < vblocks; blk += nc) {
          const std::size_t r0 = blk * dot::kVnniRowBlock;
          qgemv_args part = a;
          part.y = a.y + r0;
          part.w.q = w.q + r0 * row_bytes;
          part.w.scales = w.scales + r0 * (w.k / group);
          part.w.rows = std::min(w.rows - r0, dot::kVnniRowBlock);
          part.bias = a.bias ? a.bias + r0 : nullptr;
          if (blk + nc < vblocks) {  // this thread's next block
            const std::size_t n0 = (blk + nc) * dot::kVnniRowBlock;
            part.next_q = w.q + n0 * row_bytes;
            part.next_bytes = std::min(w.rows - n0, dot::kVnniRowBlock) * row_bytes;
          }
          dot::qgemm_int8_acts(dot, part, bits, pack);
        }
      });
      return;
    }
    // rows [r0, r1) of the matrix against every token
    const auto rows = [&](std::size_t r0, std::size_t r1) {
      ExactSubnormals exact;
      qgemv_args part = a;
      part.y = a.y + r0;
      part.w.q = w.q + r0 * row_bytes;
      part.w.scales = w.scales + r0 * (w.k / group);
      part.w.rows = r1 - r0;
      part.bias = a.bias ? a.bias + r0 : nullptr;
      if (!gemv)
        dispatch(gemm_q_kernel{}, static_cast<const qgemv_args&>(part), bits);
      else if (int8_acts && gemv_dot != Int8Dot::none && bits == 8)
        dot::qgemv_int8_vnni(int8_dot_is_twin(gemv_dot), part);
      else if (int8_acts && gemv_dot != Int8Dot::none)
        dot::qgemv_int4_vnni(int8_dot_is_twin(gemv_dot), part);
      else if (bits == 8)
        dispatch(gemv_q8_kernel{}, static_cast<const qgemv_args&>(part));
      else
        dispatch(gemv_q4_kernel{}, static_cast<const qgemv_args&>(part));
    };
    const double cost = 2.0 * static_cast<double>(m * w.k);
    if (gemv) {  // decode: drivers/gemm_routes.cpp's decode_split (figures there)
      decode_split(w.rows, row_bytes + w.k / group * sizeof(std::uint16_t), cost, rows);
    } else {
      const std::size_t blocks = (w.rows + kRowBlock - 1) / kRowBlock;
      parallel_for(blocks, 1, cost * kRowBlock, [&](std::size_t b0, std::size_t b1) {
        rows(b0 * kRowBlock, std::min(w.rows, b1 * kRowBlock));
      });
    }
  }
}
}  // namespace llmk
