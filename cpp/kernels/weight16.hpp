// Projections with 16-bit weights (bfloat16, float16) converted to float32 in registers as they
// are loaded: never a widened copy of a matrix. Activations and accumulators are float32.
//
// bf16 -> f32 is exact and cheap: the 16 bits are the high half of the float32 (a shift of the
// zero-extended integer). f16 -> f32 uses F16C's vcvtph2ps on the AVX2 / AVX-512 paths and an
// exact integer conversion on SSE2 (and for scalar tails) -- the two agree bit for bit,
// subnormals included, and neither touches a subnormal float (so DAZ/FTZ cannot change them).
//
// gemv_w16_kernel and gemm_xt_w16_kernel are gemv_kernel's and gemm_xt_kernel's bodies
// (kernels/gemv.hpp, kernels/gemm.hpp) with the weight-load policy Widen16 below: the same
// operations, so on weights that are exactly representable in 16 bits a product equals the
// float32 kernel's on the widened weights bit for bit (tests/ops/test_linear_lowp.py checks it).
// As there, every output goes through the same arithmetic whatever block it falls in: results
// do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstring>

#include "kernels/gemm.hpp"
#include "kernels/gemv.hpp"
#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

inline float bf16_to_f32(std::uint16_t h) {
  const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Exact f16 -> f32 with integer operations only (as F16C's vcvtph2ps): the exponent is rebased
// (15 -> 127); inf/NaN keep an all-ones exponent (payload kept); a zero or subnormal half is
// built as the normal float 2^-14 * (1 + m/1024) and 2^-14 subtracted, which is exact.
inline float f16_to_f32(std::uint16_t h) {
  std::uint32_t o = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t e = o & 0x0f800000u;
  o += (127u - 15u) << 23;
  float f;
  if (e == 0x0f800000u) {  // inf / NaN
    o += (128u - 16u) << 23;
    std::memcpy(&f, &o, sizeof f);
  } else if (e == 0) {  // zero / subnormal
    o += 1u << 23;
    std::memcpy(&f, &o, sizeof f);
    float magic;
    const std::uint32_t mb = 113u << 23;
    std::memcpy(&magic, &mb, sizeof magic);
    f -= magic;
  } else {
    std::memcpy(&f, &o, sizeof f);
  }
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u |= static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <WeightFormat F>
inline float w16_to_f32(std::uint16_t h) {
  return F == WeightFormat::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// --- N consecutive 16-bit weights -> one float32 batch, per ISA ---------------------------

// SSE2: 4 weights (8 bytes)
template <WeightFormat F>
inline vec<xsimd::sse2, float> load_w16(xsimd::sse2, const std::uint16_t* p) {
  const __m128i zero = _mm_setzero_si128();
  const __m128i raw = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if constexpr (F == WeightFormat::bf16) {
    return _mm_castsi128_ps(_mm_unpacklo_epi16(zero, raw));  // each 16 bits as a high half
  } else {
    const __m128i h = _mm_unpacklo_epi16(raw, zero);  // zero-extended to 32 bits
    __m128i o = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x7fff)), 13);
    const __m128i e = _mm_and_si128(o, _mm_set1_epi32(0x0f800000));
    o = _mm_add_epi32(o, _mm_set1_epi32((127 - 15) << 23));
    const __m128i inf = _mm_cmpeq_epi32(e, _mm_set1_epi32(0x0f800000));
    o = _mm_add_epi32(o, _mm_and_si128(inf, _mm_set1_epi32((128 - 16) << 23)));
    const __m128i sub = _mm_cmpeq_epi32(e, zero);
    o = _mm_add_epi32(o, _mm_and_si128(sub, _mm_set1_epi32(1 << 23)));
    __m128 f = _mm_castsi128_ps(o);
    f = _mm_sub_ps(f, _mm_castsi128_ps(_mm_and_si128(sub, _mm_set1_epi32(113 << 23))));
    const __m128i sign = _mm_slli_epi32(_mm_and_si128(h, _mm_set1_epi32(0x8000)), 16);
    return _mm_or_ps(f, _mm_castsi128_ps(sign));
  }
}

#if defined(__AVX2__)
// AVX2 (+F16C): 8 weights (16 bytes); AVX-512: 16 weights (32 bytes). The same two conversions
// at either width: bf16 zero-extended into the high half of a float32, f16 by F16C (exact).
template <WeightFormat F, class Arch>
inline vec<Arch, float> load_w16(Arch, const std::uint16_t* p) {
#if defined(__AVX512F__)
  if constexpr (std::is_same<Arch, xsimd::avx512bw>::value) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return F == WeightFormat::bf16
               ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16))
               : _mm512_cvtph_ps(raw);
  } else
