// gemm_packed_w_kernel: gemm.hpp's packed GEMM (Goto/BLIS, both operands packed; prefill of
// hundreds of tokens) on weights stored in any WeightFormat -- float32, bfloat16 / float16
// words, or group-wise int8 / int4 codes with float16 scales (kernels/quant.hpp's format).
//
// Only the weight pack differs: gemm_packed_impl takes it as a policy, and the packs below
// convert while they pack, writing the same float micro-panels gemm_pack_w writes from a float32
// matrix. A widened bf16 / f16 weight is exact in float32, and so is a dequantized code * scale
// (at most 8 + 11 significant bits), so the panels -- and every product -- equal the float32
// kernel's on the widened / dequantized matrix bit for bit (tests/ops/test_gemm_packed_w.py).
// The only converted copy is the thread's packed block (kGemmPackKc x gemm_pack_nc(m, k) floats,
// the scratch the float32 kernel packs into anyway): never a dequantized copy of the matrix. The
// conversion is paid once per block for all m tokens of the call.
//
// AVX2 / AVX-512 units: 8 features x 8 k are converted into eight 8-float registers and stored
// transposed (gemm.hpp's transpose8x8_store); the SSE2 unit does 4 x 4 (_MM_TRANSPOSE4_PS).
#pragma once

#include <algorithm>

#include "common/mxcsr.hpp"
#include "kernels/gemm.hpp"
#include "kernels/ops.hpp"
#include "kernels/quant.hpp"     // qblock_float, scales_to_float, QF (the codes -> float)
#include "kernels/weight16.hpp"  // load_w16, w16_to_f32 (the 16-bit words -> float)

