#include "ffn.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstring>

#include "common/isa.hpp"
#include "common/thread_pool.hpp"
#include "kernels/ops.hpp"

namespace llmk {

namespace {

void gemm_block(const float* a, const float* b, float* c, std::size_t m, std::size_t k,
                std::size_t n, std::size_t ldb, std::size_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k,
              b, (int)ldb, 0.0f, c, (int)ldc);
}
void gemm_block(const double* a, const double* b, double* c, std::size_t m, std::size_t k,
                std::size_t n, std::size_t ldb, std::size_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0, a, (int)k,
              b, (int)ldb, 0.0, c, (int)ldc);
}

// Fixed block sizes: the partition of C into blocks does not depend on the thread count, and
// each block is one single-threaded BLAS call, so results are bitwise identical for any number
// of threads (OpenBLAS's own threading splits work differently per thread count).
constexpr std::size_t kRowBlock = 128;
constexpr std::size_t kColBlock = 256;

}  // namespace

template <class T>
void matmul(const T* a, const T* b, T* c, std::size_t m, std::size_t k, std::size_t n) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty inner dimension: the product is all zeros
    std::memset(c, 0, m * n * sizeof(T));
    return;
  }
  const double flops_per_row = 2.0 * static_cast<double>(k) * static_cast<double>(n);
  if (m >= 2 * kRowBlock) {  // prefill-sized: blocks of rows
    std::size_t blocks = (m + kRowBlock - 1) / kRowBlock;
    parallel_for(blocks, 1, flops_per_row * kRowBlock, [&](std::size_t b0, std::size_t b1) {
      for (std::size_t blk = b0; blk < b1; ++blk) {
        std::size_t r0 = blk * kRowBlock, r1 = std::min(m, r0 + kRowBlock);
        gemm_block(a + r0 * k, b, c + r0 * n, r1 - r0, k, n, n, n);
      }
    });
  } else {  // few rows (decode): blocks of columns
    std::size_t blocks = (n + kColBlock - 1) / kColBlock;
    parallel_for(blocks, 1, flops_per_row * static_cast<double>(m) / n * kColBlock,
                 [&](std::size_t b0, std::size_t b1) {
                   for (std::size_t blk = b0; blk < b1; ++blk) {
                     std::size_t c0 = blk * kColBlock, c1 = std::min(n, c0 + kColBlock);
                     gemm_block(a, b + c0, c + c0, m, k, c1 - c0, n, n);
                   }
                 });
  }
}

template void matmul<float>(const float*, const float*, float*, std::size_t, std::size_t,
                            std::size_t);
template void matmul<double>(const double*, const double*, double*, std::size_t, std::size_t,
                             std::size_t);

namespace {

template <class T>
void add_bias_rows(T* c, const T* bias, std::size_t m, std::size_t n) {
  if (!bias) return;
  parallel_for(m, 1, static_cast<double>(n), [&](std::size_t b, std::size_t e) {
    dispatch(add_bias_kernel{}, c + b * n, bias, e - b, n);
  });
}

}  // namespace

template <class T>
void swiglu_ffn(const T* x, std::size_t m, std::size_t k, const T* w_gate, const T* w_up,
                std::size_t h, const T* w_down, std::size_t n, const T* b_gate, const T* b_up,
                const T* b_down, T* gate, T* up, T* out) {
  matmul<T>(x, w_gate, gate, m, k, h);  // gate: (m, h)
  matmul<T>(x, w_up, up, m, k, h);      // up:   (m, h)
  add_bias_rows<T>(gate, b_gate, m, h);
  add_bias_rows<T>(up, b_up, m, h);
  // hidden = silu(gate) * up, in place in gate
  std::size_t total = m * h;
  parallel_for(total, 64, 1.0, [&](std::size_t b, std::size_t e) {
    dispatch(silu_kernel<true>{}, gate + b, gate + b, up + b, e - b, false);
  });
  if (w_down) {
    matmul<T>(gate, w_down, out, m, h, n);  // out: (m, n)
    add_bias_rows<T>(out, b_down, m, n);
  }
}

template void swiglu_ffn<float>(const float*, std::size_t, std::size_t, const float*,
                                const float*, std::size_t, const float*, std::size_t,
                                const float*, const float*, const float*, float*, float*, float*);
template void swiglu_ffn<double>(const double*, std::size_t, std::size_t, const double*,
                                 const double*, std::size_t, const double*, std::size_t,
                                 const double*, const double*, const double*, double*, double*,
                                 double*);

}  // namespace llmk
