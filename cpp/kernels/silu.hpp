// SiLU and SwiGLU: out = x * sigmoid(x) [* up]. Also the bare exp / sigmoid used by tests.
#pragma once

#include "kernels/ops.hpp"
#include "kernels/simd_common.hpp"

namespace llmk {

// silu(x) = x / (1 + exp(-x)); for x -> -inf, exp(-x) overflows to +inf and the quotient is
// -0, never NaN (x = -inf itself gives NaN, as IEEE inf/inf and torch do).
//
// Subnormals without DAZ/FTZ (the numerical rules: subnormals are numbers) and without slowing normal data down. The bare
// formula is exact to rounding except in two ranges of g, where it underflows although
// silu(g) * up can be a normal number (swiglu(1e-40, 1e30) = 5e-11; swiglu(-100, 1e38)):
//   tiny |g| (< 2^-30 in float32, a subnormal g included): sigmoid(g) = 1/2 to far below
//     rounding, so y = (g * up) / 2 -- g * up first: it cannot overflow (|g| < 2^-30), and no
//     bit of a subnormal g is lost to a halving;
//   g below -ln(max) (-88.72 in float32, -709.78 in float64), where exp(-g) overflows and
//     silu(g) = g exp(g) (1 + exp(g) = 1 there) underflows: y = ((g e) up) C^m with
//     e = exp(g + mK), C = exp(-K) (K = 44 / 704, so g + mK is exact, and m = 1..3 the least
//     that keeps e normal): every partial product is a normal number unless the result is
//     not, and the error stays within a few ulp.
// Finding those lanes costs nothing on normal data: a tiny or subnormal g raises MXCSR's sticky
// underflow or denormal-operand flag in the bare formula (so does any subnormal result), and
// g < -88 is one compare per batch or-ed into a block mask. A block of kBlock elements runs the
// bare formula, then MXCSR is read once; only a block that raised a flag or saw such a gate is
// recomputed with checked(), and the next block goes straight to checked() until a block needs
// none of it (runs of subnormal data cost one pass, not two).
namespace {

// Gated = false: out = silu(x); Gated = true: out = silu(x) * up. One body serves both
// (fusion as a template flag, not a copied loop). out, x, up: (n,)
template <bool Gated, class Arch, class T>
void silu_body(T* out, const T* x, const T* up, std::size_t n, bool stream) {
  using B = vec<Arch, T>;
  using M = typename B::batch_bool_type;
  constexpr std::size_t N = B::size;
  constexpr std::size_t kBlock = 512;    // elements per MXCSR check (a multiple of N)
  constexpr unsigned kFlagsMask = 0x12;  // UE (underflow, bit 4) | DE (denormal operand, bit 1)
  const B one(T(1)), half(T(0.5));
  const B tiny(exp_one_below<T>()), lo(exp_subnormal_below<T>());
  const bool f32 = std::is_same<T, float>::value;
  const B cutoff(f32 ? T(88.0) : T(709.0));  // exp_wide's cut-off: beyond it, check the block
  const B ovf(f32 ? T(88.72) : T(709.78));   // -g beyond: exp(-g) overflows, g is "big"
  const B kk(f32 ? T(44.0) : T(704.0));      // the shift K of the big lanes' exp
  const B ck(f32 ? T(7.781132241133797e-20) : T(1.8058627513522668e-306));  // exp(-K)
  const B lnmin(-exp_subnormal_below<T>());  // e = exp(g + mK) is normal while g + mK >= -lnmin
  const unsigned csr_caller = _mm_getcsr();  // restored at the end (its status flags too)
  ExactSubnormals exact;  // subnormal operands count (no DAZ/FTZ), whatever the caller's MXCSR
  const unsigned csr_clean = _mm_getcsr() & ~0x3Fu;  // our mode bits, status flags clear
  _mm_setcsr(csr_clean);

  // The bare formula: exact to rounding when no flag is raised and g >= -88; lanes below are
  // noted in *big.
  auto fast = [&](const B& g, const B& u, M* big) {
    const B arg = -g;  // (g > 87: exp(-g) is subnormal, raises UE, and the block is redone)
    *big = *big || (arg > cutoff);
    const B s = g / (one + xsimd::exp(arg));
    return Gated ? s * u : s;
  };
  // y for the big lanes (g < -ln(max)): ((g e) up) C^m, see above
  auto big_y = [&](const B& g, const B& u) {
    // m = 1, 2 or 3 shifts K: the least with g + mK >= -ln(min normal)
    const auto m2 = g < -(lnmin + kk), m3 = g < -(lnmin + kk + kk);
    const B shift = xsimd::select(m3, kk + kk + kk, xsimd::select(m2, kk + kk, kk));
    const B e = xsimd::exp(g + shift);  // g + mK: exact (|sum| < |g|); -inf: e = 0, y NaN
    B yb = g * e;
    if (Gated) yb *= u;
    // (factors of 1 where not needed: a product that underflows to 0 costs a microcode
    // assist even when a select would discard it)
    yb *= ck;
    yb *= xsimd::select(m2, ck, one);
    return yb * xsimd::select(m3, ck, one);
  };
  // y for the tiny lanes: (g up) / 2
  auto tiny_y = [&](const B& g, const B& u) { return (Gated ? g * u : g) * half; };
  // Every lane right, and no subnormal formed unless the result is one; *need: lanes that
  // needed it (tiny or hugely negative g). Batches entirely of one kind (runs of subnormal or
  // extreme data) take only their own formula.
  auto checked = [&](const B& g, const B& u, M* need) {
    const auto is_tiny = xsimd::abs(g) < tiny;
    const auto is_big = g < -ovf;
    *need = *need || is_tiny || is_big;
    if (xsimd::all(is_tiny)) return tiny_y(g, u);
    if (xsimd::all(is_big)) return big_y(g, u);
    // exp(-g) with tiny |g| as exp(0) and -g below ln(2^-126) clamped (adds nothing to 1); the
    // big lanes' argument is 0 instead (xsimd's exp is several times slower past its range,
    // and their result is replaced below). Tiny lanes divide 0, not a subnormal (also slow).
    const B g0 = xsimd::select(is_tiny, B(T(0)), g);
    const B arg = xsimd::max(xsimd::select(is_big, B(T(0)), -g0), lo);
    const B s = g0 / (one + exp_wide<Arch, T>(arg));
    B y = Gated ? s * u : s;
    y = xsimd::select(is_tiny, tiny_y(g, u), y);
    if (xsimd::any(is_big)) y = xsimd::select(is_big, big_y(g, u), y);
    return y;
  };
  // a partial batch of cnt < N elements at i goes through a padded buffer, the checked code
  auto partial = [&](std::size_t i, std::size_t cnt) {
    alignas(64) T bx[N] = {};
    alignas(64) T bu[N] = {};
    for (std::size_t k = 0; k < cnt; ++k) {
      bx[k] = x[i + k];
      if (Gated) bu[k] = up[i + k];
    }
    M need(false);
    checked(B::load_aligned(bx), B::load_aligned(bu), &need).store_aligned(bx);
    for (std::size_t k = 0; k < cnt; ++k) out[i + k] = bx[k];
  };
  auto load_u = [&](std::size_t i) { return Gated ? B::load_unaligned(up + i) : one; };
  // out may be x or up itself (elementwise ops allow exact aliasing): then a block is computed
  // into a buffer first, so that a block that must be redone still has its inputs.
  const bool aliased = out == x || (Gated && out == up);
  alignas(64) T buf[kBlock];
  auto put = [&](T* dst, std::size_t k, const B& y) {
    if (aliased)
      y.store_aligned(buf + k);
    else
      store_batch<Arch, T>(dst + k, y, stream);
  };

  bool careful = false;                                      // the previous block needed checked()
  std::size_t i = stream ? align_head<Arch, T>(out, n) : 0;  // streamed stores need alignment
  if (i > 0) partial(0, i);
  while (i + N <= n) {
    const std::size_t len = std::min(kBlock, (n - i) / N * N);  // whole batches
    T* dst = aliased ? buf : out + i;
    if (!careful) {
      M big(false);
      for (std::size_t k = 0; k < len; k += N)
        put(dst, k, fast(B::load_unaligned(x + i + k), load_u(i + k), &big));
      careful = (_mm_getcsr() & kFlagsMask) || xsimd::any(big);
      if (careful) _mm_setcsr(csr_clean);
    }
    if (careful) {  // (re)compute the block with the checks
      M need(false);
      for (std::size_t k = 0; k < len; k += N)
        put(dst, k, checked(B::load_unaligned(x + i + k), load_u(i + k), &need));
      careful = xsimd::any(need);
      if (!careful) _mm_setcsr(csr_clean);  // flags its subnormal results raised
    }
    if (aliased)
      for (std::size_t k = 0; k < len; k += N)
        store_batch<Arch, T>(out + i + k, B::load_aligned(buf + k), stream);
    i += len;
  }
  if (i < n) partial(i, n - i);
  stream_fence(stream);
  _mm_setcsr(csr_caller);
}

}  // namespace

// out = silu(x)          out, x: (n,); up: unused (null)
template <class Arch, class T>
void silu_kernel::operator()(Arch, T* out, const T* x, const T* up, std::size_t n,
                             bool stream) const {
  silu_body<false, Arch, T>(out, x, up, n, stream);
}

// out = silu(x) * up     out, x (the gate), up: (n,)
template <class Arch, class T>
void swiglu_kernel::operator()(Arch, T* out, const T* x, const T* up, std::size_t n,
                               bool stream) const {
  silu_body<true, Arch, T>(out, x, up, n, stream);
}

// Elementwise exp / sigmoid with the same vector code the activations use (for accuracy tests).
// The signature of silu_kernel (one driver runs all four): up is unused, stores are plain.
template <class Arch, class T>
void exp_kernel::operator()(Arch, T* out, const T* x, const T*, std::size_t n, bool) const {
  ExactSubnormals exact;
  map_unary<Arch, T>(out, x, n, [](const vec<Arch, T>& v) { return exp_flush<Arch, T>(v); });
}

template <class Arch, class T>
void sigmoid_kernel::operator()(Arch, T* out, const T* x, const T*, std::size_t n, bool) const {
  ExactSubnormals exact;
  map_unary<Arch, T>(out, x, n, [](const vec<Arch, T>& v) { return sigmoid_vec<Arch, T>(v); });
}

}  // namespace llmk
