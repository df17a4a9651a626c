// Attention driver (ops/attention.cpp): splits the work into tiles, runs them on the thread
// pool, merges key splits. Called by the attention op and the attention module.
#pragma once

#include "kernels/ops.hpp"

namespace llmk {

template <class T>
void attention(const attn_params<T>& p);

}  // namespace llmk
