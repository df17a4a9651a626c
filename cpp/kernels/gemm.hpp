// Matrix products of the projections: y (m, n) (+)= x (m, k) . W^T, W (n, k) row-major as HF
// stores nn.Linear weights (or (k, n), the functional API's layout, for the packed kernel).
//
// gemm_xt_kernel, a few dozen tokens (a short prefill, a batch of decode steps): a BLAS packs the
// weight operand into panels on every call; with m = 64 tokens that copy of the whole (large)
// weight matrix costs about a third of the product (perf: OpenBLAS' sgemm_incopy 26% of a small
// block's prefill). Here the small operand is packed instead, once per call: x^T in panels of 64
// tokens (k, 64), tokens contiguous, zero past the last token. Each step of the k loop loads TV
// vectors of tokens and broadcasts RN weights (one per output feature): RN x TV accumulators, no
// horizontal sums, the weights read in place (or through a weight-load policy, gemv.hpp).
//
// gemm_packed_kernel, hundreds of tokens and more: both operands packed, Goto/BLIS-style (below).
//
// Both compute every output as the same arithmetic -- one fma chain over k, see gemm_xt_block --
// whatever block, kernel or thread it falls in: results do not depend on the thread count, and
// the routing between the two kernels (drivers/gemm_routes.cpp) changes no bit.
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

// s = accumulate ? y[t, f] : 0;  s = fma(xt[kk, t], w[f * ldw + kk], s) for kk = 0 .. k-1 in
// order;  y[t, f] = s (+ bias[f])  for f < RN, t < min(valid, TV*N). bias (RN,) or null, added
// once after the last fma (the caller passes it with the last k chunk). `accumulate` continues a
// sum stored in y (a float32 store and reload is exact), so a k split into chunks gives the
// same bits as one pass: every output of the package's GEMMs (this body, gemm_packed below) is
// one fma chain over k from y's start value, whatever the blocking, the thread split or the
// vector width (AVX2 and AVX-512 agree; SSE2, without FMA, rounds the product first).
//   y  (.., ldy)   row t, column f
//   xt (k, ldxt)   packed tokens, zero past the last token
//   w  (RN, ldw)   RN weight rows, read through the policy WL (kernels/gemv.hpp)
template <class Arch, class T, class WL, int RN, int TV>
inline void gemm_xt_block(T* y, std::size_t ldy, const T* xt, std::size_t ldxt,
                          const typename WL::Stored* w, std::size_t ldw, std::size_t k,
                          std::size_t valid, bool accumulate, const T* bias) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size;
  const std::size_t rows = std::min(valid, TV * N);
  V acc[RN][TV];
  alignas(64) T tile[RN][TV * N];  // y's (rows x RN) corner, transposed (feature-major)
  if (accumulate) {  // continue the sums held in y (see gemm_xt_impl): through the tile
    for (int f = 0; f < RN; ++f)
      for (std::size_t t = 0; t < TV * N; ++t) tile[f][t] = t < rows ? y[t * ldy + f] : T(0);
    for (int f = 0; f < RN; ++f)
      for (int j = 0; j < TV; ++j) acc[f][j] = V::load_aligned(&tile[f][j * N]);
  } else {
    for (int f = 0; f < RN; ++f)
      for (int j = 0; j < TV; ++j) acc[f][j] = V(T(0));
  }
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
  // the accumulators hold y transposed (feature-major): through the tile into y's rows
  for (int f = 0; f < RN; ++f)
    for (int j = 0; j < TV; ++j) acc[f][j].store_aligned(&tile[f][j * N]);
  for (std::size_t t = 0; t < rows; ++t) {
    T* dst = y + t * ldy;
    for (int f = 0; f < RN; ++f) dst[f] = bias ? tile[f][t] + bias[f] : tile[f][t];
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

// --- both operands packed (large m) ------------------------------------------------------------
// The layout of BLIS (Goto's algorithm), with A = x (tokens) and B = W^T: the vector operand is
// the weights (NV vectors of output features), the broadcast operand the tokens (MR of them),
// MR x NV accumulators (AVX2: 6 x 2 = 12 of the 16 registers, + 2 weight vectors and a
// broadcast; AVX-512: 12 x 2 of 32). y rows are then stored as whole vectors (no transpose),
// and a token tail costs no padded lanes. Weights are packed per thread, a block of
// kGemmPackKc x kGemmPackNc (k-major micro-panels of NR = NV * N features, zero past the last
// feature) that every token of the call reuses; its micro-panel (kc x NR, 32 KiB on AVX2) is
// read from L1/L2 while the token micro-panels (kc x MR, 12 KiB) stream past it from a block of
// kGemmPackMc tokens kept in L2. (kc = 512 and 72-token blocks measured best of 256-768 x
// 72-288 on the AVX2 EPYC; OpenBLAS' Zen kernel has the same 6 x 16 register block.) x is
// packed once per call for all threads (gemm_pack_x_kernel): panels of MR tokens, k-major, zero
// past the last token.
template <class Arch>
constexpr bool gemm_wide_isa() {
  return std::is_base_of<xsimd::avx512f, Arch>::value;
}
template <class Arch>
constexpr int gemm_packed_tokens() {  // MR: must divide kGemmPackTokenAlign (ops.hpp)
  return gemm_wide_isa<Arch>() ? 12 : 6;
}
constexpr int kGemmPackedVectors = 2;  // NV
constexpr std::size_t kGemmPackMc = 72;  // tokens per L2 block: a multiple of 6 and 12
static_assert(kGemmPackTokenAlign % 12 == 0 && kGemmPackTokenAlign % 6 == 0, "MR must divide it");
static_assert(kGemmPackMc % 12 == 0, "whole token panels per block");

// y (rows x cols corner at y, row stride ldy): s = load_c ? y : 0; s = fma(x, w, s) over kc;
// y = s (+ bias). xp: kc x MR tokens (zero past `rows`), wp: kc x NR features (zero past `cols`).
// next: the corner of y the following call will read (prefetched while this one runs), or null.
template <class Arch, class T, int MR, int NV>
inline void gemm_packed_micro(T* y, std::size_t ldy, std::size_t rows, std::size_t cols,
                              const T* xp, const T* wp, std::size_t kc, bool load_c,
                              const T* bias, const T* next) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size, NR = NV * N;
  const bool full = cols == NR;
  if (next)
    for (int i = 0; i < MR; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(next + i * ldy), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(next + i * ldy + NR - 1), _MM_HINT_T0);
    }
  V acc[MR][NV];
  alignas(64) T tile[MR][NR];  // partial feature panels go through it
  if (!load_c) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = V(T(0));
  } else if (full) {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j)
        acc[i][j] = static_cast<std::size_t>(i) < rows ? V::load_unaligned(y + i * ldy + j * N)
                                                       : V(T(0));
  } else {
    for (int i = 0; i < MR; ++i)
      for (std::size_t f = 0; f < NR; ++f)
        tile[i][f] = static_cast<std::size_t>(i) < rows && f < cols ? y[i * ldy + f] : T(0);
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j] = V::load_aligned(&tile[i][j * N]);
  }
