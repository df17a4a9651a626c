// The activation quantizer of the int8-activation kernels (kernels/quant.hpp,
// kernels/quant_vnni.hpp): tokens quantized per block of kQBlock = 32 floats, llama.cpp's q8_0.
// drivers/qlinear.cpp calls it through dispatch, each thread on its own tokens.
#pragma once

#include <cstring>
#include <limits>

#include "kernels/ops.hpp"
#include "kernels/quant_types.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {

// The activation scales the int8 kernels take: 0 (a zero block), NaN (a block holding NaN or Inf)
// or within [2^-100, 2^100]. Their products d = s_w * s_x (|s_w| in [2^-24, 65504] or 0) are
// then finite normal floats: one token of |x| ~ 3e38 made d = inf, and inf * 0 = NaN for a row
// whose integer dot product is 0 (the reference: 0); a block of subnormal x made s_x and d
// subnormal, a few significant bits (3% off on every row). A call with a scale outside the range
// takes float activations instead (llmkernels.quant.INT8_ACTIVATION_SCALE_RANGE).
constexpr float kActScaleMin = 0x1p-100f, kActScaleMax = 0x1p100f;

// Per token, per block of 32: s = max|x| / 127 (float32), q = rint(x / s) (0 when s == 0);
// a block holding NaN or Inf gets s = NaN (its products are NaN, as in float arithmetic).
// *in_range: whether every s is 0, NaN or within [kActScaleMin, kActScaleMax].
// q (m, k) int8, q16 (m, k) the same codes as int16 (or null: not written), s (m, k / kQBlock),
// x (m, k) float32, k % kQBlock == 0. Run with ExactSubnormals (the caller's).
//
// The bits are the same on every ISA (the integer kernels that take them are exact, and the
// tests compare ISAs bitwise): every step is exact or one IEEE operation per element -- max of
// |x| is exact in any order (a NaN lane only ever yields s = NaN, codes 0), the division is
// IEEE, and the conversion rounds half to even as nearbyint does (round-to-nearest, the mode
// ExactSubnormals leaves); clamping the int32 codes to [-127, 127] equals saturating them to
// int16 first (the SSE2 formulation this replaced). A scalar pass cost ~3% of an int8 decode
// step (one call per projection), hence vectors.
template <class Arch>
void quantize_acts_kernel::operator()(Arch, std::int8_t* q, std::int16_t* q16, float* s,
                                      bool* in_range, const float* x, std::size_t m,
                                      std::size_t k) const {
  using B = vec<Arch, float>;
  constexpr std::size_t N = B::size;
  static_assert(kQBlock % N == 0, "a block is whole vectors on every ISA");
  const std::size_t nb = k / kQBlock;
  const B fmax(std::numeric_limits<float>::max());
  alignas(64) float lanes[N];               // (N,) the block's max |x| per lane
  alignas(64) std::int32_t codes[kQBlock];  // (kQBlock,) the block's rounded codes
  bool ok = true;
  for (std::size_t t = 0; t < m; ++t)
    for (std::size_t b = 0; b < nb; ++b) {
      const float* xb = x + t * k + b * kQBlock;
      B amax(0.f);
      typename B::batch_bool_type bad(false);
      for (std::size_t i = 0; i < kQBlock; i += N) {
        const B a = xsimd::abs(B::load_unaligned(xb + i));
        bad = bad || (a > fmax) || xsimd::isnan(a);  // NaN or Inf
        amax = xsimd::max(amax, a);
      }
      amax.store_aligned(lanes);
      float mx = lanes[0];
      for (std::size_t l = 1; l < N; ++l) mx = std::max(mx, lanes[l]);
      const bool finite = !xsimd::any(bad);
      const float d = mx / 127.f;
      s[t * nb + b] = finite ? d : std::numeric_limits<float>::quiet_NaN();
      if (finite && d != 0.f && !(d >= kActScaleMin && d <= kActScaleMax)) ok = false;
      std::int8_t* qb = q + t * k + b * kQBlock;
      std::int16_t* q16b = q16 ? q16 + t * k + b * kQBlock : nullptr;
      if (!finite || d == 0.f) {
        std::memset(qb, 0, kQBlock);
        if (q16) std::memset(q16b, 0, kQBlock * sizeof(std::int16_t));
        continue;
      }
      const B dv(d);
      for (std::size_t i = 0; i < kQBlock; i += N)
        xsimd::nearbyint_as_int(B::load_unaligned(xb + i) / dv).store_aligned(codes + i);
      for (std::size_t i = 0; i < kQBlock; ++i) {
        const std::int32_t c = std::min(127, std::max(-127, codes[i]));
        qb[i] = static_cast<std::int8_t>(c);
        if (q16) q16b[i] = static_cast<std::int16_t>(c);
      }
    }
  *in_range = ok;
}

}  // namespace llmk
