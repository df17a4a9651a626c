// Attention driver: splits the work into tiles, runs them on the thread pool, merges key splits.
#pragma once

#include "kernels/ops.hpp"

namespace llmk {

template <class T>
void attention(const attn_params<T>& p);

}  // namespace llmk
