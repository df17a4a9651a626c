// The one place RoPE cos/sin tables are computed (the rope op's tables in the bindings and the
// attention module's per-token rows both call this, so they agree bitwise).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace llmk {

// c[j] = cos(pos * inv_freq[j]) * factor, s[j] = sin(...) * factor for j < half. The angle is
// formed and reduced in double (exact for positions up to 2^53), then rounded to T.
template <class T>
inline void rope_table_row(std::int64_t pos, const double* inv_freq, std::size_t half,
                           double factor, T* c, T* s) {
  const double p = static_cast<double>(pos);
  for (std::size_t j = 0; j < half; ++j) {
    const double angle = p * inv_freq[j];
    c[j] = static_cast<T>(std::cos(angle) * factor);
    s[j] = static_cast<T>(std::sin(angle) * factor);
  }
}

}  // namespace llmk
