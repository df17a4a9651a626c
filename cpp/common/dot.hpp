// Dot-product extensions beyond the xsimd ISA list (common/isa_list.hpp): instructions xsimd 8.1
// has no architecture for, used by a few kernels through intrinsics in their own translation
// units (cpp/arch/dot_*.cpp, each built with its flags).
//
// Int8Dot: the int8 x int8 -> int32 product of the int8-activation prefill of int8 / int4
// weights (kernels/quant_vnni.hpp):
//   vnni        vpdpbusd, AVX512_VNNI + AVX512VL (Intel Ice Lake / Sapphire Rapids and later,
//               AMD Zen 4 and later); chosen automatically when the CPU has it and the active
//               xsimd path is avx512 (LLMKERNELS_ARCH=avx2 or sse2 turns it off).
//   vnni512     the same arithmetic on 512-bit vpdpbusd, two rows per vector (bit for bit
//               vnni); chosen instead of vnni where the CPU's vector units are 512 bits wide
//               (AMD Zen 5, Intel), not on Zen 4, which splits 512-bit operations in two.
//   vnni512_simde  its SIMDe twin (test path, never automatic).
//   vnni_simde  the same source compiled on the AVX2 baseline against SIMDe's portable
//               vpdpbusd: slow, never chosen automatically; it lets the test suite run the VNNI
//               kernel, and compare it bit for bit, on any AVX2 host.
//   amx         AMX's tdpbssd on tiles (Intel Sapphire Rapids and later; kernels/amx.hpp), one
//               block's sums for 16 tokens x 16 rows per instruction, then the same float
//               arithmetic: bit for bit the same results; chosen automatically before vnni
//               where the CPU has it and Linux grants the tile state.
//   amx_emu     the AMX kernel on emulated tiles (test path, never automatic).
//   avx2        the same kernel with its integer side on AVX2's maddubs + madd (the sign trick
//               for int8 weights, unsigned nibbles for int4), for CPUs without VNNI: chosen
//               automatically where the active xsimd path is avx2 (or avx512 without VNNI).
//   none        the existing paths (the float-activation packed GEMM for prefill).
// LLMKERNELS_INT8_DOT=none|vnni|vnni_simde|amx|amx_emu|avx2|vnni512|vnni512_simde forces one
// (the native ones only where the CPU has them).
//
// Bf16Dot: the bf16 x bf16 -> float32 product of the prefill of bfloat16 weights
// (kernels/gemm_bf16.hpp; the activations rounded to bfloat16):
//   avx512bf16  vdpbf16ps (Intel Cooper Lake / Sapphire Rapids and later, AMD Zen 4 and later);
//               chosen automatically as vnni is.
//   bf16_simde  the same source against SIMDe (test path, never automatic).
//   amx         AMX's tdpbf16ps on tiles (Intel Sapphire Rapids and later; kernels/amx.hpp): the
//               same numbers, 16 x 16 x 32 multiply-adds per instruction; chosen automatically
//               before avx512bf16 where the CPU has it and Linux grants the tile state.
//   amx_emu     the AMX kernel on the emulated tiles of kernels/amx.hpp (test path, never
//               automatic).
//   none        the float32 packed GEMM on the widened weights (bit for bit the float32 model of
//               the bf16-rounded weights).
// LLMKERNELS_BF16_DOT=none|avx512bf16|bf16_simde|amx|amx_emu forces one.
#pragma once

#include <string>
#include <vector>

#include "kernels/quant_types.hpp"