#pragma GCC unroll 4
  for (std::size_t kk = 0; kk < kc; ++kk) {
    // a few steps ahead (as OpenBLAS' kernels do): the tokens stream from L2, the weights'
    // panel comes from L3 on its first pass
    _mm_prefetch(reinterpret_cast<const char*>(xp + (kk + 16) * MR), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + (kk + 8) * NR), _MM_HINT_T0);
    V wv[NV];
    for (int j = 0; j < NV; ++j) wv[j] = V::load_aligned(wp + kk * NR + j * N);
    for (int i = 0; i < MR; ++i) {
      const V xb(xp[kk * MR + i]);
      for (int j = 0; j < NV; ++j) acc[i][j] = xsimd::fma(xb, wv[j], acc[i][j]);
    }
  }
  if (full) {
    V bv[NV];
    if (bias)
      for (int j = 0; j < NV; ++j) bv[j] = V::load_unaligned(bias + j * N);
    for (int i = 0; i < MR; ++i) {
      if (static_cast<std::size_t>(i) >= rows) break;
      for (int j = 0; j < NV; ++j)
        (bias ? acc[i][j] + bv[j] : acc[i][j]).store_unaligned(y + i * ldy + j * N);
    }
  } else {
    for (int i = 0; i < MR; ++i)
      for (int j = 0; j < NV; ++j) acc[i][j].store_aligned(&tile[i][j * N]);
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t f = 0; f < cols; ++f)
        y[i * ldy + f] = bias ? tile[i][f] + bias[f] : tile[i][f];
  }
}

#if defined(__AVX2__)
// dst[q * ldd + i] = lane q of r[i] for i, q < 8: eight rows held in registers (loaded, or
// converted from narrower weights by kernels/gemm_packed_w.hpp), stored transposed
inline void transpose8x8_store(float* dst, std::size_t ldd, __m256 (&r)[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int h = 0; h < 8; h += 4) {  // rows h..h+3: columns 0,1 / 2,3 of each 128-bit lane
    r[h] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int q = 0; q < 4; ++q) {
    _mm256_storeu_ps(dst + q * ldd, _mm256_permute2f128_ps(r[q], r[q + 4], 0x20));
    _mm256_storeu_ps(dst + (q + 4) * ldd, _mm256_permute2f128_ps(r[q], r[q + 4], 0x31));
  }
}

