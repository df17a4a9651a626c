// Projections with 16-bit weights (bfloat16, float16) converted to float32 in registers as they
// are loaded: never a widened copy of a matrix. Activations and accumulators are float32.
//
// bf16 -> f32 is exact and cheap: the 16 bits are the high half of the float32 (a shift of the
// zero-extended integer). f16 -> f32 uses F16C's vcvtph2ps on the AVX2 / AVX-512 paths and an
// exact integer conversion on SSE2 (and for scalar tails) -- the two agree bit for bit,
// subnormals included, and neither touches a subnormal float (so DAZ/FTZ cannot change them).
//
// gemv_w16_kernel mirrors gemv_kernel (kernels/gemv.hpp) and gemm_xt_w16_kernel mirrors
// gemm_xt_kernel (kernels/gemm.hpp) operation for operation: on weights that are exactly
// representable in 16 bits, a product equals the float32 kernel's on the widened weights bit for
// bit (tests/ops/test_linear_lowp.py checks it). As there, every output goes through the same
// arithmetic whatever block it falls in: results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstring>

#include "kernels/gemm.hpp"
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
// AVX2 (+F16C): 8 weights (16 bytes)
template <WeightFormat F>
inline vec<xsimd::fma3<xsimd::avx2>, float> load_w16(xsimd::fma3<xsimd::avx2>,
                                                     const std::uint16_t* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (F == WeightFormat::bf16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  else
    return _mm256_cvtph_ps(raw);
}
#endif

#if defined(__AVX512F__)
// AVX-512: 16 weights (32 bytes)
template <WeightFormat F>
inline vec<xsimd::avx512bw, float> load_w16(xsimd::avx512bw, const std::uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (F == WeightFormat::bf16)
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  else
    return _mm512_cvtph_ps(raw);
}
#endif

// --- GEMV: y[t * ldy + r] (+)= dot(w[r, :], x[t, :]) (+ bias[r]), as gemv_rows ------------

template <class Arch, WeightFormat F, int R, int M>
inline void gemv_w16_rows(float* y, std::size_t ldy, const std::uint16_t* w, const float* x,
                          std::size_t ldx, std::size_t k, bool accumulate, const float* bias) {
  using V = vec<Arch, float>;
  constexpr std::size_t N = V::size;
  constexpr int A = M == 1 ? 2 : 1;  // accumulators per (row, token), as gemv_rows
  V acc[A][R][M];
  for (int a = 0; a < A; ++a)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < M; ++t) acc[a][r][t] = V(0.f);
  std::size_t i = 0;
  for (; i + A * N <= k; i += A * N) {
    for (int a = 0; a < A; ++a) {
      V xv[M];
      for (int t = 0; t < M; ++t) xv[t] = V::load_unaligned(x + t * ldx + i + a * N);
      for (int r = 0; r < R; ++r) {
        const V wv = load_w16<F>(Arch{}, w + r * k + i + a * N);
        for (int t = 0; t < M; ++t) acc[a][r][t] = xsimd::fma(wv, xv[t], acc[a][r][t]);
      }
    }
  }
  if (A > 1 && i + N <= k) {  // one more full vector
    V xv[M];
    for (int t = 0; t < M; ++t) xv[t] = V::load_unaligned(x + t * ldx + i);
    for (int r = 0; r < R; ++r) {
      const V wv = load_w16<F>(Arch{}, w + r * k + i);
      for (int t = 0; t < M; ++t) acc[0][r][t] = xsimd::fma(wv, xv[t], acc[0][r][t]);
    }
    i += N;
  }
  for (int r = 0; r < R; ++r) {
    // the row's tail (< A * N weights) widened first: the tail loop below is then the float32
    // kernel's, compiled to the same instructions (the same contractions into FMAs)
    float wt[2 * N];
    for (std::size_t j = i; j < k; ++j) wt[j - i] = w16_to_f32<F>(w[r * k + j]);
    for (int t = 0; t < M; ++t) {
      V v = acc[0][r][t];
      for (int a = 1; a < A; ++a) v += acc[a][r][t];
      float sum = xsimd::hadd(v);
      for (std::size_t j = i; j < k; ++j) sum += wt[j - i] * x[t * ldx + j];  // scalar tail
      float& dst = y[t * ldy + r];
      dst = accumulate ? dst + sum : sum;
      if (bias) dst += bias[r];
    }
  }
}

