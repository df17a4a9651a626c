// The GEMM routes: which matrix product a projection of m tokens takes (BLAS blocks, the packed
// GEMM, packed tokens, matrix-vector products) and the products themselves, for float32 /
// float64 weights (linear<T>) and 16-bit weights (linear_w16), plus the packed GEMM on weights of
// any WeightFormat (linear_packed_w). The bottom of the driver stack: it calls only kernels and
// common/. drivers/qlinear.cpp (quantized weights) uses packed_route_w / linear_packed_w from
// here, drivers/linear.cpp (the projection router) all of it; neither is called from here, so
// the calls go one way: linear -> qlinear -> gemm_routes, linear -> gemm_routes.
#include "drivers/gemm_routes.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dot.hpp"
#include "common/isa.hpp"
#include "common/scratch.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"

namespace llmk {
namespace {

constexpr std::size_t kRowBlock = 256;  // rows per BLAS call when m is large (prefill)
constexpr std::size_t kColBlock = 256;  // output features per task otherwise (thread split)
// Up to this many tokens, out_in projections are matrix-vector products (the weights read once
// per group of 4 tokens, in place); above it the tokens are packed and the weights read in place
// (gemm_xt_kernel), and from kPackedMinRows on both operands are packed (gemm_packed_kernel).
// The BLAS (blocks of kRowBlock rows, or of kColBlock columns) is kept from 2 * kRowBlock tokens
// (see choose_path), for the in_out layout below kPackedMinRows, and as a forced route
// (GemmRoute::blas) for comparison.
constexpr std::size_t kGemvMaxRows = 8;
// From this many tokens on, both operands are packed (gemm_packed_kernel): packing the weights
// (once per call, per thread) is then paid for by the tokens that reuse each packed block.
// (out, in) weights: below it, gemm_xt_kernel. (in, out) weights: below it, the BLAS.
// Measured (benchmarks/bench_gemm.py, TinyLlama shapes, AVX2): gemm_xt and the packed kernel
// are level at 16-24 tokens, the packed kernel 1.3-2x faster from 32 on, and within a few
// percent of OpenBLAS sgemm from 64 to 512 tokens (which therefore no longer takes them).
constexpr std::size_t kPackedMinRows = 24;
// Except on AVX-512 (unmeasured there), float32 and 16-bit weights stay on the GEMV up to this
// many tokens: it reads the matrix once per call in cache-sized blocks of rows for all the
// tokens (kernels/gemv.hpp), where gemm_xt re-reads the packed tokens from L2 for every 4
// features and the packed kernel (16-bit weights) packs the matrix. 2048 -> 5632, 1 thread, AMD
// EPYC Zen 3 (AVX2), best of 3 interleaved processes, gemm_xt (float32) / packed (bfloat16) time
// over the GEMV's: float32 m = 9 2.04, 12 1.52, 16 1.11, 20 1.41, 24 0.96; bfloat16 1.59, 1.30,
// 1.29, 1.32, 1.08.
constexpr std::size_t kGemvMaxRowsBlocked = 20;
std::size_t gemv_max_rows() {
  return active_isa() == Isa::avx512 ? kGemvMaxRows : kGemvMaxRowsBlocked;
}

std::atomic<int> g_route{0};

void gemm(bool trans_w, std::size_t m, std::size_t n, std::size_t k, const float* x, const float* w,
          std::size_t ldw, float beta, float* y, std::size_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, trans_w ? CblasTrans : CblasNoTrans, (int)m, (int)n,
              (int)k, 1.f, x, (int)k, w, (int)ldw, beta, y, (int)ldy);
}
void gemm(bool trans_w, std::size_t m, std::size_t n, std::size_t k, const double* x,
          const double* w, std::size_t ldw, double beta, double* y, std::size_t ldy) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, trans_w ? CblasTrans : CblasNoTrans, (int)m, (int)n,
              (int)k, 1.0, x, (int)k, w, (int)ldw, beta, y, (int)ldy);
}

// y[r, c0:c1] for rows [r0, r1) before a BLAS block adds x . W with beta: returns beta (0 when
// y is simply overwritten; 1 when it holds the bias, or the previous y plus the bias)
template <class T>
T init_block(T* y, std::size_t ldy, std::size_t r0, std::size_t r1, std::size_t c0, std::size_t c1,
             const T* bias, bool accumulate) {
  if (!bias) return accumulate ? T(1) : T(0);
  for (std::size_t r = r0; r < r1; ++r) {
    T* row = y + r * ldy;
    if (accumulate) {
      for (std::size_t c = c0; c < c1; ++c) row[c] += bias[c];
    } else {
      std::memcpy(row + c0, bias + c0, (c1 - c0) * sizeof(T));
    }
  }
  return T(1);
}