// dst[q * ldd + r] = src[r * lds + q] for r, q < 8: an 8 x 8 float transpose in registers
inline void transpose8x8(float* dst, std::size_t ldd, const float* src, std::size_t lds) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  transpose8x8_store(dst, ldd, r);
}
#endif

// The weights of features [0, nb) x [pc, pc + kc) into k-major micro-panels of NR features:
// wp[(jr * kc + kk) * NR + f] = W[feature jr * NR + f, pc + kk], zero past nb. W (n, k) row-major
// with row stride ldw (out_in), or (k, n) with row stride ldw (in_out).
template <class Arch, class T, std::size_t NR>
inline void gemm_pack_w(T* wp, const T* w, std::size_t ldw, bool in_out, std::size_t nb,
                        std::size_t pc, std::size_t kc) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size;
  for (std::size_t f0 = 0; f0 < nb; f0 += NR) {
    T* dst = wp + f0 * kc;  // (f0 / NR) * kc * NR
    const std::size_t cols = std::min(NR, nb - f0);
    if (in_out) {  // rows of W are k: each panel row is a contiguous run of features
      for (std::size_t kk = 0; kk < kc; ++kk) {
        const T* src = w + (pc + kk) * ldw + f0;
        if (cols == NR) {
          for (std::size_t j = 0; j < NR; j += N)
            V::load_unaligned(src + j).store_aligned(dst + kk * NR + j);
        } else {
          for (std::size_t f = 0; f < NR; ++f) dst[kk * NR + f] = f < cols ? src[f] : T(0);
        }
      }
      continue;
    }
    const T* src = w + f0 * ldw + pc;  // (NR rows, kc): transposed into the panel
    std::size_t kk = 0;
#if defined(__AVX2__)
    if constexpr (std::is_same<T, float>::value && NR % 8 == 0) {
      if (cols == NR)
        for (; kk + 8 <= kc; kk += 8)
          for (std::size_t r = 0; r < NR; r += 8)
            transpose8x8(dst + kk * NR + r, NR, src + r * ldw + kk, ldw);
    }
#endif
    for (std::size_t f = 0; f < NR; ++f)
      for (std::size_t q = kk; q < kc; ++q) dst[q * NR + f] = f < cols ? src[f * ldw + q] : T(0);
  }
}

// The weight pack of gemm_packed_impl is a policy (as ggml makes a fusion a template flag, not a
// copied kernel): Pack::run<Arch, NR>(wp, j0, nb, pc, kc) writes the micro-panels of features
// [j0, j0 + nb) x [pc, pc + kc) exactly as gemm_pack_w does, from whatever the weights are
// stored as. PackPlain reads T weights; kernels/gemm_packed_w.hpp's packs convert 16-bit and
// quantized weights into the same float panels -- the micro-kernel never knows, so a product
// equals the float32 kernel's on the widened / dequantized matrix bit for bit.
template <class T>
struct PackPlain {
  const T* w;         // (n, k) row stride ldw, or (k, n) row stride ldw when in_out
  std::size_t ldw;
  bool in_out;
  template <class Arch, std::size_t NR>
  void run(T* wp, std::size_t j0, std::size_t nb, std::size_t pc, std::size_t kc) const {
    gemm_pack_w<Arch, T, NR>(wp, in_out ? w + j0 : w + j0 * ldw, ldw, in_out, nb, pc, kc);
  }
};