template <class Arch, WeightFormat F, int M>
inline void gemv_w16_tokens(float* y, std::size_t ldy, const std::uint16_t* w, const float* x,
                            std::size_t ldx, std::size_t rows, std::size_t k, bool accumulate,
                            const float* bias) {
  constexpr int R = 4;
  std::size_t r = 0;
  for (; r + R <= rows; r += R)
    gemv_w16_rows<Arch, F, R, M>(y + r, ldy, w + r * k, x, ldx, k, accumulate,
                                 bias ? bias + r : bias);
  for (; r < rows; ++r)
    gemv_w16_rows<Arch, F, 1, M>(y + r, ldy, w + r * k, x, ldx, k, accumulate,
                                 bias ? bias + r : bias);
}

template <class Arch, WeightFormat F>
inline void gemv_w16(float* y, std::size_t ldy, const std::uint16_t* w, const float* x,
                     std::size_t ldx, std::size_t m, std::size_t rows, std::size_t k,
                     bool accumulate, const float* bias) {
  constexpr std::size_t G = 4;  // tokens per pass over the weights
  std::size_t t = 0;
  for (; t + G <= m; t += G)
    gemv_w16_tokens<Arch, F, G>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
  switch (m - t) {
    case 1:
      gemv_w16_tokens<Arch, F, 1>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    case 2:
      gemv_w16_tokens<Arch, F, 2>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    case 3:
      gemv_w16_tokens<Arch, F, 3>(y + t * ldy, ldy, w, x + t * ldx, ldx, rows, k, accumulate, bias);
      break;
    default:
      break;
  }
}

// --- GEMM over packed tokens, as gemm_xt_block --------------------------------------------

// k is walked in sub-chunks of this length: the RN weight rows of a sub-chunk are converted
// once into a float32 tile on the stack (RN x 256 floats, at most 12 KiB: stays in L1) and
// broadcast from there -- the only widened copy is this tile.
constexpr std::size_t kW16Tile = 256;

// y[t, f] (+)= sum_kk xt[kk, t] * w[f * ldw + kk] (+ bias[f]) for f < RN, t < min(valid, TV*N)
//   y  (.., ldy)   row t, column f
//   xt (k, ldxt)   packed tokens, zero past the last token
//   w  (RN, ldw)   RN 16-bit weight rows
template <class Arch, WeightFormat F, int RN, int TV>
inline void gemm_xt_w16_block(float* y, std::size_t ldy, const float* xt, std::size_t ldxt,
                              const std::uint16_t* w, std::size_t ldw, std::size_t k,
                              std::size_t valid, bool accumulate, const float* bias) {
  using V = vec<Arch, float>;
  constexpr std::size_t N = V::size;
  V acc[RN][TV];
  for (int f = 0; f < RN; ++f)
    for (int j = 0; j < TV; ++j) acc[f][j] = V(0.f);
  alignas(64) float wt[RN][kW16Tile];  // (RN, kc) the sub-chunk's weights in float32
  for (std::size_t k0 = 0; k0 < k; k0 += kW16Tile) {
    const std::size_t kc = std::min(k - k0, kW16Tile);
    for (int f = 0; f < RN; ++f) {
      const std::uint16_t* src = w + f * ldw + k0;
      std::size_t kk = 0;
      for (; kk + N <= kc; kk += N) load_w16<F>(Arch{}, src + kk).store_aligned(&wt[f][kk]);
      for (; kk < kc; ++kk) wt[f][kk] = w16_to_f32<F>(src[kk]);
    }
    const float* xk = xt + k0 * ldxt;
    for (std::size_t kk = 0; kk < kc; ++kk) {
      V xv[TV];
      for (int j = 0; j < TV; ++j) xv[j] = V::load_unaligned(xk + kk * ldxt + j * N);
      for (int f = 0; f < RN; ++f) {
        const V wv(wt[f][kk]);
        for (int j = 0; j < TV; ++j) acc[f][j] = xsimd::fma(wv, xv[j], acc[f][j]);
      }
    }
  }
  alignas(64) float tile[RN][TV * N];
  for (int f = 0; f < RN; ++f)
    for (int j = 0; j < TV; ++j) acc[f][j].store_aligned(&tile[f][j * N]);
  const std::size_t rows = std::min(valid, TV * N);
  for (std::size_t t = 0; t < rows; ++t) {
    float* dst = y + t * ldy;
    for (int f = 0; f < RN; ++f) {
      dst[f] = accumulate ? dst[f] + tile[f][t] : tile[f][t];
      if (bias) dst[f] += bias[f];
    }
  }
}

