// Fused, streaming (online-softmax, flash-style) scaled dot-product attention for one work item:
// a tile of up to kAttnRowTile query rows that share one KV head, against a range of keys.
//
// Layout of the tile (GQA-aware): the rows of a KV head's group are (query head h in the group,
// query index i), h-major. All of them read the same K/V, so K/V are read once per tile and are
// never tiled per query head in memory.
//
// Per key tile of kAttnKeyTile keys:
//   S^T (keys x rows) = K_tile . (scale * Q_tile)^T       micro-GEMM, vectors over query rows
//     (scale folded into Q when every scale * q is a normal number; else S^T = (K . Q^T) * scale)
//   causal / mask -> -inf or additive                      vectorized causal (integer limits
//                                                          made tile-relative), scalar mask
//   m_new = max(m, max_j S^T[j, :]); alpha = exp(m - m_new)  vectorized over query rows
//   P = exp(S^T - m_new); l = l * alpha + sum_j P
//   O = O * alpha + P^T . V_tile                           micro-GEMM, vectors over Dv
// Memory per thread: Q^T (D x 64), S^T (64 x 64), O (64 x Dv) -- never Tq x Tk.
//
// K/V stored in 16 bits (a bf16 / f16 KV cache, attn_params::kv_format) are widened to float32
// as the tiles are loaded, through the load policies of the projections (PlainWeights,
// Widen16 of kernels/gemv.hpp and weight16.hpp): in registers on decode-like tiles (the K dot
// products, and V's rows as P . V's B operand), and into the tile buffers (a K tile, the V
// copy) on larger tiles, which re-read each K/V element once per row block. Either way the
// float arithmetic is the float32 kernel's, so the result is the float32 kernel's on the
// widened K/V bit for bit; a 16-bit cache moves half the bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"
#include "kernels/weight16.hpp"