namespace llmk {
namespace {

// Rows of features a pack step converts at once: 8 (one AVX2 register of k per feature), 4 on
// SSE2. Every ISA's micro-panel (NR = 8, 16, 32 features) is a multiple of 8.
#if defined(__AVX2__)
constexpr std::size_t kPackRows = 8;
#else
constexpr std::size_t kPackRows = 4;
#endif

// tile (kPackRows x 8 floats per row step, row stride lds) -> dst[q * ldd + i] = tile[i * lds +
// q] for i < kPackRows, q < 8: a converted block into the k-major panel
inline void pack_store_tile(float* dst, std::size_t ldd, const float* tile, std::size_t lds) {
#if defined(__AVX2__)
  transpose8x8(dst, ldd, tile, lds);
#else
  for (std::size_t h = 0; h < 8; h += 4) {
    __m128 r0 = _mm_load_ps(tile + h), r1 = _mm_load_ps(tile + lds + h);
    __m128 r2 = _mm_load_ps(tile + 2 * lds + h), r3 = _mm_load_ps(tile + 3 * lds + h);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    _mm_storeu_ps(dst + h * ldd, r0);
    _mm_storeu_ps(dst + (h + 1) * ldd, r1);
    _mm_storeu_ps(dst + (h + 2) * ldd, r2);
    _mm_storeu_ps(dst + (h + 3) * ldd, r3);
  }
#endif
}

// 16-bit weights (n, k) row-major of format F: the panels of gemm_pack_w (out_in) with each word
// widened exactly (weight16.hpp's conversions: bf16 a shift, f16 F16C / its exact SSE2 twin).
template <WeightFormat F>
struct PackW16 {
  const std::uint16_t* w;  // (n, k)
  std::size_t k;
  template <class Arch, std::size_t NR>
  void run(float* wp, std::size_t j0, std::size_t nb, std::size_t pc, std::size_t kc) const {
    static_assert(NR % kPackRows == 0, "whole row steps per micro-panel");
    for (std::size_t f0 = 0; f0 < nb; f0 += NR) {
      float* dst = wp + f0 * kc;  // (kc, NR) micro-panel
      const std::size_t cols = std::min(NR, nb - f0);
      for (std::size_t r0 = 0; r0 < NR; r0 += kPackRows) {
        const std::uint16_t* src = w + (j0 + f0 + r0) * k + pc;  // (rows, kc) of the panel
        const std::size_t rows = cols > r0 ? std::min(kPackRows, cols - r0) : 0;
        std::size_t kk = 0;
#if defined(__AVX2__)
        // 8 words of a row widen into one register: 8 rows are an 8 x 8 block, stored transposed
        for (; kk + 8 <= kc; kk += 8) {
          __m256 r[8];
          for (std::size_t i = 0; i < 8; ++i)
            r[i] =
                i < rows
                    ? static_cast<__m256>(load_w16<F>(xsimd::fma3<xsimd::avx2>{}, src + i * k + kk))
                    : _mm256_setzero_ps();
          transpose8x8_store(dst + kk * NR + r0, NR, r);
        }
#else
        alignas(16) float tile[kPackRows][8];  // (rows, 8 k) widened, then transposed
        for (; kk + 8 <= kc; kk += 8) {
          for (std::size_t i = 0; i < kPackRows; ++i)
            for (std::size_t h = 0; h < 8; h += 4)
              _mm_store_ps(&tile[i][h], i < rows ? static_cast<__m128>(load_w16<F>(
                                                       xsimd::sse2{}, src + i * k + kk + h))
                                                 : _mm_setzero_ps());
          pack_store_tile(dst + kk * NR + r0, NR, &tile[0][0], 8);
        }
#endif
        for (std::size_t i = 0; i < kPackRows; ++i)  // the k tail (kc % 8)
          for (std::size_t q = kk; q < kc; ++q)
            dst[q * NR + r0 + i] = i < rows ? w16_to_f32<F>(src[i * k + q]) : 0.f;
      }
    }
  }
};

// Group-wise int8 / int4 codes (kernels/quant.hpp's format), rows = features: each block of 32
// codes widened (qblock_float) and multiplied by its group's scale -- the exact dequantized
// weight -- into a (kPackRows, 32) tile, stored transposed into the panel. pc and kc are whole
// groups: pc a multiple of kGemmPackKc (a multiple of every group size), kc = min(kGemmPackKc,
// k - pc) with k a multiple of the group.
template <int Bits>
struct PackQ {
  const std::uint8_t* q;        // bits 8: (n, k) int8 codes; bits 4: (n, k / 2) nibbles
  const std::uint16_t* scales;  // (n, k / group) float16 bits
  std::size_t k, group;
  template <class Arch, std::size_t NR>
  void run(float* wp, std::size_t j0, std::size_t nb, std::size_t pc, std::size_t kc) const {
    static_assert(NR % kPackRows == 0, "whole row steps per micro-panel");
    static_assert(kGemmPackKc % 128 == 0, "a block of k holds whole groups");
    const std::size_t ng = k / group, row_bytes = Bits == 8 ? k : k / 2;
    const std::size_t g0 = pc / group, gn = kc / group, bpg = group / kQBlock;
    alignas(32) float sc[kPackRows][kGemmPackKc / kQBlock];  // (rows, gn) the scales as float
    alignas(32) float tile[kPackRows][kQBlock];              // (rows, 32) dequantized
    for (std::size_t f0 = 0; f0 < nb; f0 += NR) {
      float* dst = wp + f0 * kc;  // (kc, NR) micro-panel
      const std::size_t cols = std::min(NR, nb - f0);
      for (std::size_t r0 = 0; r0 < NR; r0 += kPackRows) {
        const std::size_t row0 = j0 + f0 + r0;
        const std::size_t rows = cols > r0 ? std::min(kPackRows, cols - r0) : 0;
        for (std::size_t i = 0; i < rows; ++i)
          scales_to_float(scales + (row0 + i) * ng + g0, sc[i], gn);
        for (std::size_t i = rows; i < kPackRows; ++i)
          for (std::size_t j = 0; j < kQBlock; ++j) tile[i][j] = 0.f;
        for (std::size_t b = 0; b < kc / kQBlock; ++b) {
          for (std::size_t i = 0; i < rows; ++i) {
            QF f[kQBlockVectors];
            qblock_float<Bits>(q + (row0 + i) * row_bytes, pc / kQBlock + b, f);
            const QF s(sc[i][b / bpg]);
            for (std::size_t j = 0; j < kQBlockVectors; ++j)
              (f[j] * s).store_aligned(&tile[i][j * kQF]);
          }
          for (std::size_t j = 0; j < kQBlock; j += 8)
            pack_store_tile(dst + (b * kQBlock + j) * NR + r0, NR, &tile[0][j], kQBlock);
        }
      }
    }
  }
};

}  // namespace

// y (m, n) (+)= x (m, k) . W^T (+ bias): x packed by gemm_pack_x_kernel (xp), W (n, k) rows =
// output features in w.format (f32, bf16, f16: (n, k) elements; q8: (n, k) int8 codes; q4:
// (n, k / 2) nibbles; quantized: scales (n, k / group), k a multiple of the group); y row stride
// ldy; bias (n,) or null; wpack: kGemmPackKc * gemm_pack_nc(m, k) floats of this thread's
// scratch. The same bits as gemm_packed_kernel on the float32 (widened / dequantized) matrix.
template <class Arch>
void gemm_packed_w_kernel::operator()(Arch, float* y, std::size_t ldy, const float* xp,
                                      std::size_t m, std::size_t k, const WeightRef& w,
                                      std::size_t n, float* wpack, bool accumulate,
                                      const float* bias) const {
  ExactSubnormals exact;  // subnormal operands count (no DAZ), whatever the caller's MXCSR
  const auto* w16 = static_cast<const std::uint16_t*>(w.data);
  const auto* codes = static_cast<const std::uint8_t*>(w.data);
  switch (w.format) {
    case WeightFormat::f32:
      gemm_packed_impl<Arch, float>(y, ldy, xp, m, k,
                                    PackPlain<float>{static_cast<const float*>(w.data), k, false},
                                    n, wpack, accumulate, bias);
      break;
    case WeightFormat::bf16:
      gemm_packed_impl<Arch, float>(y, ldy, xp, m, k, PackW16<WeightFormat::bf16>{w16, k}, n, wpack,
                                    accumulate, bias);
      break;
    case WeightFormat::f16:
      gemm_packed_impl<Arch, float>(y, ldy, xp, m, k, PackW16<WeightFormat::f16>{w16, k}, n, wpack,
                                    accumulate, bias);
      break;
    case WeightFormat::q8:
      gemm_packed_impl<Arch, float>(y, ldy, xp, m, k, PackQ<8>{codes, w.scales, k, w.group}, n,
                                    wpack, accumulate, bias);
      break;
    case WeightFormat::q4:
      gemm_packed_impl<Arch, float>(y, ldy, xp, m, k, PackQ<4>{codes, w.scales, k, w.group}, n,
                                    wpack, accumulate, bias);
      break;
  }
}

}  // namespace llmk