// x (m, k) -> panels of kGemmPanel rows, each transposed (k, kGemmPanel), zero past row m: the
// packed operand of gemm_xt_kernel.
template <class T>
void pack_panels(const T* x, std::size_t m, std::size_t k, T* xt) {
  constexpr std::size_t P = kGemmPanel, kTile = 16;  // 16 x 16 tiles: a few cache lines each side
  for (std::size_t p0 = 0; p0 < m; p0 += P) {
    T* panel = xt + p0 * k;
    for (std::size_t i0 = 0; i0 < P; i0 += kTile) {
      for (std::size_t k0 = 0; k0 < k; k0 += kTile) {
        const std::size_t k1 = std::min(k, k0 + kTile);
        for (std::size_t i = i0; i < i0 + kTile; ++i) {
          const std::size_t t = p0 + i;
          for (std::size_t kk = k0; kk < k1; ++kk) panel[kk * P + i] = t < m ? x[t * k + kk] : T(0);
        }
      }
    }
  }
}

// The weights of a gemm_packed call: T elements, (n, k) or (k, n) when in_out, as linear<T> takes
// them (gemm_packed_kernel); or, float only, when w is null, `ref`: (n, k) weights in any
// WeightFormat, converted while they are packed (gemm_packed_w_kernel).
template <class T>
struct PackedWeights {
  const T* w;
  bool in_out;
  WeightRef ref;
};

// y (m, n) (+)= x . W (+ bias) with both operands packed: x once for all threads (panels of
// the ISA's token count), then each thread takes a contiguous share of the features (a multiple
// of 32, which every ISA's feature panel divides) and packs its weights block by block into its
// own kGemmPackKc x gemm_pack_nc(m, k) scratch (converting 16-bit / quantized weights as it
// packs).
// Each output is one fma chain over k (kernels/gemm.hpp), so the split -- which depends on the
// thread count -- changes no bit.
template <class T>
void gemm_packed(const T* x, std::size_t m, std::size_t k, const PackedWeights<T>& w, std::size_t n,
                 const T* bias, T* y, bool accumulate) {
  constexpr std::size_t kAlign = 32, kTok = kGemmPackTokenAlign;
  const std::size_t units = (n + kAlign - 1) / kAlign;
  const std::size_t threads = static_cast<std::size_t>(std::max(1, get_num_threads()));
  const std::size_t want = std::min(threads, units);
  const std::size_t share = (units + want - 1) / want * kAlign;
  const std::size_t shares = (n + share - 1) / share;
  ScratchLease xp_lease((m + kTok - 1) / kTok * kTok * k * sizeof(T));
  const std::size_t wp_block = kGemmPackKc * gemm_pack_nc(m, k);  // elements per thread
  ScratchLease wp_lease(shares * wp_block * sizeof(T));
  T* const xp = xp_lease.as<T>();  // (m rounded up to kTok, k) in panels of the ISA's MR tokens
  T* const wp = wp_lease.as<T>();  // (threads, wp_block) packed weight blocks
  parallel_for((m + kTok - 1) / kTok, 1, 2.0 * kTok * k, [&](std::size_t b0, std::size_t b1) {
    dispatch(gemm_pack_x_kernel{}, xp, x, k, m, k, b0 * kTok, std::min(m, b1 * kTok));
  });
  const std::size_t ldw = w.in_out ? n : k;
  parallel_chunks(static_cast<int>(shares), [&](int c, int nc) {
    const auto first = static_cast<std::size_t>(c), step = static_cast<std::size_t>(nc);
    T* const wpc = wp + static_cast<std::size_t>(c) * wp_block;
    for (std::size_t s = first; s < shares; s += step) {
      const std::size_t f0 = s * share, nb = std::min(share, n - f0);
      if constexpr (std::is_same<T, float>::value) {
        if (!w.w) {
          dispatch(gemm_packed_w_kernel{}, y + f0, n, static_cast<const float*>(xp), m, k,
                   weight_rows(w.ref, f0, k), nb, wpc, accumulate, bias ? bias + f0 : bias);
          continue;
        }
      }
      dispatch(gemm_packed_kernel{}, y + f0, n, static_cast<const T*>(xp), m, k,
               w.in_out ? w.w + f0 : w.w + f0 * ldw, ldw, w.in_out, nb, wpc, accumulate,
               bias ? bias + f0 : bias);
    }
  });
}

