// attention: the driver of the tile kernel (kernels/attention.hpp) -- work items over batch x KV
// head x query tile, decode key splits merged in order, rows that left T's range recomputed
// exactly. No Python here: the op's entry (ops/attention.cpp) and the attention module
// (modules/modules.cpp) both call it; it calls only kernels and common/ (no other driver).
#include "drivers/attend.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/isa.hpp"
#include "common/mxcsr.hpp"
#include "common/scratch.hpp"
#include "common/thread_pool.hpp"

namespace llmk {
namespace {

// Key-range split for decode-like shapes (a KV group's rows fit one tile): fixed-size splits,
// so the arithmetic (and hence the result) does not depend on the thread count.
constexpr std::size_t kKeySplit = 512;

// One query row (b, h, i) the exact way: the float64 reference's own order and precision,
// scores = (q . k) * scale + mask in double, softmax over the allowed keys with a running max
// (online; no Tk-sized buffer), output and weights rounded to T once at the end. For the rows
// the fast kernel cannot get right in T (scores past T's range while the reference's are
// finite: huge scale, q or k), and for all rows when scale itself is not a normal T. Slow
// (scalar), and only ever taken for such extreme inputs or NaN/Inf data.
// acc: (Dv,) scratch; wide: (max(D, Dv),) scratch for a K or V row widened from 16 bits (when
// p.kv_format is bf16 / f16, T = float).
template <class T>
void attention_row_exact(const attn_params<T>& p, std::size_t b, std::size_t h, std::size_t i,
                         double* acc, T* wide) {
  const std::size_t group = p.hq / p.hkv, g = h / group;
  const T* q = p.q + b * p.qs[0] + h * p.qs[1] + i * p.qs[2];  // (D,)
  const std::size_t kofs = b * p.ks[0] + g * p.ks[1], vofs = b * p.vs[0] + g * p.vs[1];
  // K row j (D,) and V row j (Dv,) of KV head g as T values: in place, or widened into `wide`
  // (the kernels' own conversion)
  auto kv_row = [&](const T* base, const std::uint16_t* base16, std::size_t ofs, std::size_t n) {
    if constexpr (std::is_same<T, float>::value) {
      if (p.kv_format != WeightFormat::f32) {
        dispatch(widen_w16_kernel{}, wide, base16 + ofs, p.kv_format, n);
        return static_cast<const T*>(wide);
      }
    }
    return base + ofs;
  };
  T* o = p.out + b * p.os[0] + h * p.os[1] + i * p.os[2];      // (Dv,)
  T* w = p.weights ? p.weights + ((b * p.hq + h) * p.tq + i) * p.tk : nullptr;  // (Tk,)
  // integer causal limit: the last key index this row may see
  const std::int64_t tk = static_cast<std::int64_t>(p.tk), tq = static_cast<std::int64_t>(p.tq);
  const std::int64_t pos = static_cast<std::int64_t>(i) + tk - tq;
  const std::int64_t lim = p.causal ? pos : tk - 1;
  const std::size_t jn = lim < 0 ? 0 : std::min(p.tk, static_cast<std::size_t>(lim) + 1);
  // sliding window: the first key the row sees
  const std::size_t j0 = p.window > 0 ? static_cast<std::size_t>(std::clamp<std::int64_t>(
                                            pos - p.window + 1, 0, static_cast<std::int64_t>(jn)))
                                      : 0;
  const std::int64_t mbase = static_cast<std::int64_t>(b) * p.mask_strides[0] +
                             static_cast<std::int64_t>(h) * p.mask_strides[1] +
                             static_cast<std::int64_t>(i) * p.mask_strides[2];
  const double inf = std::numeric_limits<double>::infinity();
  // score of key j into *sc; false when the key is not attended (masked, or a -inf score)
  auto score = [&](std::size_t j, double* sc) {
    const std::int64_t mj = mbase + static_cast<std::int64_t>(j) * p.mask_strides[3];
    if (p.mask_kind == AttnMask::boolean && !static_cast<const std::uint8_t*>(p.mask)[mj])
      return false;
    const T* kr = kv_row(p.k, p.k16, kofs + j * p.ks[2], p.d);
    double dot = 0.0;
    for (std::size_t d = 0; d < p.d; ++d)
      dot += static_cast<double>(q[d]) * static_cast<double>(kr[d]);
    double v = dot * p.scale;
    if (p.softcap != 0.0) v = p.softcap * std::tanh(v / p.softcap);
    if (p.mask_kind == AttnMask::additive)
      v += static_cast<double>(static_cast<const T*>(p.mask)[mj]);
    *sc = v;
    return v != -inf;
  };
  std::fill(acc, acc + p.dv, 0.0);
  double m = -inf, l = 0.0;
  bool nan_row = false;  // a NaN or +inf score: the reference's softmax is NaN throughout
  for (std::size_t j = j0; j < jn && !nan_row; ++j) {
    double sc;
    if (!score(j, &sc)) continue;
    if (std::isnan(sc) || sc == inf) {
      nan_row = true;
      break;
    }
    if (sc > m) {  // new running max: rescale what was summed so far
      const double a = std::exp(m - sc);
      l *= a;
      for (std::size_t d = 0; d < p.dv; ++d) acc[d] *= a;
      m = sc;
    }
    const double e = std::exp(sc - m);
    l += e;
    const T* vr = kv_row(p.v, p.v16, vofs + j * p.vs[2], p.dv);
    for (std::size_t d = 0; d < p.dv; ++d) acc[d] += e * static_cast<double>(vr[d]);
  }
  if (p.sinks) {  // the sink joins the denominator (no value); a NaN or +inf sink: NaN row
    const double sink = static_cast<double>(p.sinks[h]);
    if (std::isnan(sink) || sink == inf)
      nan_row = true;
    else
      attn_add_sink(sink, m, l, acc, p.dv);
  }
  T* lse = p.lse ? p.lse + (b * p.hq + h) * p.tq + i : nullptr;
  if (nan_row) {
    std::fill(o, o + p.dv, std::numeric_limits<T>::quiet_NaN());
    if (w) std::fill(w, w + p.tk, std::numeric_limits<T>::quiet_NaN());
    if (lse) *lse = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  if (lse) *lse = static_cast<T>(attn_lse(m, l));
  for (std::size_t d = 0; d < p.dv; ++d) o[d] = l > 0.0 ? static_cast<T>(acc[d] / l) : T(0);
  if (w) {
    std::fill(w, w + p.tk, T(0));
    if (l > 0.0) {
      for (std::size_t j = j0; j < jn; ++j) {
        double sc;
        if (score(j, &sc)) w[j] = static_cast<T>(std::exp(sc - m) / l);
      }
    }
  }
}

// scale as a T multiplier: must be a normal number (or 0) for the fast kernel
template <class T>
bool scale_fits(double scale) {
  const double a = std::fabs(scale);
  return a == 0.0 || (a >= static_cast<double>(std::numeric_limits<T>::min()) &&
                      a <= static_cast<double>(std::numeric_limits<T>::max()) &&
                      static_cast<T>(a) >= std::numeric_limits<T>::min());
}

}  // namespace

template <class T>
void attention(const attn_params<T>& p) {
  const std::size_t group = p.hq / p.hkv;
  const std::size_t rows_per_group = group * p.tq;
  // rows per tile: balanced tiles of at most kAttnRowTile rows (kAttnRowTileLimited for causal
  // or windowed calls; see ops.hpp), a multiple of 16 (whole column blocks of the micro-GEMMs)
  const std::size_t max_tile = p.causal || p.window > 0 ? kAttnRowTileLimited : kAttnRowTile;
  const std::size_t min_tiles =
      std::max<std::size_t>(1, (rows_per_group + max_tile - 1) / max_tile);
  const std::size_t balanced = ((rows_per_group + min_tiles - 1) / min_tiles + 15) / 16 * 16;
  const std::size_t tile_rows = std::min(max_tile, std::max<std::size_t>(16, balanced));
  const std::size_t row_tiles = (rows_per_group + tile_rows - 1) / tile_rows;
  const std::size_t splits = (p.weights == nullptr && row_tiles == 1 && p.tk > 2 * kKeySplit)
                                 ? (p.tk + kKeySplit - 1) / kKeySplit
                                 : 1;

  std::vector<attn_item> items;
  items.reserve(p.b * p.hkv * row_tiles * splits);
  for (std::size_t b = 0; b < p.b; ++b)
    for (std::size_t g = 0; g < p.hkv; ++g)
      for (std::size_t t = 0; t < row_tiles; ++t) {
        std::size_t row0 = t * tile_rows;
        std::size_t nrows = std::min(tile_rows, rows_per_group - row0);
        for (std::size_t s = 0; s < splits; ++s) {
          std::size_t k0 = splits == 1 ? 0 : s * kKeySplit;
          std::size_t k1 = splits == 1 ? p.tk : std::min(p.tk, k0 + kKeySplit);
          items.push_back({b, g, row0, nrows, k0, k1});
        }
      }
  if (items.empty()) return;

  // Rows recomputed the exact way (attention_row_exact), `rows` of them: row r is (b, h, i)
  // flattened as row_of(r). Its scratch is allocated here, before anything is written.
  const int max_threads = std::max(1, get_num_threads());
  const std::size_t acc_stride = std::max<std::size_t>(p.dv, 1);
  std::vector<double> exact_acc(static_cast<std::size_t>(max_threads) * acc_stride);
  // (16-bit K/V: a widened K or V row per thread)
  const std::size_t wide_stride =
      p.kv_format != WeightFormat::f32 ? std::max<std::size_t>(std::max(p.d, p.dv), 1) : 0;
  std::vector<T> exact_wide(static_cast<std::size_t>(max_threads) * wide_stride);
  auto exact_rows = [&](std::size_t rows, auto row_of) {
    const double cost = static_cast<double>(p.tk) * static_cast<double>(p.d + p.dv + 8);
    const int threads = static_cast<int>(
        std::min<double>(max_threads, std::max(1.0, static_cast<double>(rows) * cost / 2e5)));
    std::atomic<std::size_t> next_row{0};
    parallel_for_threads(threads, [&](int chunk, int) {
      ExactSubnormals exact;  // the merge and the exact path run outside the kernels
      double* acc = exact_acc.data() + static_cast<std::size_t>(chunk) * acc_stride;
      T* wide = exact_wide.data() + static_cast<std::size_t>(chunk) * wide_stride;
      for (std::size_t r = next_row.fetch_add(1); r < rows; r = next_row.fetch_add(1)) {
        const std::size_t row = row_of(r);
        attention_row_exact(p, row / (p.hq * p.tq), (row / p.tq) % p.hq, row % p.tq, acc, wide);
      }
    });
  };
  // all rows of the call, the exact way (a scale outside T's normal range: 1e-50 or 1e40 in
  // float32, which the reference applies in float64)
  if (!scale_fits<T>(p.scale)) {
    exact_rows(p.b * p.hq * p.tq, [](std::size_t r) { return r; });
    return;
  }

  const std::size_t dv_pad = attn_dv_pad_t<T>(p.dv);
  const std::size_t ws = attn_workspace_size<T>(p.d, p.dv, p.kv_format != WeightFormat::f32);
  // key-split partial states, per item: m and l (R each) and O (R x dv_pad), R = the rows of
  // a tile (splits only happen when one tile holds a KV group's rows: decode-like shapes, R =
  // group * Tq <= kAttnRowTile, so a 4-head group keeps 4 rows of state, not 64)
  const std::size_t part_rows = std::min(kAttnRowTile, rows_per_group);
  const std::size_t part_stride = part_rows * (2 + dv_pad);
  // per item and row: kAttnNonFinite / kAttnAllNegInf (see ops.hpp); then the list of the
  // suspect rows (at most one per row of the call); both allocated before anything is written
  std::vector<std::uint8_t> flags(items.size() * kAttnRowTile, 0);
  // (uninitialised: pages are only touched when a row is listed)
  const std::size_t n_rows = std::max<std::size_t>(p.b * p.hq * p.tq, 1);
  std::unique_ptr<std::size_t[]> row_list(new std::size_t[n_rows]);

  // dynamic scheduling: causal tiles differ in cost; which thread runs an item does not change
  // what it computes
  const double flops = 2.0 * static_cast<double>(p.b * p.hq * p.tq) * static_cast<double>(p.tk) *
                       static_cast<double>(p.d + p.dv);
  const int threads =
      flops < 2e5 ? 1 : std::min<int>(get_num_threads(), static_cast<int>(items.size()));

  // All scratch of the call -- one tile workspace per chunk, then the partial states -- is
  // allocated here, before anything is written (common/scratch.hpp: a failure is a clean
  // std::bad_alloc, and what stays allocated between calls is bounded).
  const std::size_t ws_stride = (ws + 15) / 16 * 16;  // 64-byte aligned workspaces
  const std::size_t n_parts = splits > 1 ? items.size() * part_stride : 0;
  ScratchLease scratch((static_cast<std::size_t>(threads) * ws_stride + n_parts) * sizeof(T));
  T* const workspaces = scratch.as<T>();
  T* const parts = workspaces + static_cast<std::size_t>(threads) * ws_stride;

  std::atomic<std::size_t> next{0};
  parallel_chunks(threads, [&](int chunk, int) {
    T* workspace = workspaces + static_cast<std::size_t>(chunk) * ws_stride;
    for (std::size_t i = next.fetch_add(1); i < items.size(); i = next.fetch_add(1)) {
      T* part = splits > 1 ? parts + i * part_stride : nullptr;
      dispatch(attention_tile_kernel{}, p, items[i], workspace, part,
               part ? part + part_rows : nullptr, part ? part + 2 * part_rows : nullptr,
               flags.data() + i * kAttnRowTile);
    }
  });

  if (splits > 1) {  // merge the key splits of each tile, in split order
    const std::size_t tiles = items.size() / splits;
    parallel_for(
        tiles, 1, static_cast<double>(splits * part_rows * dv_pad),
        [&](std::size_t t0, std::size_t t1) {
          ExactSubnormals exact;  // the merge and the exact path run outside the kernels
          for (std::size_t t = t0; t < t1; ++t) {
            const attn_item& it = items[t * splits];
            for (std::size_t r = 0; r < it.nrows; ++r) {
              // running max over the splits; a NaN max (NaN scores) must reach the result
              T m = -std::numeric_limits<T>::infinity();
              for (std::size_t s = 0; s < splits; ++s) {
                const T pm = parts[(t * splits + s) * part_stride + r];
                m = std::isnan(pm) || std::isnan(m) ? std::numeric_limits<T>::quiet_NaN()
                                                    : std::max(m, pm);
              }
              const T m_safe = std::isinf(m) && m < 0 ? T(0) : m;
              T l = 0;
              const std::size_t h = it.g * group + (it.row0 + r) / p.tq, i = (it.row0 + r) % p.tq;
              T* orow = p.out + it.b * p.os[0] + h * p.os[1] + i * p.os[2];
              std::fill(orow, orow + p.dv, T(0));
              for (std::size_t s = 0; s < splits; ++s) {
                const T* part = parts + (t * splits + s) * part_stride;
                if (std::isinf(part[r]) && part[r] < 0) continue;  // split saw no allowed key
                const T w = std::exp(part[r] - m_safe);            // NaN/Inf propagate from here
                l += part[part_rows + r] * w;
                const T* o = part + 2 * part_rows + r * dv_pad;
                for (std::size_t d = 0; d < p.dv; ++d) orow[d] += o[d] * w;
              }
              T m_row = std::isinf(m) && m < 0 ? m : m_safe;  // the state (m, l, orow) of the row
              if (p.sinks) attn_add_sink(p.sinks[h], m_row, l, orow, p.dv);
              // nothing to attend: zeros (written: O * 0 is NaN for a NaN value of an unseen key)
              const T inv = l > T(0) ? T(1) / l : l;
              for (std::size_t d = 0; d < p.dv; ++d) orow[d] = l == T(0) ? T(0) : orow[d] * inv;
              if (p.lse) p.lse[(it.b * p.hq + h) * p.tq + i] = attn_lse(m_row, l);
            }
          }
        });
  }

  // Rows whose scores left T's range: recomputed exactly. A row is suspect when a score was
  // +inf or NaN, or when every allowed score was -inf (scores that overflowed downwards; -inf
  // scores next to a finite one have weight 0 in the reference too: they lie more than 1e31
  // below it). Rare: for normal data this is a scan of the flags.
  std::size_t n_suspect = 0;
  const std::size_t tiles = items.size() / splits;
  for (std::size_t t = 0; t < tiles; ++t) {
    const attn_item& it = items[t * splits];
    for (std::size_t r = 0; r < it.nrows; ++r) {
      bool non_finite = false, all_neg_inf = false, all_m_neg_inf = true;
      for (std::size_t sp = 0; sp < splits; ++sp) {
        const std::uint8_t f = flags[(t * splits + sp) * kAttnRowTile + r];
        non_finite |= (f & kAttnNonFinite) != 0;
        all_neg_inf |= (f & kAttnAllNegInf) != 0;
        if (splits > 1) {
          const T pm = parts[(t * splits + sp) * part_stride + r];
          all_m_neg_inf &= std::isinf(pm) && pm < 0;
        }
      }
      if (non_finite || (all_neg_inf && all_m_neg_inf)) {
        const std::size_t h = it.g * group + (it.row0 + r) / p.tq, i = (it.row0 + r) % p.tq;
        row_list[n_suspect++] = (it.b * p.hq + h) * p.tq + i;
      }
    }
  }
  if (n_suspect) exact_rows(n_suspect, [&](std::size_t r) { return row_list[r]; });
}

template void attention<float>(const attn_params<float>&);
template void attention<double>(const attn_params<double>&);

}  // namespace llmk