namespace llmk {

enum class Int8Dot : int {
  none = 0, vnni = 1, vnni_simde = 2, amx = 3, amx_emu = 4, avx2 = 5, vnni512 = 6,
  vnni512_simde = 7
};
// the portable twins of the native paths (SIMDe / emulated tiles: the same bits, any AVX2 host)
inline bool int8_dot_is_twin(Int8Dot d) {
  return d == Int8Dot::vnni_simde || d == Int8Dot::amx_emu || d == Int8Dot::vnni512_simde;
}
inline bool int8_dot_is_native(Int8Dot d) {  // (avx2 excepted: the AVX2 code is its own GEMV)
  return d == Int8Dot::vnni || d == Int8Dot::amx || d == Int8Dot::vnni512;
}

bool cpu_has_avx512_vnni();           // AVX512_VNNI and AVX512VL (cpuid), and OS-enabled AVX-512
Int8Dot int8_dot();                   // the one int8 prefill uses now
void set_int8_dot(Int8Dot dot);       // forced (vnni clamped to none without the CPU support)
void set_int8_dot_auto();             // back to the automatic choice
const char* int8_dot_name(Int8Dot dot);
std::vector<std::string> int8_dot_names();  // every value, by number
bool parse_int8_dot(const std::string& name, Int8Dot* dot);
bool int8_dot_available(Int8Dot dot);  // runnable here (vnni_simde: built with SIMDe)

enum class Bf16Dot : int { none = 0, avx512bf16 = 1, bf16_simde = 2, amx = 3, amx_emu = 4 };

bool cpu_has_avx512_bf16();  // AVX512_BF16 (cpuid 7.1 eax bit 5) and OS-enabled AVX-512
bool cpu_has_amx();          // AMX-TILE / BF16 / INT8, AVX512_BF16, and the OS's tile state
Bf16Dot bf16_dot();
void set_bf16_dot(Bf16Dot dot);  // forced (avx512bf16 clamped to none without the CPU support)
void set_bf16_dot_auto();
const char* bf16_dot_name(Bf16Dot dot);
std::vector<std::string> bf16_dot_names();
bool parse_bf16_dot(const std::string& name, Bf16Dot* dot);
bool bf16_dot_available(Bf16Dot dot);

namespace dot {
// y (m, rows) (+)= x . W_deq^T (+ bias) with int8 activations prepared as for the AVX2 GEMV
// (qgemv_args.act; for int8 weights also act.xi and act.sx8), any m: kernels/quant_vnni.hpp
// natively / against SIMDe. int8 weights are repacked kVnniRowBlock rows at a time into `pack`
// (vnni_pack_bytes(k) bytes, one per concurrent call; unused for int4).
constexpr std::size_t kVnniRowBlock = 64;                 // rows per repacked block
constexpr std::size_t kVnniChunkBytes = 8 * kQBlock;      // the codes of 8 blocks
constexpr std::size_t kVnniPackChunk = kVnniChunkBytes + 64;  // + 8 int32 offsets, 8 scales
inline std::size_t vnni_chunks(std::size_t k) { return (k / kQBlock + 7) / 8; }
inline std::size_t vnni_pack_bytes(std::size_t k) {
  return kVnniRowBlock * vnni_chunks(k) * kVnniPackChunk;
}
// the kernel of `dot` (not none; common/dot.cpp calls the build that has it)
void qgemm_int8_acts(Int8Dot dot, const qgemv_args& a, int bits, std::uint8_t* pack);
// the AMX kernel (kernels/quant_vnni.hpp), natively / on emulated tiles: the same contract, any
// number of rows, with a pack of amx_int8_pack_bytes(k) bytes; act.xi holds the codes in 16-token
// tiles instead, [ceil(m / 32) * 2 tiles][block][16 tokens][32] (tokens past m zero)
inline std::size_t amx_int8_pack_bytes(std::size_t k) {
  const std::size_t nb = k / kQBlock;
  return kVnniRowBlock * k + 256 * nb + 256 * (16 * nb + 16);  // codes, scales, C sums
}
inline std::size_t int8_pack_bytes(Int8Dot dot, std::size_t k) {
  return dot == Int8Dot::amx || dot == Int8Dot::amx_emu ? amx_int8_pack_bytes(k)
                                                          : vnni_pack_bytes(k);
}
// Roofline probes of the instructions (native units only: call where the CPU has them):
// operations done by `iterations` rounds of 12 independent chains
double probe_vpdpbusd(std::size_t iterations, int* sink);
double probe_vdpbf16ps(std::size_t iterations, float* sink);
double probe_amx(bool int8, std::size_t iterations, float* sink);  // tdpbssd / tdpbf16ps
double probe_maddubs(std::size_t iterations, int* sink);  // AVX2's int8 mix (any AVX2 CPU)
// (avx2: the same kernel on AVX2's maddubs, cpp/arch/dot_avx2.cpp; act.xi holds the codes as
// they are -- signed, not + 128 -- and for int4 weights act.xs8 8 * each block's sum, as for
// the AVX2 GEMV)
// decode: the int8-weight GEMV (m <= 16) with each block's sum on vpdpbusd, natively / against
// SIMDe -- bit for bit the AVX2 GEMV; act.xs128 as qacts says
// (twin: the SIMDe build)
void qgemv_int8_vnni(bool twin, const qgemv_args& a);
// the int4-weight GEMV likewise (act.q4 / act.xs8 as for the AVX2 one)
void qgemv_int4_vnni(bool twin, const qgemv_args& a);

// kernels/gemm_bf16.hpp: xb (m, kp) = x rounded to bfloat16, row stride ldxb >= kp (kp = k
// rounded up to bf16_k_multiple(dot), the pad 0; bf16_x_stride: the stride the driver takes;
// the AMX kernel also reads (zero) rows up to m rounded up to bf16_m_multiple(dot)); one
// column block y (m, nc) (+)= xb . w (nc, k)^T (+ bias), nc <= kBf16BlockCols, with
// kBf16PackWords words of scratch
constexpr std::size_t kBf16BlockCols = 256;
inline bool bf16_dot_is_amx(Bf16Dot dot) { return dot == Bf16Dot::amx || dot == Bf16Dot::amx_emu; }
inline std::size_t bf16_k_multiple(Bf16Dot dot) { return bf16_dot_is_amx(dot) ? 32 : 2; }
inline std::size_t bf16_m_multiple(Bf16Dot dot) { return bf16_dot_is_amx(dot) ? 32 : 1; }
constexpr std::size_t kBf16PackWords = kBf16BlockCols * 512 / 2;
// The row stride of xb for kp elements: kp, or kp + 32 where kp's 2 * kp bytes are a multiple
// of 1 KiB. The vdpbf16ps tile reads one word of 12 rows at a time; 12 rows 4 KiB apart (k =
// 2048, the most common width) fall in one set of the 8-way L1D, and each evicts the others'
// lines before their next use. Zen 4, one layer's seven projections of the TinyLlama-1.1B shape
// at 512 tokens (weights from DRAM), GFLOP/s at 1 / 2 threads: 127-142 / 227-229 at stride kp,
// 160-165 / 291-314 padded (vdpbf16ps probe ~210 / ~400).
inline std::size_t bf16_x_stride(std::size_t kp) { return (2 * kp) % 1024 == 0 ? kp + 32 : kp; }
void round_x_bf16(Bf16Dot dot, std::uint16_t* xb, std::size_t kp, std::size_t ldxb, const float* x,
                  std::size_t ldx, std::size_t m, std::size_t k);
void gemm_bf16_block(Bf16Dot dot, float* y, std::size_t ldy, const std::uint16_t* xb,
                     std::size_t kp, std::size_t ldxb, std::size_t m, const std::uint16_t* w,
                     std::size_t k, std::size_t nc, bool accumulate, const float* bias,
                     std::uint32_t* wpack);
}  // namespace dot

}  // namespace llmk