// y[:, 0:n] (+)= x . W^T (+ bias) for one thread's features, x packed by gemm_pack_x_kernel,
// W's blocks packed by the policy `pack` (above) into wpack (kGemmPackKc x gemm_pack_nc(m, k)).
template <class Arch, class T, class Pack>
inline void gemm_packed_impl(T* y, std::size_t ldy, const T* xp, std::size_t m, std::size_t k,
                             const Pack& pack, std::size_t n, T* wpack, bool accumulate,
                             const T* bias) {
  constexpr int MR = gemm_packed_tokens<Arch>();
  constexpr int NV = kGemmPackedVectors;
  constexpr std::size_t NR = NV * vec<Arch, T>::size;
  static_assert(kGemmPackNc % NR == 0 && kGemmPackNcSmallX % NR == 0, "whole micro-panels");
  const std::size_t nc = gemm_pack_nc(m, k);  // features per packed block
  for (std::size_t jc = 0; jc < n; jc += nc) {
    const std::size_t nb = std::min(nc, n - jc);
    for (std::size_t pc = 0; pc < k; pc += kGemmPackKc) {
      const std::size_t kc = std::min(kGemmPackKc, k - pc);
      pack.template run<Arch, NR>(wpack, jc, nb, pc, kc);
      const bool load_c = accumulate || pc > 0;  // the chain goes on from y
      const T* b = pc + kc == k && bias ? bias + jc : nullptr;  // once, after the last fma
      for (std::size_t ic = 0; ic < m; ic += kGemmPackMc) {
        const std::size_t ie = std::min(m, ic + kGemmPackMc);
        for (std::size_t jr = 0; jr < nb; jr += NR) {
          const std::size_t cols = std::min(NR, nb - jr);
          const T* wpr = wpack + jr * kc;
          for (std::size_t t = ic; t < ie; t += MR) {
            T* yt = y + t * ldy + jc + jr;
            const T* next = !load_c ? nullptr : t + MR < ie ? yt + MR * ldy
                                              : jr + NR < nb ? y + ic * ldy + jc + jr + NR
                                                             : nullptr;
            gemm_packed_micro<Arch, T, MR, NV>(yt, ldy, std::min<std::size_t>(MR, m - t), cols,
                                               xp + t * k + pc * MR, wpr, kc, load_c,
                                               b ? b + jr : nullptr, next);
          }
        }
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

// x (m, k) rows [t0, t1) -> panels of MR tokens (MR of this ISA, dividing kGemmPackTokenAlign):
// xp[(t / MR) * k * MR + kk * MR + t % MR] = x[t * ldx + kk], zero for tokens m .. the panel's
// end. t0 is a multiple of kGemmPackTokenAlign; t1 too, or m.
template <class Arch, class T>
void gemm_pack_x_kernel::operator()(Arch, T* xp, const T* x, std::size_t ldx, std::size_t m,
                                    std::size_t k, std::size_t t0, std::size_t t1) const {
  constexpr std::size_t MR = gemm_packed_tokens<Arch>();
  for (std::size_t t = t0; t < t1; t += MR) {
    T* dst = xp + t * k;  // (t / MR) * k * MR
    const std::size_t rows = std::min(MR, m - t);
#if defined(__AVX2__)
    if constexpr (std::is_same<T, float>::value && MR == 6) {
      if (rows == MR) {
        // 8 k of the 6 rows at a time: one 8 x 8 transpose in registers (rows 6 and 7 zero)
        // into a tile, then 6 floats per k (one element per store was ~1 cycle per element,
        // 1.5% of a dim-512 model's prefill)
        alignas(32) float tile[8][8];
        std::size_t kk = 0;
        for (; kk + 8 <= k; kk += 8) {
          __m256 r[8];
          for (std::size_t i = 0; i < MR; ++i) r[i] = _mm256_loadu_ps(x + (t + i) * ldx + kk);
          r[6] = r[7] = _mm256_setzero_ps();
          transpose8x8_store(&tile[0][0], 8, r);
          for (std::size_t q = 0; q < 8; ++q) {
            float* d = dst + (kk + q) * MR;
            _mm_storeu_ps(d, _mm_load_ps(&tile[q][0]));
            _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), _mm_load_ps(&tile[q][4]));
          }
        }
        for (; kk < k; ++kk)
          for (std::size_t i = 0; i < MR; ++i) dst[kk * MR + i] = x[(t + i) * ldx + kk];
        continue;
      }
    }
#endif
    for (std::size_t kb = 0; kb < k; kb += 64) {  // 64 columns of MR rows: cache lines reused
      const std::size_t ke = std::min(k, kb + 64);
      for (std::size_t i = 0; i < MR; ++i) {
        const T* src = x + (t + i) * ldx;
        for (std::size_t kk = kb; kk < ke; ++kk) dst[kk * MR + i] = i < rows ? src[kk] : T(0);
      }
    }
  }
}

// y (m, n) (+)= x (m, k) . W^T (+ bias): x packed by gemm_pack_x_kernel (xp), W (n, k) with row
// stride ldw, or (k, n) with row stride ldw when in_out; y row stride ldy; bias (n,) or null;
// wpack: kGemmPackKc * gemm_pack_nc(m, k) elements of this thread's scratch. Each output is one
// fma chain over k (see gemm_xt_block), so the thread split of n does not change any bit.
template <class Arch, class T>
void gemm_packed_kernel::operator()(Arch, T* y, std::size_t ldy, const T* xp, std::size_t m,
                                    std::size_t k, const T* w, std::size_t ldw, bool in_out,
                                    std::size_t n, T* wpack, bool accumulate,
                                    const T* bias) const {
  gemm_packed_impl<Arch, T>(y, ldy, xp, m, k, PackPlain<T>{w, ldw, in_out}, n, wpack, accumulate,
                            bias);
}

}  // namespace llmk