#endif
  {
    static_assert(std::is_same<Arch, xsimd::fma3<xsimd::avx2>>::value, "an ISA of isa_list.hpp");
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (F == WeightFormat::bf16) {
      // the 8 words broadcast to both 128-bit lanes (a load, no ALU work), then one in-lane
      // byte shuffle puts word i into the high half of float i (low lane words 0-3, high lane
      // 4-7) and zeroes the low halves: one ALU operation per 8 weights instead of a
      // zero-extension and a shift, which left the bf16 GEMV compute-bound on one thread.
      // The floats are the same, in the same lanes: results do not change by a bit.
      const __m256i spread = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6,
                                              7, -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1,
                                              -1, 14, 15);
      return _mm256_castsi256_ps(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(raw), spread));
    } else {
      return _mm256_cvtph_ps(raw);
    }
  }
}
#endif

// The weight-load policy of the shared projection bodies (kernels/gemv.hpp) for 16-bit weights
// of format F: widened to float32 as they are loaded.
template <WeightFormat F>
struct Widen16 {
  using Stored = std::uint16_t;
  static constexpr bool widens = true;
  template <class Arch>
  static vec<Arch, float> load(Arch, const std::uint16_t* p) {
    return load_w16<F>(Arch{}, p);
  }
  static float scalar(std::uint16_t h) { return w16_to_f32<F>(h); }
};

}  // namespace

// y[t, r] (+)= dot(w[r, :], x[t, :]) (+ bias[r])   y (m, rows) row stride ldy, w (rows, k)
// row-major 16-bit weights of format fmt (bf16 or f16), x (m, k) row stride ldx, bias (rows,)
// or null -- decode projections with low-precision weights
template <class Arch>
void gemv_w16_kernel::operator()(Arch, float* y, std::size_t ldy, const std::uint16_t* w,
                                 WeightFormat fmt, const float* x, std::size_t ldx, std::size_t m,
                                 std::size_t rows, std::size_t k, bool accumulate,
                                 const float* bias) const {
  if (fmt == WeightFormat::bf16)
    gemv_impl<Arch, float, Widen16<WeightFormat::bf16>>(y, ldy, w, x, ldx, m, rows, k, accumulate,
                                                        bias);
  else
    gemv_impl<Arch, float, Widen16<WeightFormat::f16>>(y, ldy, w, x, ldx, m, rows, k, accumulate,
                                                       bias);
}

// y (m, n) (+)= x (m, k) . w (n, k)^T (+ bias), x packed by pack_panels (as gemm_xt_kernel),
// w (n, k) row-major 16-bit weights of format fmt; y row stride ldy; bias (n,) or null
template <class Arch>
void gemm_xt_w16_kernel::operator()(Arch, float* y, std::size_t ldy, const float* xt, std::size_t m,
                                    const std::uint16_t* w, WeightFormat fmt, std::size_t n,
                                    std::size_t k, bool accumulate, const float* bias) const {
  if (fmt == WeightFormat::bf16)
    gemm_xt_impl<Arch, float, Widen16<WeightFormat::bf16>>(y, ldy, xt, m, w, n, k, accumulate,
                                                           bias);
  else
    gemm_xt_impl<Arch, float, Widen16<WeightFormat::f16>>(y, ldy, xt, m, w, n, k, accumulate, bias);
}

// out (n,) = w (n,) 16-bit weights of format fmt, widened to float32 (embedding rows)
template <class Arch>
void widen_w16_kernel::operator()(Arch, float* out, const std::uint16_t* w, WeightFormat fmt,
                                  std::size_t n) const {
  using V = vec<Arch, float>;
  constexpr std::size_t N = V::size;
  std::size_t i = 0;
  if (fmt == WeightFormat::bf16) {
    for (; i + N <= n; i += N) load_w16<WeightFormat::bf16>(Arch{}, w + i).store_unaligned(out + i);
    for (; i < n; ++i) out[i] = bf16_to_f32(w[i]);
  } else {
    for (; i + N <= n; i += N) load_w16<WeightFormat::f16>(Arch{}, w + i).store_unaligned(out + i);
    for (; i < n; ++i) out[i] = f16_to_f32(w[i]);
  }
}

}  // namespace llmk