namespace llmk {
namespace {

// C[r, c*N + lane] (+)= sum_k A[r * a_rs + k * a_ks] * B[k * ldb + c*N + lane]
// for r < R, c < C: R x C accumulators stay in registers for the whole k loop. B is read
// through the load policy BL (stored as T, or 16-bit words widened in registers).
template <class Arch, class T, int R, int C, class BL = PlainWeights<T>>
inline void micro_gemm(const T* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks,
                       const typename BL::Stored* b, std::ptrdiff_t ldb, T* c, std::ptrdiff_t ldc,
                       std::size_t k_len, bool accumulate) {
  using V = vec<Arch, T>;
  constexpr std::size_t N = V::size;
  V acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j)
      acc[r][j] = accumulate ? V::load_unaligned(c + r * ldc + j * N) : V(T(0));
  for (std::size_t k = 0; k < k_len; ++k) {
    V bv[C];
    for (int j = 0; j < C; ++j) bv[j] = BL::load(Arch{}, b + k * ldb + j * N);
    for (int r = 0; r < R; ++r) {
      V av(a[r * a_rs + static_cast<std::ptrdiff_t>(k) * a_ks]);
      for (int j = 0; j < C; ++j) acc[r][j] = xsimd::fma(av, bv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j].store_unaligned(c + r * ldc + j * N);
}

// Register blocking: R rows x C vectors of accumulators, plus C vectors of B and one broadcast
// of A live in registers. AVX-512 has 32 vector registers (6 x 4 + 4 + 1 = 29); AVX2 and SSE2
// have 16: 6 x 2 + 2 + 1 = 15, twelve independent FMA chains (enough to cover the FMA latency
// on two pipes) for 8 loads per 12 FMAs. (3 x 4 needed a 1-row tail on 64-row tiles, whose
// 4 chains ran latency-bound, and a 4-vector B slice twice the size in L1.)
template <class Arch>
constexpr int gemm_rows() {
  return 6;
}
template <class Arch>
constexpr int gemm_cols() {
  return std::is_base_of<xsimd::avx512f, Arch>::value ? 4 : 2;
}

// Every key / row extent of a block is the full one (no causal trimming).
struct full_extent {
  std::size_t operator()(std::size_t, std::size_t, std::size_t n) const { return n; }
};

// The rows [r, m) of one column block (C vectors at column vector j): blocks of R rows, then
// 4, 2 and 1-row tails; k_of(r, rows, k_len) trims the k range of a row block (causal P . V:
// probabilities past a row's causal limit are exactly 0 and are skipped).
template <class Arch, class T, int R, int C, class BL, class KOf>
inline void gemm_col_block(const T* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks,
                           const typename BL::Stored* b, std::ptrdiff_t ldb, T* c,
                           std::ptrdiff_t ldc, std::size_t m, std::size_t k_len, bool accumulate,
                           KOf k_of) {
  std::size_t r = 0;
  auto run = [&](auto rows_tag) {
    constexpr int RR = decltype(rows_tag)::value;
    const std::size_t kl = k_of(r, static_cast<std::size_t>(RR), k_len);
    if (kl > 0 || !accumulate)
      micro_gemm<Arch, T, RR, C, BL>(a + r * a_rs, a_rs, a_ks, b, ldb, c + r * ldc, ldc, kl,
                                     accumulate);
    r += RR;
  };
  while (r + R <= m) run(std::integral_constant<int, R>{});
  if (r + 4 <= m) run(std::integral_constant<int, 4>{});
  if (r + 2 <= m) run(std::integral_constant<int, 2>{});
  if (r < m) run(std::integral_constant<int, 1>{});
}

// C (m x n_vec*N) (+)= A (m x k, strides a_rs/a_ks) . B (k x n_vec*N, row stride ldb).
// Column blocks outside, row blocks inside: the B slice of a column block (k x C vectors: 8 KiB
// of Q^T or 4 KiB of V at D = 128 in AVX2 float32) stays in L1 while the rows of A stream past
// it, where rows outside had re-read all of B (32 KiB, the whole L1) per 3 rows. Each element
// still sums over k in order, whatever the blocking. m_of(j, cols, m) trims the rows computed
// for the column vectors [j, j + cols) (causal Q . K^T: keys past every row's limit; their
// entries are left as they are and masked by the caller), k_of as in gemm_col_block. B is read
// through the load policy BL (see micro_gemm).
template <class Arch, class T, class BL = PlainWeights<T>, class MOf = full_extent,
          class KOf = full_extent>
inline void small_gemm(const T* a, std::ptrdiff_t a_rs, std::ptrdiff_t a_ks,
                       const typename BL::Stored* b, std::ptrdiff_t ldb, T* c, std::ptrdiff_t ldc,
                       std::size_t m, std::size_t n_vec, std::size_t k_len, bool accumulate,
                       MOf m_of = {}, KOf k_of = {}) {
  constexpr std::size_t N = vec<Arch, T>::size;
  constexpr int R = gemm_rows<Arch>(), C = gemm_cols<Arch>();
  if (m < static_cast<std::size_t>(R)) {  // a decode tile (a GQA group's few rows): one row
    // block, so nothing is re-read; wide column blocks instead, 3 x 4 (4 x 4 on AVX-512) and
    // 1 x 4 accumulators, for enough independent FMA chains
    constexpr int RS = C > 2 ? 4 : 3;
    std::size_t r = 0;
    for (; r < m; r += (m - r >= RS ? RS : 1)) {
      const std::size_t rows = m - r >= RS ? RS : 1;
      const std::size_t kl = k_of(r, rows, k_len);
      if (kl == 0 && accumulate) continue;
      // the rows' block of cols vectors from column vector j
      auto block = [&](std::size_t j, auto cols) {
        constexpr int CB = decltype(cols)::value;
        if (rows == RS)
          micro_gemm<Arch, T, RS, CB, BL>(a + r * a_rs, a_rs, a_ks, b + j * N, ldb,
                                          c + r * ldc + j * N, ldc, kl, accumulate);
        else
          micro_gemm<Arch, T, 1, CB, BL>(a + r * a_rs, a_rs, a_ks, b + j * N, ldb,
                                         c + r * ldc + j * N, ldc, kl, accumulate);
      };
      std::size_t j = 0;
      for (; j + 4 <= n_vec; j += 4) block(j, std::integral_constant<int, 4>{});
      for (; j < n_vec; ++j) block(j, std::integral_constant<int, 1>{});
    }
    return;
  }
  std::size_t j = 0;
  for (; j + C <= n_vec; j += C)
    gemm_col_block<Arch, T, R, C, BL>(a, a_rs, a_ks, b + j * N, ldb, c + j * N, ldc,
                                      m_of(j, static_cast<std::size_t>(C), m), k_len, accumulate,
                                      k_of);
  if constexpr (C > 2) {
    for (; j + 2 <= n_vec; j += 2)
      gemm_col_block<Arch, T, R, 2, BL>(a, a_rs, a_ks, b + j * N, ldb, c + j * N, ldc,
                                        m_of(j, 2, m), k_len, accumulate, k_of);
  }
  for (; j < n_vec; ++j)  // R x 1 accumulator chains: only an odd vector count's last
    gemm_col_block<Arch, T, R, 1, BL>(a, a_rs, a_ks, b + j * N, ldb, c + j * N, ldc,
                                      m_of(j, 1, m), k_len, accumulate, k_of);
}

// exp(x) for x <= 0 or NaN (a score minus its row's running max) in 13 instructions, where
// exp_flush takes twice as many (no overflow here, so no range checks and no blends). float:
//   k = round(x log2 e), by adding 1.5 * 2^23 + 127: the sum's low mantissa bits are then
//       k + 127, the biased exponent of 2^k, which one integer shift puts in place;
//   r = x - k ln 2 in [-0.347, 0.347], ln 2 in two parts (k * the first is exact), as cephes;
//   exp(r) by cephes' expf polynomial in Horner form (degree 6), times 2^k.
// Max relative error over [-87.3, 0] against float64: 1.2e-7 (1.4e-7 without FMA, SSE2;
// xsimd's exp: 1.3e-7). x is clamped at -88, where k = -127: 2^k's bits are then 0, so
// x <= -87.68 (-inf included) gives exactly +0, as a masked key must; (-87.68, -87.34) gives
// subnormals (scores 87 below the row's max, which nothing downstream can notice). A NaN x
// stays NaN (max() keeps it). double keeps exp_flush.
template <class Arch, class T>
inline vec<Arch, T> exp_nonpos(const vec<Arch, T>& x) {
  if constexpr (!std::is_same<T, float>::value) {
    return exp_flush<Arch, T>(x);
  } else {
    using V = vec<Arch, float>;
    using I = xsimd::batch<std::int32_t, Arch>;
    const V magic(12582912.0f + 127.0f);  // 1.5 * 2^23 + 127
    // max(c, x) is maxps(c, x): a NaN x comes out as itself and stays NaN to the end
    const V xc = xsimd::max(V(-88.0f), x);
    const V t = xsimd::fma(xc, V(1.44269504088896341f), magic);
    const V k = t - magic;
    V r = xsimd::fnma(k, V(0.693359375f), xc);  // ln 2 = 0.693359375 - 2.12194440e-4
    r = xsimd::fnma(k, V(-2.12194440e-4f), r);
    V y = xsimd::fma(V(1.3997796e-03f), r, V(8.3955629e-03f));
    y = xsimd::fma(y, r, V(4.1665401e-02f));
    y = xsimd::fma(y, r, V(1.6666277e-01f));
    y = xsimd::fma(y, r, V(0.5f));
    y = xsimd::fma(y, r, V(1.0f));
    y = xsimd::fma(y, r, V(1.0f));
    const V two_k = xsimd::bitwise_cast<V>(xsimd::bitwise_cast<I>(t) << 23);
    return y * two_k;
  }
}

// Prefetches the cache lines of `bytes` bytes at `offset` bytes past `base`. A hint: the
// address may lie past the end of the array (it does not fault), so it is computed as an
// integer, not with pointer arithmetic beyond the array.
inline void prefetch_row(const void* base, std::size_t offset, std::size_t bytes) {
  const std::uintptr_t p = reinterpret_cast<std::uintptr_t>(base) + offset;
  for (std::size_t b = 0; b < bytes; b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + b), _MM_HINT_T0);
}

// Decode scores S^T[j][r] = q_r . k_j for a tile of a few rows (rowwise layout: q (rows, D),
// D a multiple of N): blocks of RB rows x KB keys (RB * KB = N dot products) accumulate along D
// in registers, each K vector loaded once for all RB rows, then N horizontal sums in one
// reduce_lanes. Rows past nrows (up to a multiple of RB) hold zeros in q; the caller sets their
// scores to -inf like every padded column. S^T has row stride attn_tile_stride<T>(). K (and V,
// only prefetched here) are stored as KL::Stored and loaded through the policy KL (widened in
// registers when 16-bit).
template <class Arch, class T, std::size_t RB, class KL = PlainWeights<T>>
inline void rowwise_scores(const T* q, std::size_t nrows, std::size_t D,
                           const typename KL::Stored* kt, std::size_t kr,
                           const typename KL::Stored* vt, std::size_t vr, std::size_t dv,
                           std::size_t nk, T* st) {
  using V = vec<Arch, T>;
  using S = typename KL::Stored;
  constexpr std::size_t N = V::size, KB = N / RB, LS = attn_tile_stride<T>(), BK = kAttnKeyTile;
  std::size_t j = 0;
  for (; j + KB <= nk; j += KB) {
    // Decode streams K and V from memory with little work per byte: ask for the V rows of the
    // next tile and the K rows two tiles ahead now, so the loads overlap the math.
    for (std::size_t kk = 0; kk < KB; ++kk) {
      prefetch_row(kt, (j + kk + 2 * BK) * kr * sizeof(S), D * sizeof(S));
      prefetch_row(vt, (j + kk + BK) * vr * sizeof(S), dv * sizeof(S));
    }
    for (std::size_t r0 = 0; r0 < nrows; r0 += RB) {
      V acc[N];
      for (std::size_t a = 0; a < N; ++a) acc[a] = V(T(0));
      for (std::size_t d = 0; d < D; d += N) {
        V kv[KB];
        for (std::size_t kk = 0; kk < KB; ++kk) kv[kk] = KL::load(Arch{}, kt + (j + kk) * kr + d);
        for (std::size_t rr = 0; rr < RB; ++rr) {
          const V qv = V::load_unaligned(q + (r0 + rr) * D + d);
          for (std::size_t kk = 0; kk < KB; ++kk)
            acc[rr * KB + kk] = xsimd::fma(kv[kk], qv, acc[rr * KB + kk]);
        }
      }
      alignas(64) T sums[N];
      reduce_lanes(acc, sums);
      for (std::size_t rr = 0; rr < RB; ++rr)
        for (std::size_t kk = 0; kk < KB; ++kk) st[(j + kk) * LS + r0 + rr] = sums[rr * KB + kk];
    }
  }
  for (; j < nk; ++j) {  // key tail: one dot product per row
    for (std::size_t r = 0; r < nrows; ++r) {
      V acc(T(0));
      for (std::size_t d = 0; d < D; d += N)
        acc = xsimd::fma(KL::load(Arch{}, kt + j * kr + d), V::load_unaligned(q + r * D + d), acc);
      st[j * LS + r] = xsimd::hadd(acc);
    }
  }
}

template <class T>
struct attn_tile_state {
  // (row stride LS = BQ + 64 bytes: see attn_tile_stride)
  T* qt;    // (D, BQ)      scale * Q^T of the tile, zero-padded columns, row stride LS
  T* st;    // (BK, BQ)     scores / probabilities of the current key tile, transposed, stride LS
  T* o;     // (BQ, dv_pad) running output, row stride ldo = dv_pad + 64 bytes
  T* vpad;  // (BK, dv_pad) V tile copy (see v_tile), row stride ldo
  T* kw;    // (BK, D)      K tile widened from 16 bits (see k_tile), when K/V are 16-bit
  T* lim;   // (BQ,)        causal limit per row relative to the key tile's start, in [-1, BK]
  T* lo;    // (BQ,)        window start per row relative to the key tile's start, in [0, BK+1]
  T* m;     // (BQ,)        running max
  T* l;     // (BQ,)        running sum
};

// n values of a K or V row, stored as KL::Stored, widened to T (the policy's vector loads,
// then its scalar conversion for the tail)
template <class Arch, class T, class KL>
inline void widen_row(T* dst, const typename KL::Stored* src, std::size_t n) {
  constexpr std::size_t N = vec<Arch, T>::size;
  std::size_t d = 0;
  for (; d + N <= n; d += N) KL::load(Arch{}, src + d).store_unaligned(dst + d);
  for (; d < n; ++d) dst[d] = KL::scalar(src[d]);
}

// The tile kernel's body; KV is the load policy of K and V (PlainWeights<T>: stored as T, at
// kb / vb; Widen16<F>: 16-bit words of format F, T = float), kb / vb their base pointers.
template <class Arch, class T, class KV>
void attention_tile(const attn_params<T>& p, const attn_item& it, T* workspace, T* part_m,
                    T* part_l, T* part_o, std::uint8_t* flags, const typename KV::Stored* kb,
                    const typename KV::Stored* vb) {
  using V = vec<Arch, T>;
  using KS = typename KV::Stored;
  constexpr std::size_t N = V::size;
  constexpr std::size_t BQ = kAttnRowTile, BK = kAttnKeyTile, LS = attn_tile_stride<T>();
  const std::size_t D = p.d, Dv = p.dv, dv_pad = attn_dv_pad_t<T>(Dv);
  // O and the V copy rows: 64 bytes past a multiple of 512 so that a column slice of their
  // rows spreads over L1's sets (see attn_tile_stride)
  const std::size_t ldo = dv_pad + 64 / sizeof(T);
  const std::size_t group = p.hq / p.hkv;
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const T scale = static_cast<T>(p.scale);  // the driver runs the exact path if it is not normal
  ExactSubnormals exact;  // subnormal q, k, v count (no DAZ), whatever the caller's MXCSR

  attn_tile_state<T> s;
  s.qt = workspace;
  s.st = s.qt + D * LS;
  s.o = s.st + BK * LS;
  s.vpad = s.o + BQ * ldo;
  s.lim = s.vpad + BK * ldo;
  s.lo = s.lim + BQ;
  s.m = s.lo + BQ;
  s.l = s.m + BQ;
  s.kw = s.l + BQ;  // (attn_workspace_size counts it only for 16-bit K/V)

  const std::size_t nrows = it.nrows;
  // columns of S^T actually computed: the valid rows rounded up to whole vectors (a decode tile
  // of a 4-head GQA group computes 1 vector, not 64 / N)
  const std::size_t ncols = (nrows + N - 1) / N * N;
  // Decode-like tiles (a few rows): scores as dot products along D, N keys at a time reduced
  // in registers, instead of a micro-GEMM whose vectors would run over mostly empty rows.
  const bool rowwise = nrows <= 8 && D % N == 0;
  // rows of the tile: r -> (query head h, query index i)
  // (tabulated once: two integer divisions per lookup were a tenth of a short prompt's call)
  std::size_t head_of[BQ], query_of[BQ];
  for (std::size_t r = 0, h = it.g * group + it.row0 / p.tq, i = it.row0 % p.tq; r < nrows; ++r) {
    head_of[r] = h;
    query_of[r] = i;
    if (++i == p.tq) i = 0, ++h;
  }
  auto row_head = [&](std::size_t r) { return head_of[r]; };
  auto row_query = [&](std::size_t r) { return query_of[r]; };

  // --- pack scale * Q^T (D x BQ), padded rows with zeros; causal limits --------------------
  // padded columns (rows of the rowwise layout) must be zero; only those the micro-GEMM reads
  // (columns [nrows, ncols)): zeroing the whole (D, BQ) tile cost more than the scores of a
  // short prompt's 16-row tile
  if (!rowwise) {
    if (ncols > nrows)
      for (std::size_t d = 0; d < D; ++d)
        std::fill(s.qt + d * LS + nrows, s.qt + d * LS + ncols, T(0));
  } else {
    std::memset(s.qt, 0, (nrows + N) * D * sizeof(T));
  }
  // Folding scale into q saves a multiply per score, but scale * q can overflow (scale = 1e20,
  // q = 1e20 in float32) or lose bits in the subnormal range while (q . k) * scale, the
  // reference's order, is fine: fold only when every nonzero finite q gives a normal product.
  bool fold = true;
  const T t_min = std::numeric_limits<T>::min(), t_max = std::numeric_limits<T>::max();
  // Vectorised (a short prompt's tile spent as long packing q one scalar at a time, with
  // these checks, as multiplying it): the products and the check a vector at a time, the
  // transposed stores one element at a time.
  auto pack = [&](const T* qrow, std::size_t r, T mul) {
    const V vmul(mul), vmin(t_min), vmax(t_max), zero(T(0));
    auto bad = xsimd::batch_bool<T, Arch>(false);
    alignas(64) T buf[N];
    std::size_t d0 = 0;
    for (; d0 + N <= D; d0 += N) {
      const V qv = V::load_unaligned(qrow + d0), v = qv * vmul, av = xsimd::abs(v);
      // finite nonzero q (v cannot be NaN then) whose product is not a normal number
      bad = bad | (xsimd::isfinite(qv) & (qv != zero) & ((av < vmin) | (av > vmax)));
      if (rowwise) {
        v.store_unaligned(s.qt + r * D + d0);
      } else {
        v.store_aligned(buf);
        for (std::size_t e = 0; e < N; ++e) s.qt[(d0 + e) * LS + r] = buf[e];
      }
    }
    if (xsimd::any(bad)) fold = false;
    for (std::size_t d = d0; d < D; ++d) {
      const T v = qrow[d] * mul;
      const bool normal = std::fabs(v) >= t_min && std::fabs(v) <= t_max;
      if (std::isfinite(qrow[d]) && qrow[d] != T(0) && !normal) fold = false;
      (rowwise ? s.qt[r * D + d] : s.qt[d * LS + r]) = v;  // row-major (nrows, D) / (D, BQ)
    }
  };
  auto q_row = [&](std::size_t r) {
    return p.q + it.b * p.qs[0] + row_head(r) * p.qs[1] + row_query(r) * p.qs[2];
  };
  // Causal limits are integers (the last key index a row may see): as float32 they would round
  // past 2^24 keys. They are made tile-relative (small, exact in T) per key tile below.
  // A sliding window gives each row a first visible key too (lo_abs; 0 without a window).
  std::int64_t lim_abs[BQ], lo_abs[BQ];
  std::int64_t max_lim = -1, min_lo = std::numeric_limits<std::int64_t>::max();
  // the last key every row sees and the first key every row sees: a key tile inside both is
  // fully visible and needs no mask
  std::int64_t min_lim = std::numeric_limits<std::int64_t>::max(), max_lo = 0;
  const std::int64_t offset = static_cast<std::int64_t>(p.tk) - static_cast<std::int64_t>(p.tq);
  // (only the ncols columns the tile computes: the other rows of the state are never read)
  for (std::size_t r = 0; r < ncols; ++r) {
    if (r < nrows) {
      pack(q_row(r), r, scale);
      const std::int64_t pos = static_cast<std::int64_t>(row_query(r)) + offset;
      std::int64_t lim = p.causal ? pos : static_cast<std::int64_t>(p.tk) - 1;
      // (pos - window + 1 cannot overflow: pos < 2^62 and 1 <= window < 2^62, see the entry)
      const std::int64_t lo = p.window > 0 ? std::max<std::int64_t>(pos - p.window + 1, 0) : 0;
      max_lim = std::max(max_lim, lim);
      min_lo = std::min(min_lo, lo);
      min_lim = std::min(min_lim, lim);
      max_lo = std::max(max_lo, lo);
      lim_abs[r] = lim;
      lo_abs[r] = lo;
    } else {
      lim_abs[r] = -1;  // padding rows see nothing
      lo_abs[r] = 0;
    }
    s.m[r] = neg_inf;
    s.l[r] = T(0);
  }
  if (!fold) {  // rare: scores are scaled after the product instead (see scores())
    for (std::size_t r = 0; r < nrows; ++r) pack(q_row(r), r, T(1));
  }
  std::memset(s.o, 0, ncols * ldo * sizeof(T));
  // Causal trimming of the micro-GEMMs on a diagonal key tile [k0, k0 + nk): the keys past
  // the causal limit of every row of a block of rows are not multiplied (Q . K^T: their
  // scores are masked to -inf below; P . V: their probabilities are exactly 0). Halves the
  // work of the diagonal tiles (all of a short prompt's).
  auto last_key = [&](std::size_t r0, std::size_t rows, std::size_t k0, std::size_t n) {
    std::int64_t hi = -1;
    for (std::size_t r = r0; r < std::min(r0 + rows, BQ); ++r) hi = std::max(hi, lim_abs[r]);
    const std::int64_t e = hi - static_cast<std::int64_t>(k0) + 1;
    return e <= 0 ? std::size_t{0} : std::min(n, static_cast<std::size_t>(e));
  };

  const KS* kbase = kb + it.b * p.ks[0] + it.g * p.ks[1];  // (Tk, D), row stride ks[2]
  const KS* vbase = vb + it.b * p.vs[0] + it.g * p.vs[1];  // (Tk, Dv), row stride vs[2]
  const std::size_t kr = p.ks[2], vr = p.vs[2];
  // keys this item covers; causal: no row sees beyond max_lim; window: none before min_lo (so
  // a windowed call costs O(T * window), not O(T^2))
  const std::size_t k_end = std::min<std::size_t>(
      it.k1, static_cast<std::size_t>(std::max<std::int64_t>(max_lim + 1, 0)));
  const std::size_t k_start =
      nrows ? std::max<std::size_t>(it.k0, static_cast<std::size_t>(min_lo)) : it.k0;
  const V vcap(static_cast<T>(p.softcap)), vinv_cap(static_cast<T>(1.0 / p.softcap));

  // Scores of key tile [k0, k0 + nk) into S^T with causal and mask applied.
  auto scores_rowwise = [&](std::size_t k0, std::size_t nk) {
    const KS* kt = kbase + k0 * kr;  // (nk, D), row stride kr
    const KS* vt = vbase + k0 * vr;  // (nk, Dv), row stride vr
    // as many rows per register block as the tile has (1, 2 or 4), so no FMA runs on padding
    const std::size_t rb = std::min<std::size_t>(nrows <= 2 ? nrows : 4, N);
    if (rb == 1) {
      rowwise_scores<Arch, T, 1, KV>(s.qt, nrows, D, kt, kr, vt, vr, Dv, nk, s.st);
    } else if (rb == 2) {
      rowwise_scores<Arch, T, 2, KV>(s.qt, nrows, D, kt, kr, vt, vr, Dv, nk, s.st);
    } else {
      rowwise_scores<Arch, T, (N < 4 ? N : 4), KV>(s.qt, nrows, D, kt, kr, vt, vr, Dv, nk, s.st);
    }
  };
  // every row of the tile sees every key of [k0, k0 + nk)
  auto full_tile = [&](std::size_t k0, std::size_t nk) {
    return min_lim >= static_cast<std::int64_t>(k0 + nk) - 1 &&
           max_lo <= static_cast<std::int64_t>(k0);
  };
  // K tile of keys [k0, k0 + nk) as the micro-GEMM's A operand, whose elements it broadcasts
  // one at a time (and re-reads per column block): 16-bit keys are widened once per tile into
  // s.kw (row stride D), float keys are read where they are
  auto k_tile = [&](std::size_t k0, std::size_t nk, std::size_t* ldk) -> const T* {
    if constexpr (KV::widens) {
      for (std::size_t j = 0; j < nk; ++j)
        widen_row<Arch, T, KV>(s.kw + j * D, kbase + (k0 + j) * kr, D);
      *ldk = D;
      return s.kw;
    } else {
      *ldk = kr;
      return kbase + k0 * kr;
    }
  };
  auto scores = [&](std::size_t k0, std::size_t nk) {
    if (rowwise) {
      scores_rowwise(k0, nk);
    } else {
      std::size_t ldk;
      const T* kt = k_tile(k0, nk, &ldk);
      if (p.causal && !full_tile(k0, nk)) {
        // rows of S^T are keys: a column block of rows [j * N, (j + cols) * N) needs the keys
        // up to its last row's limit
        auto keys = [&](std::size_t j, std::size_t cols, std::size_t n) {
          return last_key(j * N, cols * N, k0, n);
        };
        small_gemm<Arch, T>(kt, static_cast<std::ptrdiff_t>(ldk), 1, s.qt,
                            static_cast<std::ptrdiff_t>(LS), s.st, static_cast<std::ptrdiff_t>(LS),
                            nk, ncols / N, D, false, keys);
      } else {
        small_gemm<Arch, T>(kt, static_cast<std::ptrdiff_t>(ldk), 1, s.qt,
                            static_cast<std::ptrdiff_t>(LS), s.st, static_cast<std::ptrdiff_t>(LS),
                            nk, ncols / N, D, false);
      }
    }
    if (!fold) {  // S^T = (K . Q^T) * scale, the reference's order
      const V vscale(scale);
      for (std::size_t j = 0; j < nk; ++j)
        for (std::size_t c = 0; c < ncols; c += N)
          (V::load_unaligned(s.st + j * LS + c) * vscale).store_unaligned(s.st + j * LS + c);
    }
    if (p.softcap != 0.0) {  // Gemma 2: c * tanh(s / c), before the mask
      // A score that left T's range (+-inf, NaN: q.k overflowed, its sign arbitrary) becomes
      // NaN, not +-c: its row then goes to the exact path, as without softcap
      const V vinf(std::numeric_limits<T>::infinity()), vnan(std::numeric_limits<T>::quiet_NaN());
      for (std::size_t j = 0; j < nk; ++j)
        for (std::size_t c = 0; c < ncols; c += N) {
          const V sc = V::load_unaligned(s.st + j * LS + c);
          xsimd::select(xsimd::abs(sc) < vinf, vcap * xsimd::tanh(sc * vinv_cap), vnan)
              .store_unaligned(s.st + j * LS + c);
        }
    }
    if (((p.causal || p.window > 0) && !full_tile(k0, nk)) || nrows < ncols) {
      // limits relative to k0, clamped to [-1, nk] and [0, nk + 1]: small integers, exact in T
      const std::int64_t hi = static_cast<std::int64_t>(nk);
      for (std::size_t c = 0; c < ncols; ++c) {
        const std::int64_t rel = lim_abs[c] - static_cast<std::int64_t>(k0);
        s.lim[c] = static_cast<T>(rel < -1 ? -1 : (rel > hi ? hi : rel));
        const std::int64_t rlo = lo_abs[c] - static_cast<std::int64_t>(k0);
        s.lo[c] = static_cast<T>(rlo < 0 ? 0 : (rlo > hi + 1 ? hi + 1 : rlo));
      }
      for (std::size_t j = 0; j < nk; ++j) {
        const V kj(static_cast<T>(j));
        T* row = s.st + j * LS;
        for (std::size_t c = 0; c < ncols; c += N) {
          const V lim = V::load_unaligned(s.lim + c), lo = V::load_unaligned(s.lo + c);
          xsimd::select((lim < kj) || (kj < lo), V(neg_inf), V::load_unaligned(row + c))
              .store_unaligned(row + c);
        }
      }
    }
    if (p.mask_kind != AttnMask::none) {
      for (std::size_t r = 0; r < nrows; ++r) {
        const std::int64_t base = static_cast<std::int64_t>(it.b) * p.mask_strides[0] +
                                  static_cast<std::int64_t>(row_head(r)) * p.mask_strides[1] +
                                  static_cast<std::int64_t>(row_query(r)) * p.mask_strides[2];
        const std::int64_t sj = p.mask_strides[3];
        if (p.mask_kind == AttnMask::boolean) {
          const std::uint8_t* mrow = static_cast<const std::uint8_t*>(p.mask) + base;
          for (std::size_t j = 0; j < nk; ++j)
            if (!mrow[static_cast<std::int64_t>(k0 + j) * sj]) s.st[j * LS + r] = neg_inf;
        } else {
          const T* mrow = static_cast<const T*>(p.mask) + base;
          for (std::size_t j = 0; j < nk; ++j)
            s.st[j * LS + r] += mrow[static_cast<std::int64_t>(k0 + j) * sj];
        }
      }
    }
  };

  // V tile with a row stride that is a whole number of vectors. Also copied when its rows lie
  // a multiple of 512 bytes apart (Dv = 128 float32, contiguous) and several row blocks of P . V
  // re-read each column slice: those 64 lines would share 8 of L1's sets with O's and thrash.
  // 16-bit V is read in place (widened in registers) only by decode-like tiles, which load each
  // element once or twice; larger tiles re-read it once per block of rows and widen a copy.
  const bool v_conflicts = (vr * sizeof(KS)) % 512 == 0 && nrows > 2 * gemm_rows<Arch>();
  const bool v_in_place = Dv % N == 0 && !v_conflicts && (!KV::widens || nrows <= 8);
  auto v_copy = [&](std::size_t k0, std::size_t nk) -> const T* {
    for (std::size_t j = 0; j < nk; ++j) {
      if constexpr (KV::widens)
        widen_row<Arch, T, KV>(s.vpad + j * ldo, vbase + (k0 + j) * vr, Dv);
      else
        std::memcpy(s.vpad + j * ldo, vbase + (k0 + j) * vr, Dv * sizeof(T));
      std::memset(s.vpad + j * ldo + Dv, 0, (dv_pad - Dv) * sizeof(T));
    }
    return s.vpad;
  };
  // O (rows x Dv) += P (rows x nk) . V (nk x Dv), with P[r][j] = S^T[j][r]; V's rows at vt
  // (row stride ldv) read through the load policy of BL's type
  auto p_dot_v = [&](auto bl, const auto* vt, std::ptrdiff_t ldv, std::size_t k0, std::size_t nk) {
    using BL = decltype(bl);
    // only the vectors that hold V's columns: when Dv is a multiple of this ISA's width, vt is
    // V itself, and dv_pad (a multiple of the widest ISA's) may run past the end of its rows
    if (p.causal && !full_tile(k0, nk)) {
      auto keys = [&](std::size_t r0, std::size_t rows, std::size_t n) {
        return last_key(r0, rows, k0, n);
      };
      small_gemm<Arch, T, BL>(s.st, 1, static_cast<std::ptrdiff_t>(LS), vt, ldv, s.o,
                              static_cast<std::ptrdiff_t>(ldo), nrows, (Dv + N - 1) / N, nk, true,
                              full_extent{}, keys);
    } else {
      small_gemm<Arch, T, BL>(s.st, 1, static_cast<std::ptrdiff_t>(LS), vt, ldv, s.o,
                              static_cast<std::ptrdiff_t>(ldo), nrows, (Dv + N - 1) / N, nk, true);
    }
  };

  // --- stream over key tiles: online softmax ------------------------------------------------
  for (std::size_t k0 = k_start; k0 < k_end; k0 += BK) {
    const std::size_t nk = std::min(BK, k_end - k0);
    scores(k0, nk);
    for (std::size_t c = 0; c < ncols; c += N) {
      V mt(neg_inf);
      for (std::size_t j = 0; j < nk; ++j)
        mt = xsimd::max(mt, V::load_unaligned(s.st + j * LS + c));
      V m_old = V::load_unaligned(s.m + c);
      V m_new = xsimd::max(m_old, mt);
      // rows that have seen no allowed key yet keep m = -inf; subtract 0 instead (no NaN)
      V m_safe = xsimd::select(m_new == V(neg_inf), V(T(0)), m_new);
      V alpha = exp_nonpos<Arch, T>(m_old - m_safe);
      V lsum = V::load_unaligned(s.l + c) * alpha;
      for (std::size_t j = 0; j < nk; ++j) {
        V e = exp_nonpos<Arch, T>(V::load_unaligned(s.st + j * LS + c) - m_safe);
        e.store_unaligned(s.st + j * LS + c);
        lsum += e;
      }
      m_new.store_unaligned(s.m + c);
      lsum.store_unaligned(s.l + c);
      // rescale the running output rows by alpha
      alignas(64) T a[N];
      alpha.store_aligned(a);
      for (std::size_t r = 0; r < N && c + r < nrows; ++r) {
        if (a[r] == T(1)) continue;
        T* orow = s.o + (c + r) * ldo;
        const V av(a[r]);
        for (std::size_t d = 0; d < dv_pad; d += N)
          (V::load_unaligned(orow + d) * av).store_unaligned(orow + d);
      }
    }
    if (v_in_place)
      p_dot_v(KV{}, vbase + k0 * vr, static_cast<std::ptrdiff_t>(vr), k0, nk);
    else
      p_dot_v(PlainWeights<T>{}, v_copy(k0, nk), static_cast<std::ptrdiff_t>(ldo), k0, nk);
  }

  // --- rows whose scores left T's range (see flags in ops.hpp) ------------------------------
  for (std::size_t r = 0; r < nrows; ++r) {
    std::uint8_t f = 0;
    if (std::isnan(s.l[r]) || std::isnan(s.m[r]) || s.m[r] == -neg_inf) {
      f = kAttnNonFinite;
    } else if (s.m[r] == neg_inf) {  // every score -inf: fully masked (zeros) or overflowed?
      const std::int64_t jend =
          std::min<std::int64_t>(lim_abs[r] + 1, static_cast<std::int64_t>(k_end));
      const std::int64_t sj = p.mask_strides[3];
      const std::int64_t base = static_cast<std::int64_t>(it.b) * p.mask_strides[0] +
                                static_cast<std::int64_t>(row_head(r)) * p.mask_strides[1] +
                                static_cast<std::int64_t>(row_query(r)) * p.mask_strides[2];
      for (std::int64_t j = std::max(static_cast<std::int64_t>(it.k0), lo_abs[r]); j < jend; ++j) {
        bool allowed = true;
        if (p.mask_kind == AttnMask::boolean)
          allowed = static_cast<const std::uint8_t*>(p.mask)[base + j * sj] != 0;
        else if (p.mask_kind == AttnMask::additive)
          allowed = static_cast<const T*>(p.mask)[base + j * sj] != neg_inf;
        if (allowed) {
          f = kAttnAllNegInf;
          break;
        }
      }
    }
    flags[r] = f;
  }

  // --- results -------------------------------------------------------------------------------
  if (part_o) {  // a key split: hand back unnormalised (m, l, O) for the merge
    for (std::size_t r = 0; r < nrows; ++r) {
      part_m[r] = s.m[r];
      part_l[r] = s.l[r];
      std::memcpy(part_o + r * dv_pad, s.o + r * ldo, dv_pad * sizeof(T));
    }
    return;
  }
  for (std::size_t r = 0; r < nrows; ++r) {
    if (p.sinks) attn_add_sink(p.sinks[row_head(r)], s.m[r], s.l[r], s.o + r * ldo, Dv);
    T* orow = p.out + it.b * p.os[0] + row_head(r) * p.os[1] + row_query(r) * p.os[2];  // (Dv,)
    // nothing to attend (l = 0): zeros -- written, not O * 0, which is NaN where a key the
    // row may not see has a NaN or inf value; NaN scores (l = NaN) propagate
    if (s.l[r] == T(0)) {
      std::fill(orow, orow + Dv, T(0));
    } else {
      const T inv = s.l[r] > T(0) ? T(1) / s.l[r] : s.l[r];
      const T* orow_acc = s.o + r * ldo;
      const V vinv(inv);
      std::size_t d = 0;
      for (; d + N <= Dv; d += N)
        (V::load_unaligned(orow_acc + d) * vinv).store_unaligned(orow + d);
      for (; d < Dv; ++d) orow[d] = orow_acc[d] * inv;
    }
    if (p.lse) p.lse[(it.b * p.hq + row_head(r)) * p.tq + row_query(r)] = attn_lse(s.m[r], s.l[r]);
  }
  if (p.weights) {  // second sweep: the normalised probabilities, for plots
    for (std::size_t r = 0; r < nrows; ++r) {
      T* wrow = p.weights + ((it.b * p.hq + row_head(r)) * p.tq + row_query(r)) * p.tk;
      std::memset(wrow, 0, p.tk * sizeof(T));
    }
    for (std::size_t r = 0; r < ncols; ++r) {
      const bool seen = r < nrows && s.l[r] > T(0);
      // NaN scores make the whole row NaN, as IEEE softmax would
      s.l[r] = seen ? T(1) / s.l[r] : (std::isnan(s.l[r]) ? s.l[r] : T(0));
      if (s.m[r] == neg_inf) s.m[r] = T(0);
    }
    for (std::size_t k0 = k_start; k0 < k_end; k0 += BK) {
      const std::size_t nk = std::min(BK, k_end - k0);
      scores(k0, nk);
      for (std::size_t c = 0; c < ncols; c += N) {
        V m = V::load_unaligned(s.m + c), inv_l = V::load_unaligned(s.l + c);
        for (std::size_t j = 0; j < nk; ++j) {
          V e = exp_flush<Arch, T>(V::load_unaligned(s.st + j * LS + c) - m) * inv_l;
          e.store_unaligned(s.st + j * LS + c);
        }
      }
      for (std::size_t r = 0; r < nrows; ++r) {
        T* wrow = p.weights + ((it.b * p.hq + row_head(r)) * p.tq + row_query(r)) * p.tk;
        for (std::size_t j = 0; j < nk; ++j) wrow[k0 + j] = s.st[j * LS + r];
      }
    }
  }
}

}  // namespace

template <class Arch, class T>
void attention_tile_kernel::operator()(Arch, const attn_params<T>& p, const attn_item& it,
                                       T* workspace, T* part_m, T* part_l, T* part_o,
                                       std::uint8_t* flags) const {
  if constexpr (std::is_same<T, float>::value) {  // 16-bit K/V: float32 arithmetic only
    if (p.kv_format == WeightFormat::bf16)
      return attention_tile<Arch, T, Widen16<WeightFormat::bf16>>(p, it, workspace, part_m, part_l,
                                                                  part_o, flags, p.k16, p.v16);
    if (p.kv_format == WeightFormat::f16)
      return attention_tile<Arch, T, Widen16<WeightFormat::f16>>(p, it, workspace, part_m, part_l,
                                                                 part_o, flags, p.k16, p.v16);
  }
  attention_tile<Arch, T, PlainWeights<T>>(p, it, workspace, part_m, part_l, part_o, flags, p.k,
                                           p.v);
}

}  // namespace llmk
