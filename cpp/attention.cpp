#include "attention.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "common/isa.hpp"
#include "common/scratch.hpp"
#include "common/thread_pool.hpp"

namespace llmk {
namespace {

// Key-range split for decode-like shapes (a KV group's rows fit one tile): fixed-size splits,
// so the arithmetic (and hence the result) does not depend on the thread count.
constexpr std::size_t kKeySplit = 512;

}  // namespace

template <class T>
void attention(const attn_params<T>& p) {
  const std::size_t group = p.hq / p.hkv;
  const std::size_t rows_per_group = group * p.tq;
  const std::size_t row_tiles = (rows_per_group + kAttnRowTile - 1) / kAttnRowTile;
  const std::size_t splits =
      (p.weights == nullptr && row_tiles == 1 && p.tk > 2 * kKeySplit)
          ? (p.tk + kKeySplit - 1) / kKeySplit
          : 1;

  std::vector<attn_item> items;
  items.reserve(p.b * p.hkv * row_tiles * splits);
  for (std::size_t b = 0; b < p.b; ++b)
    for (std::size_t g = 0; g < p.hkv; ++g)
      for (std::size_t t = 0; t < row_tiles; ++t) {
        std::size_t row0 = t * kAttnRowTile;
        std::size_t nrows = std::min(kAttnRowTile, rows_per_group - row0);
        for (std::size_t s = 0; s < splits; ++s) {
          std::size_t k0 = splits == 1 ? 0 : s * kKeySplit;
          std::size_t k1 = splits == 1 ? p.tk : std::min(p.tk, k0 + kKeySplit);
          items.push_back({b, g, row0, nrows, k0, k1});
        }
      }
  if (items.empty()) return;

  const std::size_t dv_pad = attn_dv_pad_t<T>(p.dv);
  const std::size_t ws = attn_workspace_size<T>(p.d, p.dv);
  // key-split partial states, per item: m and l (R each) and O (R x dv_pad), R = the rows of
  // a tile (splits only happen when one tile holds a KV group's rows: decode-like shapes, R =
  // group * Tq <= kAttnRowTile, so a 4-head group keeps 4 rows of state, not 64)
  const std::size_t part_rows = std::min(kAttnRowTile, rows_per_group);
  const std::size_t part_stride = part_rows * (2 + dv_pad);

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
               part ? part + part_rows : nullptr, part ? part + 2 * part_rows : nullptr);
    }
  });

  if (splits > 1) {  // merge the key splits of each tile, in split order
    const std::size_t tiles = items.size() / splits;
    parallel_for(tiles, 1, static_cast<double>(splits * part_rows * dv_pad),
                 [&](std::size_t t0, std::size_t t1) {
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
          T* orow = p.out + it.b * p.os[0] + (it.g * group + (it.row0 + r) / p.tq) * p.os[1] +
                    ((it.row0 + r) % p.tq) * p.os[2];
          std::fill(orow, orow + p.dv, T(0));
          for (std::size_t s = 0; s < splits; ++s) {
            const T* part = parts + (t * splits + s) * part_stride;
            if (std::isinf(part[r]) && part[r] < 0) continue;  // split saw no allowed key
            const T w = std::exp(part[r] - m_safe);  // NaN/Inf propagate from here
            l += part[part_rows + r] * w;
            const T* o = part + 2 * part_rows + r * dv_pad;
            for (std::size_t d = 0; d < p.dv; ++d) orow[d] += o[d] * w;
          }
          const T inv = l > T(0) ? T(1) / l : (std::isnan(l) ? l : T(0));
          for (std::size_t d = 0; d < p.dv; ++d) orow[d] *= inv;
        }
      }
    });
  }
}

template void attention<float>(const attn_params<float>&);
template void attention<double>(const attn_params<double>&);

}  // namespace llmk
