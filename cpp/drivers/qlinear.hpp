// The group-wise int8 / int4 weight format (docs/quantization.md) as plain C++ (no Python): the
// quantizer, its inverse and the quantized projection. drivers/qlinear.cpp defines them; the
// Python functions lk.quantize / dequantize / quantized_linear (ops/quant.cpp) and the modules'
// projection path (drivers/linear.cpp, weights stored as WeightFormat::q8 / q4) both call them,
// so a module's int8 matrix gives the bits and the products of the functional API. They call
// down to drivers/gemm_routes.hpp only (never drivers/linear.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/quant_types.hpp"

namespace llmk {

// The outcome of quantize_rows: code 0 fine, 1 a non-finite weight, 2 a scale beyond float16
// (first failing row and group, and that group's max |w| for code 2).
struct QuantStatus {
  std::uint8_t code = 0;
  std::size_t row = 0, group = 0;
  float amax = 0.f;
};

// The message of a failed QuantStatus (for "[fn] " + message).
std::string quant_status_message(const QuantStatus& st, int bits);

// Quantizes w (rows, k) float32, k % group == 0: codes into q (rows, k) int8 codes for bits 8,
// (rows, k / 2) nibbles for bits 4; scales (rows, k / group) float16 bits. Threaded over rows;
// the bits do not depend on the thread count. Call without the GIL; never throws for bad
// values (the status says which row failed; q and scales are then partly written).
QuantStatus quantize_rows(const float* w, std::size_t rows, std::size_t k, std::size_t group,
                          int bits, std::uint8_t* q, std::uint16_t* scales);

// out (w.rows, w.k) float32 = code * scale (exact). Threaded over rows.
void dequantize_rows(const qweights& w, int bits, float* out);

// AMX's tile layout of int8 weights (qweights::tiles): the AMX kernel (kernels/quant_vnni.hpp)
// reads 16 rows x one block of 32 codes as one B tile, 8 quadruple rows of 16 rows x 4 codes,
// and the small-batch GEMV beside it takes the same 64 bytes as one vector (4 codes of each of
// 16 rows). Stored that way, a call does not repack the weights (a batched decode step of up to
// 16 tokens spent most of its time doing so). tile_int8: codes (rows, k) int8 and scales (rows,
// k / group) float16, rows % 16 == 0, into qdst / sdst in the tile layout (per group of 16 rows:
// codes [block][8 quadruple rows][16 rows][4], scales [scale group][16 rows]); inverse: back.
// Threaded over groups of 16 rows.
void tile_int8(const std::uint8_t* q, const std::uint16_t* scales, std::size_t rows,
               std::size_t k, std::size_t group, std::uint8_t* qdst, std::uint16_t* sdst,
               bool inverse);
// int8 weights stored in the tile layout serve the projections of the current int8 dot product
// (the AMX one or its emulated twin, common/dot.hpp)
bool int8_tiles_wanted();

// y (m, w.rows) [+]= x (m, w.k) . W_deq^T [+ bias]: up to 8 tokens the GEMV kernels reading the
// codes in place (int8_acts: the tokens quantized per block of 32, llama.cpp's q8_0; otherwise
// float activations), above the tile GEMM (float activations). Threaded over blocks of rows
// fixed by the shape: results do not depend on the thread count. Call without the GIL.
void qlinear(const float* x, std::size_t m, const qweights& w, int bits, const float* bias,
             float* y, bool accumulate, bool int8_acts);

}  // namespace llmk