enum class Path { blas_rows, blas_cols, packed, tokens, gemv };

// The product linear<T> takes for m tokens (k > 0).
Path choose_path(std::size_t m, bool trans_w) {
  switch (gemm_route()) {
    case GemmRoute::blas:
      return m >= 2 * kRowBlock ? Path::blas_rows : Path::blas_cols;
    case GemmRoute::packed:
      return Path::packed;
    case GemmRoute::tokens:
      if (trans_w) return Path::tokens;
      break;
    case GemmRoute::automatic:
      break;
  }
  // From 512 tokens OpenBLAS stays: level with the packed kernel on one thread, 2-15% ahead on
  // two at m = 512 / 2048 (benchmarks/bench_gemm.py, TinyLlama shapes, AVX2). On AVX-512 the
  // packed kernel is not measured yet: there it runs only when forced (tests).
  if (m >= 2 * kRowBlock) return Path::blas_rows;
  if (active_isa() != Isa::avx512 && m >= kPackedMinRows) return Path::packed;
  return !trans_w ? Path::blas_cols : m > gemv_max_rows() ? Path::tokens : Path::gemv;
}

// The product linear(WeightRef) takes for m tokens (k > 0) of 16-bit or quantized weights:
// packed = gemm_packed_w_kernel (converted while packed), blas_rows = widened column blocks for
// the BLAS (16-bit only), tokens = gemm_xt_w16 / gemm_q (x packed, weights converted in place /
// in a tile), gemv. The forced routes apply as for float32 (blas: 16-bit only, quantized weights
// then take the automatic choice). Quantized weights up to kGemvMaxRows tokens always take the
// GEMV (their activations may be quantized, drivers/qlinear.cpp), whatever the route; with int8
// activations the automatic route keeps them on it up to 16 tokens (drivers/qlinear.cpp decides).
Path choose_path_w(std::size_t m, bool quantized) {
  switch (gemm_route()) {
    case GemmRoute::blas:
      if (!quantized) return Path::blas_rows;
      break;
    case GemmRoute::packed:
      return Path::packed;
    case GemmRoute::tokens:
      return Path::tokens;
    case GemmRoute::automatic:
      break;
  }
  // The packed kernel from 9 tokens on (on AVX-512 for quantized weights only: below), for every m:
  // its converting pack reads each weight once per call, at 2 (16-bit) or 1-1.1 bytes
  // (quantized) instead of float32's 4, so it catches up with gemm_xt_w16 / gemm_q earlier than
  // float32 does with gemm_xt. Measured on the AVX2 EPYC (the TinyLlama layer's projections,
  // tokens/s of the layer, 1 thread, busy machine; int8 / int4 group 32):
  //   m = 10:  bf16 298 vs gemm_xt_w16 241, f16 347 vs 281, int8 359 vs gemm_q 307, int4 352 vs 297
  //   m = 16:  bf16 415 vs 384, f16 462 vs 452, int8 449 vs 486, int4 488 vs 468 (level: 6 + 6 +
  //            4 tokens leave a third of the last token panel empty)
  //   m = 22:  bf16 519 vs 425, f16 459 vs 410, int8 536 vs 431, int4 542 vs 444
  //   m = 128: bf16 759 vs 383, f16 787 vs 421, int8 837 vs 474, int4 813 vs 424
  //   m = 512: bf16 830 vs 795 widened + BLAS, f16 853 vs 810 (2 threads 880 vs 855 / 848);
  //            int8 695 vs gemm_q 434, int4 743 vs 368
  //   m = 2048: bf16 786 vs 819 widened + BLAS, f16 856 vs 786 (level within the noise)
  // -- so the widen + BLAS path of 16-bit weights is kept only for AVX-512 (and the forced route).
  // Quantized weights take the packed kernel on every ISA: on AVX-512 too its converting pack
  // beats gemm_q's tile conversion at every m. Intel Emerald Rapids, avx512, 2048 -> 5632, float
  // activations, gemm_q time / packed time at 1 thread (2 threads): m = 10 1.97 / 1.96 (m = 12
  // 1.72 / 1.60), 16 1.27 / 1.26, 24 1.65 / 1.63, 64 1.22 / 1.25 (1.24 / 1.28), 512 1.75 / 1.74
  // (1.80 / 1.77) for int8 / int4. There 16-bit weights keep gemm_xt_w16 below 512 tokens (the
  // packed kernel 1.06-1.72x its time).
  // (16-bit weights on AVX2 / SSE2: the GEMV up to kGemvMaxRowsBlocked tokens, see there.)
  const std::size_t gemv_max = quantized ? kGemvMaxRows : gemv_max_rows();
  if ((quantized || active_isa() != Isa::avx512) && m > gemv_max) return Path::packed;
  if (!quantized && m >= 2 * kRowBlock) return Path::blas_rows;
  return m > gemv_max ? Path::tokens : Path::gemv;
}

