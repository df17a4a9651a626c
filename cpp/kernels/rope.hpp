// Rotary position embedding applied to rows with precomputed cos/sin tables.
#pragma once

#include <cstring>

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {

// Rotary embedding of rows. x, out: (rows, d); table_row: (rows,) index into the tables;
// cos_tab, sin_tab: (n_table, rotary_dim / 2), already multiplied by the attention factor.
// Half-split pairs (x[i], x[i + r/2]); interleaved pairs (x[2i], x[2i+1]). Features
// [rotary_dim, d) are copied through.
template <class Arch, class T>
void rope_kernel::operator()(Arch, T* out, const T* x, const std::int64_t* table_row,
                             const T* cos_tab, const T* sin_tab, std::size_t rows, std::size_t d,
                             std::size_t rotary_dim, bool interleaved, bool stream) const {
  using B = vec<Arch, T>;
  constexpr std::size_t N = B::size;
  const std::size_t half = rotary_dim / 2;
  ExactSubnormals exact;  // subnormal x count (no DAZ), whatever the caller's MXCSR
  for (std::size_t r = 0; r < rows; ++r) {
    const T* xr = x + r * d;                     // (d,)
    T* o = out + r * d;                          // (d,) -- may alias xr: pairs are loaded first
    const T* c = cos_tab + table_row[r] * half;  // (half,)
    const T* s = sin_tab + table_row[r] * half;  // (half,)
    if (!interleaved) {
      // half-split (rotate_half): pair i is (x[i], x[i + half])
      std::size_t i = 0;
      for (; i + N <= half; i += N) {
        B x1 = B::load_unaligned(xr + i), x2 = B::load_unaligned(xr + half + i);
        B vc = B::load_unaligned(c + i), vs = B::load_unaligned(s + i);
        B o1 = xsimd::fms(x1, vc, x2 * vs);  // x1*cos - x2*sin
        B o2 = xsimd::fma(x2, vc, x1 * vs);  // x2*cos + x1*sin
        store_batch<Arch, T>(o + i, o1, stream);
        store_batch<Arch, T>(o + half + i, o2, stream);
      }
      for (; i < half; ++i) {
        T x1 = xr[i], x2 = xr[half + i];
        o[i] = std::fma(x1, c[i], -(x2 * s[i]));
        o[half + i] = std::fma(x2, c[i], x1 * s[i]);
      }
    } else {
      // interleaved (Meta / RoFormer): pair i is (x[2i], x[2i+1])
      for (std::size_t i = 0; i < half; ++i) {
        T x1 = xr[2 * i], x2 = xr[2 * i + 1];
        o[2 * i] = std::fma(x1, c[i], -(x2 * s[i]));
        o[2 * i + 1] = std::fma(x2, c[i], x1 * s[i]);
      }
    }
    if (o != xr && rotary_dim < d)
      std::memcpy(o + rotary_dim, xr + rotary_dim, (d - rotary_dim) * sizeof(T));
  }
  stream_fence(stream);
}

}  // namespace llmk
