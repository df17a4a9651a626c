// The projection router, y = x . W^T (+ bias) on a WeightRef: float32 weights to linear<float>,
// 16-bit ones to linear_w16 (drivers/gemm_routes.hpp), int8 / int4 ones to qlinear
// (drivers/qlinear.hpp); and the SwiGLU feed-forward of the functional API on linear<T>. The top
// of the driver stack: it calls qlinear and the GEMM routes, and nothing calls back into it from
// there (linear -> qlinear -> gemm_routes, linear -> gemm_routes).
#include "drivers/linear.hpp"

#include <cstdint>

#include "common/thread_pool.hpp"
#include "drivers/qlinear.hpp"
#include "kernels/ops.hpp"

namespace llmk {

void linear(const float* x, std::size_t m, std::size_t k, WeightRef w, std::size_t n,
            const float* bias, float* y, bool accumulate) {
  if (w.format == WeightFormat::f32) {
    linear<float>(x, m, k, static_cast<const float*>(w.data), WeightLayout::out_in, n, bias, y,
                  accumulate);
    return;
  }
  if (m == 0 || n == 0) return;
  if (is_quantized(w.format)) {
    const qweights qw{static_cast<const std::uint8_t*>(w.data), w.scales, n, k, w.group,
                      w.tiles};
    qlinear(x, m, qw, w.format == WeightFormat::q8 ? 8 : 4, bias, y, accumulate,
            /*int8_acts=*/true);
    return;
  }
  linear_w16(x, m, k, w, n, bias, y, accumulate);
}

namespace {
template <class K, class T>
void gated_rows(K kernel, T* act, const T* gate, const T* up, std::size_t m, std::size_t h,
                std::size_t ld) {
  if (ld == h) {  // contiguous rows: one flat map, chunks on multiples of 64 elements
    parallel_for(m * h, 64, 4.0, [&](std::size_t b, std::size_t e) {
      dispatch(kernel, act + b, gate + b, up + b, e - b, false);
    });
    return;
  }
  parallel_for(m, 1, 4.0 * h, [&](std::size_t b, std::size_t e) {
    for (std::size_t r = b; r < e; ++r)
      dispatch(kernel, act + r * h, gate + r * ld, up + r * ld, h, false);
  });
}
}  // namespace

template <class T>
void swiglu_rows(T* act, const T* gate, const T* up, std::size_t m, std::size_t h, std::size_t ld,
                 bool gelu_tanh) {
  if (gelu_tanh)
    gated_rows(geglu_kernel{}, act, gate, up, m, h, ld);
  else
    gated_rows(swiglu_kernel{}, act, gate, up, m, h, ld);
}

template <class T>
void swiglu_ffn(const T* x, std::size_t m, std::size_t k, const T* w_gate, const T* w_up,
                std::size_t h, const T* w_down, std::size_t n, const T* b_gate, const T* b_up,
                const T* b_down, T* gate, T* up, T* out) {
  linear<T>(x, m, k, w_gate, WeightLayout::in_out, h, b_gate, gate, false);  // gate: (m, h)
  linear<T>(x, m, k, w_up, WeightLayout::in_out, h, b_up, up, false);        // up:   (m, h)
  swiglu_rows<T>(gate, gate, up, m, h, h);  // hidden = silu(gate) * up, in place in gate
  if (w_down) linear<T>(gate, m, h, w_down, WeightLayout::in_out, n, b_down, out, false);
}

#define LLMK_LINEAR_INSTANTIATE(T)                                                                 \
  template void swiglu_rows<T>(T*, const T*, const T*, std::size_t, std::size_t, std::size_t,      \
                               bool);                                                              \
  template void swiglu_ffn<T>(const T*, std::size_t, std::size_t, const T*, const T*, std::size_t, \
                              const T*, std::size_t, const T*, const T*, const T*, T*, T*, T*);
LLMK_LINEAR_INSTANTIATE(float)
LLMK_LINEAR_INSTANTIATE(double)

}  // namespace llmk