template <class Arch, WeightFormat F, int TV>
inline void gemm_xt_w16_tokens(float* y, std::size_t ldy, const float* xt, std::size_t ldxt,
                               std::size_t valid, const std::uint16_t* w, std::size_t ldw,
                               std::size_t n, std::size_t k, bool accumulate, const float* bias) {
  constexpr int RN = gemm_xt_features<Arch>(TV);
  std::size_t f = 0;
  for (; f + RN <= n; f += RN)
    gemm_xt_w16_block<Arch, F, RN, TV>(y + f, ldy, xt, ldxt, w + f * ldw, ldw, k, valid, accumulate,
                                       bias ? bias + f : bias);
  for (; f < n; ++f)  // feature tail
    gemm_xt_w16_block<Arch, F, 1, TV>(y + f, ldy, xt, ldxt, w + f * ldw, ldw, k, valid, accumulate,
                                      bias ? bias + f : bias);
}

template <class Arch, WeightFormat F>
inline void gemm_xt_w16(float* y, std::size_t ldy, const float* xt, std::size_t m,
                        const std::uint16_t* w, std::size_t n, std::size_t k, bool accumulate,
                        const float* bias) {
  constexpr std::size_t N = vec<Arch, float>::size;
  constexpr std::size_t chunk = kGemmXtTokenVectors * N;
  static_assert(kGemmPanel % chunk == 0, "a token chunk must not straddle two panels");
  for (std::size_t t = 0; t < m; t += chunk) {
    const std::size_t vectors = (std::min(m - t, chunk) + N - 1) / N;
    const float* panel = xt + (t / kGemmPanel) * k * kGemmPanel + t % kGemmPanel;
    for (std::size_t k0 = 0; k0 < k; k0 += kGemmXtKChunk) {  // the float32 kernel's k chunks
      const std::size_t kc = std::min(k - k0, kGemmXtKChunk);
      const bool acc = accumulate || k0 > 0;
      const float* b = k0 + kc == k ? bias : nullptr;  // the bias goes with the last chunk
      float* yt = y + t * ldy;
      const float* x0 = panel + k0 * kGemmPanel;
      const std::size_t valid = m - t;
      switch (vectors) {
        case 1:
          gemm_xt_w16_tokens<Arch, F, 1>(yt, ldy, x0, kGemmPanel, valid, w + k0, k, n, kc, acc, b);
          break;
        case 2:
          gemm_xt_w16_tokens<Arch, F, 2>(yt, ldy, x0, kGemmPanel, valid, w + k0, k, n, kc, acc, b);
          break;
        case 3:
          gemm_xt_w16_tokens<Arch, F, 3>(yt, ldy, x0, kGemmPanel, valid, w + k0, k, n, kc, acc, b);
          break;
        default:
          gemm_xt_w16_tokens<Arch, F, kGemmXtTokenVectors>(yt, ldy, x0, kGemmPanel, valid, w + k0,
                                                           k, n, kc, acc, b);
          break;
      }
    }
  }
}

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
    gemv_w16<Arch, WeightFormat::bf16>(y, ldy, w, x, ldx, m, rows, k, accumulate, bias);
  else
    gemv_w16<Arch, WeightFormat::f16>(y, ldy, w, x, ldx, m, rows, k, accumulate, bias);
}

// y (m, n) (+)= x (m, k) . w (n, k)^T (+ bias), x packed by pack_panels (as gemm_xt_kernel),
// w (n, k) row-major 16-bit weights of format fmt; y row stride ldy; bias (n,) or null
template <class Arch>
void gemm_xt_w16_kernel::operator()(Arch, float* y, std::size_t ldy, const float* xt, std::size_t m,
                                    const std::uint16_t* w, WeightFormat fmt, std::size_t n,
                                    std::size_t k, bool accumulate, const float* bias) const {
  if (fmt == WeightFormat::bf16)
    gemm_xt_w16<Arch, WeightFormat::bf16>(y, ldy, xt, m, w, n, k, accumulate, bias);
  else
    gemm_xt_w16<Arch, WeightFormat::f16>(y, ldy, xt, m, w, n, k, accumulate, bias);
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