// The decode GEMVs' thread split: blocks of about 1 MiB of weights (long runs for the hardware
// prefetchers' streams), at least 2 per thread, taken by whichever thread is free
// (parallel_for_dynamic): threads that share the memory system do not stream at the same rate,
// and a fixed split waits for the slower one. Each row's arithmetic does not depend on its
// block, so neither do the results. 22-layer TinyLlama shape, Zen 4, 2 threads, ms per decode
// step, medians of 8 interleaved rounds in one process, fixed halves (blocks of 256 rows split
// in two) against this: float32 157.8 / 132.5, bfloat16 77.9 / 66.5 (int8 47.3 / 42.1, int4
// 33.9 / 25.4: drivers/qlinear.cpp). Blocks of 64-256 rows were within 5% of each other.
std::size_t decode_block_rows(std::size_t rows, std::size_t row_bytes) {
  constexpr std::size_t kBlockBytes = std::size_t{1} << 20;
  const std::size_t threads = static_cast<std::size_t>(std::max(1, get_num_threads()));
  std::size_t r = std::min(kBlockBytes / std::max<std::size_t>(row_bytes, 1), rows / (2 * threads));
  return std::max<std::size_t>(16, r / 16 * 16);  // (whole groups of rows for the stripes)
}
}  // namespace

void decode_split(std::size_t rows, std::size_t row_bytes, double cost_per_row,
                  function_ref<void(std::size_t, std::size_t)> fn) {
  parallel_for_dynamic(rows, decode_block_rows(rows, row_bytes), cost_per_row, fn);
}

void set_gemm_route(GemmRoute route) { g_route.store(static_cast<int>(route)); }
GemmRoute gemm_route() { return static_cast<GemmRoute>(g_route.load()); }

template <class T>
void linear(const T* x, std::size_t m, std::size_t k, const T* w, WeightLayout layout,
            std::size_t n, const T* bias, T* y, bool accumulate) {
  if (m == 0 || n == 0) return;
  const bool trans_w = layout == WeightLayout::out_in;
  const std::size_t ldw = trans_w ? k : n;
  const Path path = choose_path(m, trans_w);
  if (k == 0) {  // an empty inner dimension: the product is all zeros
    parallel_for(m, 1, static_cast<double>(n), [&](std::size_t r0, std::size_t r1) {
      if (init_block(y, n, r0, r1, 0, n, bias, accumulate) == T(0))
        std::memset(y + r0 * n, 0, (r1 - r0) * n * sizeof(T));
    });
  } else if (path == Path::packed) {
    gemm_packed<T>(x, m, k, PackedWeights<T>{w, !trans_w, {}}, n, bias, y, accumulate);
  } else if (path == Path::blas_rows) {  // prefill-sized: blocks of rows
    const std::size_t blocks = (m + kRowBlock - 1) / kRowBlock;
    parallel_for(blocks, 1, 2.0 * kRowBlock * k * n, [&](std::size_t b0, std::size_t b1) {
      for (std::size_t blk = b0; blk < b1; ++blk) {
        const std::size_t r0 = blk * kRowBlock, r1 = std::min(m, r0 + kRowBlock);
        const T beta = init_block(y, n, r0, r1, 0, n, bias, accumulate);
        gemm(trans_w, r1 - r0, n, k, x + r0 * k, w, ldw, beta, y + r0 * n, n);
      }
    });
  } else if (path == Path::blas_cols) {  // few rows, or (in, out) weights: blocks of columns
    const std::size_t blocks = (n + kColBlock - 1) / kColBlock;
    parallel_for(blocks, 1, 2.0 * m * k * kColBlock, [&](std::size_t b0, std::size_t b1) {
      for (std::size_t blk = b0; blk < b1; ++blk) {
        const std::size_t c0 = blk * kColBlock, c1 = std::min(n, c0 + kColBlock);
        const T beta = init_block(y, n, 0, m, c0, c1, bias, accumulate);
        gemm(trans_w, m, c1 - c0, k, x, trans_w ? w + c0 * ldw : w + c0, ldw, beta, y + c0, n);
      }
    });
  } else if (path == Path::tokens) {  // a short prefill: x packed, weights read in place
    ScratchLease xt_lease((m + kGemmPanel - 1) / kGemmPanel * kGemmPanel * k * sizeof(T));
    T* const xt = xt_lease.as<T>();
    pack_panels(x, m, k, xt);
    const std::size_t blocks = (n + kColBlock - 1) / kColBlock;
    parallel_for(blocks, 1, 2.0 * m * k * kColBlock, [&](std::size_t b0, std::size_t b1) {
      const std::size_t c0 = b0 * kColBlock, c1 = std::min(n, b1 * kColBlock);
      dispatch(gemm_xt_kernel{}, y + c0, n, static_cast<const T*>(xt), m, w + c0 * k, c1 - c0, k,
               accumulate, bias ? bias + c0 : bias);
    });
  } else {  // decode: matrix-vector products, bound by reading the weights
    decode_split(n, k * sizeof(T), 2.0 * m * k, [&](std::size_t c0, std::size_t c1) {
      dispatch(gemv_kernel{}, y + c0, n, w + c0 * k, x, k, m, c1 - c0, k, accumulate,
               bias ? bias + c0 : bias);
    });
  }
}

