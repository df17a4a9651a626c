// Helpers shared by the kernel headers. Internal linkage (unnamed namespace): each per-ISA
// translation unit gets its own copy, compiled with its own flags — no ODR sharing across ISAs.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <xsimd/xsimd.hpp>

#include "common/mxcsr.hpp"

namespace llmk {
namespace {

template <class Arch, class T>
using vec = xsimd::batch<T, Arch>;

// Non-temporal (streaming) store of a full batch to an address aligned to the batch size.
// The generic version is a plain aligned store; the overloads below use the ISA's stream
// instruction (each is only compiled in the translation unit whose flags provide it).
template <class Arch, class T>
inline void store_nt(T* p, const vec<Arch, T>& v) {
  v.store_aligned(p);
}
inline void store_nt(float* p, const vec<xsimd::sse2, float>& v) { _mm_stream_ps(p, v); }
inline void store_nt(double* p, const vec<xsimd::sse2, double>& v) { _mm_stream_pd(p, v); }
#if defined(__AVX2__)
inline void store_nt(float* p, const vec<xsimd::fma3<xsimd::avx2>, float>& v) {
  _mm256_stream_ps(p, v);
}
inline void store_nt(double* p, const vec<xsimd::fma3<xsimd::avx2>, double>& v) {
  _mm256_stream_pd(p, v);
}
#endif
#if defined(__AVX512F__)
inline void store_nt(float* p, const vec<xsimd::avx512bw, float>& v) { _mm512_stream_ps(p, v); }
inline void store_nt(double* p, const vec<xsimd::avx512bw, double>& v) { _mm512_stream_pd(p, v); }
#endif

// Stores a full batch: streaming when asked (p is then aligned), else an unaligned store.
template <class Arch, class T>
inline void store_batch(T* p, const vec<Arch, T>& v, bool stream) {
  if (stream) {
    store_nt(p, v);
  } else {
    v.store_unaligned(p);
  }
}

// ExactSubnormals: common/mxcsr.hpp.

// Elements to process before `p` is aligned to the vector size (streamed stores need it).
template <class Arch, class T>
inline std::size_t align_head(const T* p, std::size_t n) {
  constexpr std::size_t vb = vec<Arch, T>::size * sizeof(T);
  std::size_t mis = reinterpret_cast<std::uintptr_t>(p) % vb;
  std::size_t head = mis == 0 ? 0 : (vb - mis) / sizeof(T);
  return head < n ? head : n;
}

// Makes streamed stores globally visible before the kernel returns (other threads read them).
inline void stream_fence(bool stream) {
  if (stream) _mm_sfence();
}

// sums[i] = the sum of the lanes of acc[i], for i < N (N = the batch size): N horizontal sums
// at once. The generic version reduces each batch on its own; the AVX-512 and AVX2 float
// overloads below add the batches pairwise in a transpose tree, N - 1 additions for all N
// sums instead of log2(N) shuffle + add steps for each. (xsimd 8.1's own multi-batch haddp
// returns wrong float sums on AVX-512.)
template <class Arch, class T>
inline void reduce_lanes(const vec<Arch, T>* acc, T* sums) {
  for (std::size_t i = 0; i < vec<Arch, T>::size; ++i) sums[i] = xsimd::hadd(acc[i]);
}
#if defined(__AVX512F__)
inline void reduce_lanes(const vec<xsimd::avx512bw, float>* acc, float* sums) {
  __m512 c[8], e[4], g[2];
  for (int i = 0; i < 8; ++i) {  // lanes 0-7: acc[2i]'s halves added, 8-15: acc[2i + 1]'s
    const __m512 a = acc[2 * i], b = acc[2 * i + 1];
    c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int i = 0; i < 4; ++i)  // 128-bit lane k: 4 partial sums of acc[4i + k]
    e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // lane k: 2 partials of acc[8i + k], 2 of acc[8i + 4 + k]
    g[i] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // element 4k + m = the sum of acc[4m + k]
  const __m512 h = _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(g[0], g[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(sums, _mm512_permutexvar_ps(order, h));
}
#endif
#if defined(__AVX2__)
inline void reduce_lanes(const vec<xsimd::fma3<xsimd::avx2>, float>* acc, float* sums) {
  const __m256 t0 = _mm256_hadd_ps(acc[0], acc[1]), t1 = _mm256_hadd_ps(acc[2], acc[3]);
  const __m256 t2 = _mm256_hadd_ps(acc[4], acc[5]), t3 = _mm256_hadd_ps(acc[6], acc[7]);
  // per 128-bit half: the half-sums of acc[0..3] (u0) and acc[4..7] (u1)
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  _mm256_storeu_ps(sums, _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                                       _mm256_permute2f128_ps(u0, u1, 0x31)));
}
#endif

// Accurate at every row length: a plain SIMD sum of n terms into 4 x N accumulators adds
// n / (4N) terms per lane, and its rounding error grows with n (rows of 2^24 values were 4x over
// the contract's tolerance). Here the SIMD accumulators only ever run over a block of kSumBlock
// elements (kSumBlock / (4N) terms per lane, a few dozen), and the block totals are added in
// double with Neumaier's compensation, so the error no longer grows with the row. Per block
// that is one horizontal sum and a few scalar operations: the loop over the row still runs at
// memory speed.
constexpr std::size_t kSumBlock = 2048;  // a multiple of 4 x 16 (4 AVX-512 float vectors)

// Neumaier-compensated sum of doubles. An Inf or NaN total is returned as is (the compensation
// term would turn Inf into NaN).
struct compensated_sum {
  double s = 0.0, c = 0.0;
  void add(double v) {
    const double t = s + v;
    c += std::fabs(s) >= std::fabs(v) ? (s - t) + v : (v - t) + s;
    s = t;
  }
  double value() const { return std::isfinite(s) ? s + c : s; }
};

// K sums over i < n at once (K = 1 or 2), blocked and compensated as described above:
// vacc(acc, i) adds the N elements at i (a batch) into the K accumulators acc[0..K), tail(t, i)
// the element at i into the K scalars t[0..K) (the scalar tail of fewer than N elements).
// sums[0..K) in double; callers round to T where the T range matters (a float32 sum past
// FLT_MAX is +inf, as a float32 accumulator would give).
template <class Arch, class T, std::size_t K, class VAcc, class STail>
inline void blocked_sums(std::size_t n, VAcc vacc, STail tail, double* sums) {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  static_assert(kSumBlock % (4 * N) == 0, "blocks hold whole groups of 4 batches");
  compensated_sum total[K];
  std::size_t i = 0;
  while (i + N <= n) {
    const std::size_t end = n - i > kSumBlock ? i + kSumBlock : n;
    B a0[K], a1[K], a2[K], a3[K];  // four independent chains hide FMA latency
    for (std::size_t k = 0; k < K; ++k) a0[k] = a1[k] = a2[k] = a3[k] = B(T(0));
    for (; i + 4 * N <= end; i += 4 * N) {
      vacc(a0, i);
      vacc(a1, i + N);
      vacc(a2, i + 2 * N);
      vacc(a3, i + 3 * N);
    }
    for (; i + N <= end; i += N) vacc(a0, i);
    for (std::size_t k = 0; k < K; ++k)
      total[k].add(static_cast<double>(xsimd::hadd((a0[k] + a1[k]) + (a2[k] + a3[k]))));
  }
  T t[K] = {};
  for (; i < n; ++i) tail(t, i);
  for (std::size_t k = 0; k < K; ++k) {
    total[k].add(static_cast<double>(t[k]));
    sums[k] = total[k].value();
  }
}

// The row sums of the norms, one code path (Centered selects the statistic):
//   Centered = false (rms_norm): sum of (x[i] * c)^2, c a scale      -> sums[0]
//   Centered = true (layer_norm): with d = x[i] - c, c a shift, the sums of d and of d^2 in one
//                                 pass                                -> sums[0], sums[1]
template <bool Centered, class Arch, class T>
inline void row_sums(const T* x, std::size_t n, T c, double* sums) {
  using B = vec<Arch, T>;
  constexpr std::size_t K = Centered ? 2 : 1;
  const B vc(c);
  blocked_sums<Arch, T, K>(
      n,
      [&](B* acc, std::size_t i) {
        const B v = Centered ? B::load_unaligned(x + i) - vc : B::load_unaligned(x + i) * vc;
        if (Centered) acc[0] += v;
        acc[K - 1] = xsimd::fma(v, v, acc[K - 1]);
      },
      [&](T* t, std::size_t i) {
        const T v = Centered ? x[i] - c : x[i] * c;
        if (Centered) t[0] += v;
        t[K - 1] += v * v;
      },
      sums);
}

// Sum of (x[i] * scale)^2 over a row, rounded to T.
template <class Arch, class T>
inline T sum_squares(const T* x, std::size_t n, T scale) {
  double s;
  row_sums<false, Arch, T>(x, n, scale, &s);
  return static_cast<T>(s);
}

// Sum of (x[i] - shift) over a row, in double.
template <class Arch, class T>
inline double sum_shifted(const T* x, std::size_t n, T shift) {
  using B = vec<Arch, T>;
  const B sh(shift);
  double s;
  blocked_sums<Arch, T, 1>(
      n, [&](B* acc, std::size_t i) { acc[0] += B::load_unaligned(x + i) - sh; },
      [&](T* t, std::size_t i) { t[0] += x[i] - shift; }, &s);
  return s;
}

// Sums of d = x[i] - shift and of d^2 over a row in one pass, in double: *sum_d, *sum_d2.
template <class Arch, class T>
inline void sum_dev_and_sq(const T* x, std::size_t n, T shift, double* sum_d, double* sum_d2) {
  double s[2];
  row_sums<true, Arch, T>(x, n, shift, s);
  *sum_d = s[0];
  *sum_d2 = s[1];
}

// max |x[i] - shift| over a row (NaN-free rows; callers handle NaN separately).
template <class Arch, class T>
inline T max_abs(const T* x, std::size_t n, T shift = T(0)) {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  const B sh(shift);
  B m(T(0));
  std::size_t i = 0;
  for (; i + N <= n; i += N) m = xsimd::max(m, xsimd::abs(B::load_unaligned(x + i) - sh));
  alignas(64) T lanes[N];
  m.store_aligned(lanes);
  T r = 0;
  for (std::size_t k = 0; k < N; ++k) r = lanes[k] > r ? lanes[k] : r;
  for (; i < n; ++i) r = std::fabs(x[i] - shift) > r ? std::fabs(x[i] - shift) : r;
  return r;
}

// exp(x) over the whole range where the result is finite. xsimd 8.1's exp returns +inf from its
// cephes cut-off (88.376 in float32, 709.436 in float64), a little below ln(max) (88.7228,
// 709.7827); above the cut-off we use exp(x) = exp(x - c) * exp(c) with c = 0.6875, for which
// x - c is exact (rare path: taken only when a lane needs it).
template <class Arch, class T>
inline vec<Arch, T> exp_wide(const vec<Arch, T>& x) {
  using B = vec<Arch, T>;
  const bool f32 = std::is_same<T, float>::value;
  const B cutoff(f32 ? T(88.0) : T(709.0));
  const B overflow(f32 ? T(88.7229) : T(709.783));  // above: +inf either way
  B e = xsimd::exp(x);
  const auto fix = (x > cutoff) && (x < overflow);
  if (xsimd::any(fix)) {
    const B c(T(0.6875)), exp_c(T(1.9887374695822919));  // exp(0.6875)
    e = xsimd::select(fix, xsimd::exp(x - c) * exp_c, e);
  }
  return e;
}

// ln of the smallest normal number: below it exp(x) is subnormal
template <class T>
constexpr T exp_subnormal_below() {
  return std::is_same<T, float>::value ? T(-87.33654) : T(-708.3964185322641);
}

// Below it in magnitude exp(x) rounds to exactly 1 (|x| < 2^-30 in float32, 2^-60 in float64:
// far under half an ulp of 1), and the exp polynomial would square x into the subnormal range
// (|x| < 1e-19 in float32), which costs microcode assists on many x86 cores.
template <class T>
constexpr T exp_one_below() {
  return std::is_same<T, float>::value ? T(9.313225746154785e-10) : T(8.673617379884035e-19);
}

// exp(x) with results that would be subnormal flushed to +0: subnormal arithmetic is slow on
// many x86 cores and these values are far below anything that matters after normalisation.
// No subnormal is formed on the way either (tiny |x| gives exactly 1, a subnormal x included).
// NaN stays NaN (max() would have replaced it by the clamp bound).
template <class Arch, class T>
inline vec<Arch, T> exp_flush(const vec<Arch, T>& x) {
  using B = vec<Arch, T>;
  const B lo(exp_subnormal_below<T>());
  const B arg = xsimd::select(xsimd::abs(x) < B(exp_one_below<T>()), B(T(0)), xsimd::max(x, lo));
  B e = exp_wide<Arch, T>(arg);
  e = xsimd::select(x < lo, B(T(0)), e);
  return xsimd::select(xsimd::isnan(x), x, e);
}

// sigmoid(x) = 1 / (1 + exp(-x)); exp overflow to +inf gives exactly 0 (no NaN); results below
// the normal range flush to 0.
template <class Arch, class T>
inline vec<Arch, T> sigmoid_vec(const vec<Arch, T>& x) {
  using B = vec<Arch, T>;
  const B one(T(1));
  const B lo(exp_subnormal_below<T>());
  B r = one / (one + exp_flush<Arch, T>(-x));  // exp(-x) < 2^-126 changes nothing in 1 + exp(-x)
  return xsimd::select(x < lo, B(T(0)), r);
}

// Applies a batch function f to n elements, the partial last batch through a padded buffer so
// every element goes through the same vector code (results do not depend on where an element
// sits in the array or on how the array is split across threads).
template <class Arch, class T, class F>
inline void map_unary(T* out, const T* x, std::size_t n, F f) {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  std::size_t i = 0;
  for (; i + N <= n; i += N) f(B::load_unaligned(x + i)).store_unaligned(out + i);
  if (i < n) {
    alignas(64) T buf[N] = {};
    for (std::size_t k = 0; k < n - i; ++k) buf[k] = x[i + k];
    f(B::load_aligned(buf)).store_aligned(buf);
    for (std::size_t k = 0; k < n - i; ++k) out[i + k] = buf[k];
  }
}

}  // namespace
}  // namespace llmk
