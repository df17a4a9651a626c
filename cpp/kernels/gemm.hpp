// Matrix product for the projections of a few dozen tokens (a short prefill, a batch of decode
// steps): y (m, n) (+)= x (m, k) . w (n, k)^T, w row-major as HF stores nn.Linear weights.
//
// A BLAS packs the weight operand into panels on every call; with m = 64 tokens that copy of
// the whole (large) weight matrix costs about a third of the product (perf: OpenBLAS'
// sgemm_incopy 26% of a small block's prefill). Here the small operand is packed instead, once
// per call: x^T in panels of 64 tokens (k, 64), tokens contiguous, zero past the last token. Each
// step of the k loop loads TV vectors of tokens and broadcasts RN weights (one per output
// feature): RN x TV accumulators, no horizontal sums, the weights read in place. Every output
// goes through the same arithmetic (a sequential fma over k) whatever block it falls in, so
// results do not depend on how the features are split across threads.
#pragma once

#include <algorithm>

#include "kernels/gemv.hpp"  // PlainWeights, the weight-storage policy
#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {
namespace {

// Register block: AVX-512 has 32 vector registers (6 x 4 accumulators + 4 token vectors and a
// broadcast), AVX2/SSE2 16 (2 x 4 + 4 + 1). Blocks of fewer token vectors (the token tail)
// take more features so that enough independent FMA chains stay in flight.
template <class Arch>
constexpr int gemm_xt_features(int token_vectors) {
  constexpr bool wide = std::is_base_of<xsimd::avx512f, Arch>::value;
  switch (token_vectors) {
    case 1:
      return wide ? 12 : 6;
    case 2:
      return wide ? 10 : 4;
    case 3:
      return wide ? 8 : 3;
    default:
      return wide ? 6 : 2;
  }
}
constexpr int kGemmXtTokenVectors = 4;
// k is split in chunks of this length: a chunk of packed tokens (64 x 2048 floats, 512 KiB)
// stays in L2 while every feature block of the thread streams past it.
constexpr std::size_t kGemmXtKChunk = 2048;
// Weights stored narrower than T (WL::widens) are walked in sub-chunks of this length: the RN
// weight rows of a sub-chunk are converted once into a T tile on the stack (RN x 256 floats,
// at most 12 KiB: stays in L1) and broadcast from there -- the only widened copy is this tile.
// Splitting k so does not change the order of the fmas.
constexpr std::size_t kGemmXtWideTile = 256;

// y[t, f] (+)= sum_kk xt[kk, t] * w[f * ldw + kk] (+ bias[f]) for f < RN, t < min(valid, TV*N),
// kk < k; bias (RN,) or null, added in the final store (the caller passes it with the last k chunk)
//   y  (.., ldy)   row t, column f
//   xt (k, ldxt)   packed tokens, zero past the last token
//   w  (RN, ldw)   RN weight rows, read through the policy WL (kernels/gemv.hpp)
template <class Arch, class T, class WL, int RN, int TV>
inline void gemm_xt_block(T* y, std::size_t ldy, const T* xt, std::size_t ldxt,
                          const typename WL::Stored* w, std::size_t ldw, std::size_t k,
                          std::size_t valid, bool accumulate, const T* bias) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size;
  V acc[RN][TV];
  for (int f = 0; f < RN; ++f)
    for (int j = 0; j < TV; ++j) acc[f][j] = V(T(0));
  alignas(64) T wide[RN][WL::widens ? kGemmXtWideTile : 1];  // (RN, kc) a sub-chunk widened
  // weights stored as T: one pass over k, broadcasting the weights in place
  const std::size_t step = WL::widens ? kGemmXtWideTile : k;
  for (std::size_t k0 = 0; k0 < k; k0 += step) {
    const std::size_t kc = std::min(k - k0, step);
    const T* wk = &wide[0][0];  // the sub-chunk's weights as T, row stride ldwk
    const std::size_t ldwk = WL::widens ? kGemmXtWideTile : ldw;
    if constexpr (WL::widens) {
      for (int f = 0; f < RN; ++f) {
        const typename WL::Stored* src = w + f * ldw + k0;
        std::size_t kk = 0;
        for (; kk + N <= kc; kk += N) WL::load(Arch{}, src + kk).store_aligned(&wide[f][kk]);
        for (; kk < kc; ++kk) wide[f][kk] = WL::scalar(src[kk]);
      }
    } else {
      wk = w + k0;
    }
    const T* xk = xt + k0 * ldxt;
    for (std::size_t kk = 0; kk < kc; ++kk) {
      V xv[TV];
      for (int j = 0; j < TV; ++j) xv[j] = V::load_unaligned(xk + kk * ldxt + j * N);
      for (int f = 0; f < RN; ++f) {
        const V wv(wk[f * ldwk + kk]);
        for (int j = 0; j < TV; ++j) acc[f][j] = xsimd::fma(wv, xv[j], acc[f][j]);
      }
    }
  }
  // the accumulators hold y transposed (feature-major): through a small tile into y's rows
  alignas(64) T tile[RN][TV * N];
  for (int f = 0; f < RN; ++f)
    for (int j = 0; j < TV; ++j) acc[f][j].store_aligned(&tile[f][j * N]);
  const std::size_t rows = std::min(valid, TV * N);
  for (std::size_t t = 0; t < rows; ++t) {
    T* dst = y + t * ldy;
    for (int f = 0; f < RN; ++f) {
      dst[f] = accumulate ? dst[f] + tile[f][t] : tile[f][t];
      if (bias) dst[f] += bias[f];  // as a separate bias pass would round it
    }
  }
}