namespace {
// y (m, n) (+)= x (m, k) . W^T (+ bias), W bfloat16 (n, k), on the bf16 dot-product kernel
// (kernels/gemm_bf16.hpp): x rounded to bfloat16 once, then column blocks of kBf16BlockCols
// features per task (fixed by the shape: results do not depend on the thread count), each
// thread packing its block's weights into its own scratch
void linear_bf16_dot(Bf16Dot dot, const float* x, std::size_t m, std::size_t k,
                     const std::uint16_t* w, std::size_t n, const float* bias, float* y,
                     bool accumulate) {
  const std::size_t km = dot::bf16_k_multiple(dot), mm = dot::bf16_m_multiple(dot);
  const std::size_t kp = (k + km - 1) / km * km;
  const std::size_t ldxb = dot::bf16_x_stride(kp);
  const std::size_t mp = (m + mm - 1) / mm * mm;  // rows the kernel reads: past m, zeros
  const std::size_t blocks = (n + dot::kBf16BlockCols - 1) / dot::kBf16BlockCols;
  const int chunks = static_cast<int>(
      std::min<std::size_t>(blocks, static_cast<std::size_t>(std::max(1, get_num_threads()))));
  const std::size_t xb_bytes = (mp * ldxb * sizeof(std::uint16_t) + 63) / 64 * 64;
  const std::size_t pack_bytes = dot::kBf16PackWords * sizeof(std::uint32_t);
  ScratchLease lease(xb_bytes + static_cast<std::size_t>(chunks) * pack_bytes);
  auto* xb = lease.as<std::uint16_t>();
  auto* packs = reinterpret_cast<std::uint32_t*>(lease.as<unsigned char>() + xb_bytes);
  dot::round_x_bf16(dot, xb, kp, ldxb, x, k, m, k);
  std::memset(xb + m * ldxb, 0, (mp - m) * ldxb * sizeof(std::uint16_t));
  parallel_chunks(chunks, [&](int c, int nc) {
    std::uint32_t* pack = packs + static_cast<std::size_t>(c) * dot::kBf16PackWords;
    for (std::size_t blk = c; blk < blocks; blk += nc) {
      const std::size_t c0 = blk * dot::kBf16BlockCols;
      const std::size_t c1 = std::min(n, c0 + dot::kBf16BlockCols);
      dot::gemm_bf16_block(dot, y + c0, n, xb, kp, ldxb, m, w + c0 * k, k, c1 - c0, accumulate,
                           bias ? bias + c0 : nullptr, pack);
    }
  });
}
}  // namespace

