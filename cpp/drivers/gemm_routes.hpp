// The GEMM routes (drivers/gemm_routes.cpp): the dense matrix products behind every projection
// and the choice among them by shape and by the forced route. The bottom driver: no other driver
// is called from it; drivers/qlinear.hpp and drivers/linear.hpp call it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/thread_pool.hpp"  // function_ref
#include "kernels/ops.hpp"

namespace llmk {

// How W is stored: (n, k) row-major as HF checkpoints store projections (y = x . W^T), or
// (k, n) row-major as the functional API takes it (y = x . W).
enum class WeightLayout { out_in, in_out };

// y (m, n) [+]= x (m, k) . W [+ bias (n,) or null]; y has row stride n. accumulate: add to y
// instead of overwriting it. Work is split into blocks chosen from the shape only (each one
// single-threaded BLAS call or kernel call), so results do not depend on the thread count.
// The bias is added where y is written: in the final stores of the gemv / gemm_xt kernels, or
// as the C operand (beta = 1) of each BLAS block, written just before the block's call.
template <class T>
void linear(const T* x, std::size_t m, std::size_t k, const T* w, WeightLayout layout,
            std::size_t n, const T* bias, T* y, bool accumulate);

// Which matrix product linear<T> uses. automatic picks by shape (the crossovers measured in
// benchmarks/bench_gemm.py, drivers/gemm_routes.cpp); the others force one product wherever it
// applies (tests sweep them; the benchmark compares them in one run): blas = OpenBLAS
// sgemm/dgemm in blocks of rows (or of columns for few rows), packed = gemm_packed_kernel (both
// operands packed), tokens = gemm_xt_kernel (x packed, (out, in) weights read in place; (in,
// out) weights take the automatic choice). Process-wide; not for concurrent use with other calls.
enum class GemmRoute : int { automatic = 0, blas = 1, packed = 2, tokens = 3 };
void set_gemm_route(GemmRoute route);
GemmRoute gemm_route();

// y (m, n) [+]= x (m, k) . W^T [+ bias (n,) or null], W (n, k) 16-bit (w.format bf16 / f16),
// converted in registers (kernels/weight16.hpp): matrix-vector products up to 8 tokens, above
// that the packed GEMM with a converting weight pack (gemm_packed_w_kernel,
// kernels/gemm_packed_w.hpp: the float32 kernel's bits on the widened matrix; on AVX-512, not
// measured there yet, packed tokens (gemm_xt_w16) below 512 and widened blocks for the BLAS from
// 512); bfloat16 prefill on vdpbf16ps where the CPU has it. Results do not depend on the thread
// count. The 16-bit branch of linear(WeightRef) (drivers/linear.hpp).
void linear_w16(const float* x, std::size_t m, std::size_t k, WeightRef w, std::size_t n,
                const float* bias, float* y, bool accumulate);

// A decode GEMV's thread split: fn(r0, r1) over [0, rows) in blocks of about 1 MiB of the
// matrix (rows of row_bytes each; at least 2 blocks per thread, a multiple of 16 rows), taken by
// whichever thread is free (parallel_for_dynamic; cost_per_row: its serial cutoff). Each row's
// arithmetic does not depend on its block, so neither do the results.
void decode_split(std::size_t rows, std::size_t row_bytes, double cost_per_row,
                  function_ref<void(std::size_t, std::size_t)> fn);

// Whether a projection of m tokens with weights in `format` (16-bit or quantized, float
// activations) takes the packed GEMM (the route, the ISA and m decide; never up to 8 tokens), and
// that product itself: y (m, n) [+]= x (m, k) . W^T [+ bias], W (n, k) any WeightRef (for
// drivers/qlinear.cpp's qlinear). Results do not depend on the thread count.
bool packed_route_w(std::size_t m, WeightFormat format);
void linear_packed_w(const float* x, std::size_t m, std::size_t k, const WeightRef& w,
                     std::size_t n, const float* bias, float* y, bool accumulate);

}  // namespace llmk