// One chunk of TV token vectors x k-chunk against every feature of [0, n).
template <class Arch, class T, class WL, int TV>
inline void gemm_xt_tokens(T* y, std::size_t ldy, const T* xt, std::size_t ldxt, std::size_t valid,
                           const typename WL::Stored* w, std::size_t ldw, std::size_t n,
                           std::size_t k, bool accumulate, const T* bias) {
  constexpr int RN = gemm_xt_features<Arch>(TV);
  std::size_t f = 0;
  for (; f + RN <= n; f += RN)
    gemm_xt_block<Arch, T, WL, RN, TV>(y + f, ldy, xt, ldxt, w + f * ldw, ldw, k, valid, accumulate,
                                       bias ? bias + f : bias);
  for (; f < n; ++f)  // feature tail
    gemm_xt_block<Arch, T, WL, 1, TV>(y + f, ldy, xt, ldxt, w + f * ldw, ldw, k, valid, accumulate,
                                      bias ? bias + f : bias);
}

// gemm_xt_kernel's body for any weight storage WL (gemm_xt_w16_kernel uses it with 16-bit
// weights)
template <class Arch, class T, class WL>
inline void gemm_xt_impl(T* y, std::size_t ldy, const T* xt, std::size_t m,
                         const typename WL::Stored* w, std::size_t n, std::size_t k,
                         bool accumulate, const T* bias) {
  constexpr std::size_t N = vec<Arch, T>::size;
  constexpr std::size_t chunk = kGemmXtTokenVectors * N;  // divides kGemmPanel
  static_assert(kGemmPanel % chunk == 0, "a token chunk must not straddle two panels");
  for (std::size_t t = 0; t < m; t += chunk) {
    const std::size_t vectors = (std::min(m - t, chunk) + N - 1) / N;
    const T* panel = xt + (t / kGemmPanel) * k * kGemmPanel + t % kGemmPanel;
    for (std::size_t k0 = 0; k0 < k; k0 += kGemmXtKChunk) {
      const std::size_t kc = std::min(k - k0, kGemmXtKChunk);
      const bool acc = accumulate || k0 > 0;
      const T* b = k0 + kc == k ? bias : nullptr;  // the bias goes with the last chunk
      T* yt = y + t * ldy;
      const T* x0 = panel + k0 * kGemmPanel;
      const std::size_t valid = m - t;
      switch (vectors) {
        case 1:
          gemm_xt_tokens<Arch, T, WL, 1>(yt, ldy, x0, kGemmPanel, valid, w + k0, k, n, kc, acc, b);
          break;
        case 2:
          gemm_xt_tokens<Arch, T, WL, 2>(yt, ldy, x0, kGemmPanel, valid, w + k0, k, n, kc, acc, b);
          break;
        case 3:
          gemm_xt_tokens<Arch, T, WL, 3>(yt, ldy, x0, kGemmPanel, valid, w + k0, k, n, kc, acc, b);
          break;
        default:
          gemm_xt_tokens<Arch, T, WL, kGemmXtTokenVectors>(yt, ldy, x0, kGemmPanel, valid, w + k0,
                                                           k, n, kc, acc, b);
          break;
      }
    }
  }
}

}  // namespace

// y (m, n) (+)= x (m, k) . w (n, k)^T (+ bias) for a few dozen tokens (prefill projections), x
// given packed by pack_panels: xt[(p * k + kk) * kGemmPanel + i] = x[p * kGemmPanel + i, kk],
// zero past row m. y has row stride ldy; bias (n,) or null, added in the final store.
template <class Arch, class T>
void gemm_xt_kernel::operator()(Arch, T* y, std::size_t ldy, const T* xt, std::size_t m, const T* w,
                                std::size_t n, std::size_t k, bool accumulate,
                                const T* bias) const {
  gemm_xt_impl<Arch, T, PlainWeights<T>>(y, ldy, xt, m, w, n, k, accumulate, bias);
}

}  // namespace llmk
