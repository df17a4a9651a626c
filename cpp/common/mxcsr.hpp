// Subnormal operands are numbers like any other (no DAZ on operands): code whose
// result must follow the float64 reference for subnormal inputs (the kernels, and the parts of
// the attention driver that run outside them) runs with MXCSR's DAZ (denormals are zero) and
// FTZ (flush to zero) bits clear, whatever the calling thread set (torch.set_flush_denormal(True),
// -ffast-math startup code of another library...). Reading MXCSR costs a few cycles; it is
// written only when one of the bits is set, and restored. Speed on normal data comes from never
// forming subnormal intermediates there (see exp_flush), not from flushing them.
#pragma once

#include <xmmintrin.h>

namespace llmk {
// Internal linkage: each per-ISA translation unit compiles its own copy with its own flags (an
// inline function shared across ISA units could be linked as the AVX copy into the SSE2 path).
namespace {

class ExactSubnormals {
 public:
  ExactSubnormals() : saved_(_mm_getcsr()) {
    if (saved_ & kFlushBits) _mm_setcsr(saved_ & ~kFlushBits);
  }
  ~ExactSubnormals() {
    if (saved_ & kFlushBits) _mm_setcsr(saved_);
  }
  ExactSubnormals(const ExactSubnormals&) = delete;
  ExactSubnormals& operator=(const ExactSubnormals&) = delete;

 private:
  static constexpr unsigned kFlushBits = 0x8040;  // FTZ (bit 15) | DAZ (bit 6)
  unsigned saved_;
};

}  // namespace
}  // namespace llmk