void linear_w16(const float* x, std::size_t m, std::size_t k, WeightRef w, std::size_t n,
                const float* bias, float* y, bool accumulate) {
  if (m == 0 || n == 0) return;
  const auto* wp = static_cast<const std::uint16_t*>(w.data);
  const WeightFormat fmt = w.format;
  const std::size_t blocks = (n + kColBlock - 1) / kColBlock;
  const Path path = k == 0 ? Path::gemv : choose_path_w(m, false);
  // bfloat16 prefill on vdpbf16ps where the CPU has it (common/dot.hpp): x rounded to bf16,
  // from 9 tokens (where a CPU without it keeps the GEMV up to kGemvMaxRowsBlocked)
  const Bf16Dot bdot = fmt == WeightFormat::bf16 && k > 0 && m > kGemvMaxRows &&
                               gemm_route() == GemmRoute::automatic
                           ? bf16_dot()
                           : Bf16Dot::none;
  if (bdot != Bf16Dot::none) {
    linear_bf16_dot(bdot, x, m, k, wp, n, bias, y, accumulate);
    return;
  }
  if (k == 0) {
    linear<float>(x, m, k, nullptr, WeightLayout::out_in, n, bias, y, accumulate);
  } else if (path == Path::packed) {  // both operands packed, the weights widened as packed
    gemm_packed<float>(x, m, k, PackedWeights<float>{nullptr, false, w}, n, bias, y, accumulate);
  } else if (path == Path::blas_rows) {
    // per column block, its kColBlock rows widened into a float32 tile (one per thread,
    // kColBlock x k: never the whole matrix) and one single-threaded BLAS call on the tile --
    // the widening is paid once per block for all m tokens. Block shapes depend on the shape
    // only: results do not depend on the thread count.
    const int chunks = static_cast<int>(
        std::min<std::size_t>(blocks, static_cast<std::size_t>(std::max(1, get_num_threads()))));
    ScratchLease tile_lease(static_cast<std::size_t>(chunks) * kColBlock * k * sizeof(float));
    float* const tiles = tile_lease.as<float>();
    parallel_chunks(chunks, [&](int c, int nc) {
      float* tile = tiles + static_cast<std::size_t>(c) * kColBlock * k;  // (kColBlock, k)
      for (std::size_t blk = c; blk < blocks; blk += nc) {
        const std::size_t c0 = blk * kColBlock, c1 = std::min(n, c0 + kColBlock);
        dispatch(widen_w16_kernel{}, tile, wp + c0 * k, fmt, (c1 - c0) * k);
        const float beta = init_block(y, n, 0, m, c0, c1, bias, accumulate);
        gemm(true, m, c1 - c0, k, x, tile, k, beta, y + c0, n);
      }
    });
  } else if (path == Path::tokens) {  // a short prefill: tokens packed, weights converted in place
    ScratchLease xt_lease((m + kGemmPanel - 1) / kGemmPanel * kGemmPanel * k * sizeof(float));
    float* const xt = xt_lease.as<float>();  // (m rounded up to kGemmPanel, k) in panels
    pack_panels(x, m, k, xt);
    parallel_for(blocks, 1, 2.0 * m * k * kColBlock, [&](std::size_t b0, std::size_t b1) {
      // one column block per call: its 16-bit rows (kColBlock x k) stay in the cache while
      // every token chunk passes over them
      for (std::size_t blk = b0; blk < b1; ++blk) {
        const std::size_t c0 = blk * kColBlock, c1 = std::min(n, c0 + kColBlock);
        dispatch(gemm_xt_w16_kernel{}, y + c0, n, static_cast<const float*>(xt), m, wp + c0 * k,
                 fmt, c1 - c0, k, accumulate, bias ? bias + c0 : bias);
      }
    });
  } else {  // decode: bound by reading the (half-size) weights
    decode_split(n, 2 * k, 2.0 * m * k, [&](std::size_t c0, std::size_t c1) {
      dispatch(gemv_w16_kernel{}, y + c0, n, wp + c0 * k, fmt, x, k, m, c1 - c0, k, accumulate,
               bias ? bias + c0 : bias);
    });
  }
}

bool packed_route_w(std::size_t m, WeightFormat format) {
  return m > kGemvMaxRows && choose_path_w(m, is_quantized(format)) == Path::packed;
}

void linear_packed_w(const float* x, std::size_t m, std::size_t k, const WeightRef& w,
                     std::size_t n, const float* bias, float* y, bool accumulate) {
  if (m == 0 || n == 0 || k == 0) return;  // (k == 0: the callers handle an empty product)
  gemm_packed<float>(x, m, k, PackedWeights<float>{nullptr, false, w}, n, bias, y, accumulate);
}

template void linear<float>(const float*, std::size_t, std::size_t, const float*, WeightLayout,
                            std::size_t, const float*, float*, bool);
template void linear<double>(const double*, std::size_t, std::size_t, const double*,
                             WeightLayout, std::size_t, const double*, double*, bool);

}  // namespace llmk
