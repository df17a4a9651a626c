// A small fork-safe thread pool for row-parallel kernels.
//
// Why not OpenMP: libgomp hangs in a forked child once the parent has used a parallel region,
// and Python's multiprocessing forks by default on Linux. This pool is rebuilt lazily in a
// forked child (pthread_atfork), so a child simply gets fresh workers.
//
// Work is split into contiguous chunks, one per thread, with chunk boundaries on multiples of a
// grain. Every item is computed by the same code whichever chunk it lands in, so results are
// bitwise identical for any thread count.
#pragma once

#include <cstddef>
#include <functional>

namespace llmk {

int get_num_threads();
void set_num_threads(int n);  // n >= 1 (OpenBLAS itself always runs single-threaded)

// Runs fn(begin, end) over [0, n). Runs inline (one chunk) when n * cost_per_item is below
// the parallel threshold, when one thread is configured, or when called from a pool worker.
void parallel_for(std::size_t n, std::size_t grain, double cost_per_item,
                  const std::function<void(std::size_t, std::size_t)>& fn);

// The same with an explicit number of chunks (used by the bandwidth probe).
void parallel_for_threads(int threads, const std::function<void(int, int)>& fn);

}  // namespace llmk
