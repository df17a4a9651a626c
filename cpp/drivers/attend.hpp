// Attention driver (drivers/attend.cpp): splits the work into tiles, runs them on the thread
// pool, merges key splits. Called by the attention op (ops/attention.cpp) and the attention
// module (modules/modules.cpp); no Python.
#pragma once

#include "kernels/ops.hpp"

namespace llmk {

template <class T>
void attention(const attn_params<T>& p);

}  // namespace llmk
