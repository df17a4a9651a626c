// A small fork-safe thread pool for row-parallel kernels.
//
// Why not OpenMP: libgomp hangs in a forked child once the parent has used a parallel region,
// and Python's multiprocessing forks by default on Linux. This pool is rebuilt lazily in a
// forked child (pthread_atfork), so a child simply gets fresh workers.
//
// Work is split into contiguous chunks, one per thread, with chunk boundaries on multiples of a
// grain (parallel_for), or into fixed blocks handed to whichever thread is free
// (parallel_for_dynamic). Every item is computed by the same code whichever chunk it lands in,
// so results are bitwise identical for any thread count.
//
// Threads: the pool holds (configured count - 1) workers, started by set_num_threads (or on
// first use) and kept until the count changes; a job with fewer chunks than threads runs on as
// many as it has chunks. No call starts or stops a thread in steady state.
//
// Errors: an exception thrown by a chunk (std::bad_alloc, ...) on any thread is caught there;
// the job's remaining chunks are skipped, every thread leaves the job, and the first exception
// is rethrown in the calling thread. Nothing escapes a worker (which would std::terminate).
#pragma once

#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

namespace llmk {

// Upper bound of set_num_threads (and of LLMKERNELS_NUM_THREADS): far more threads than any
// machine this runs on has cores, and few enough that starting them all stays cheap.
constexpr int kMaxThreads = 1024;

// A non-owning reference to a callable (no allocation, unlike std::function): parallel regions
// are entered on every kernel call, and a std::function holding a lambda with several captures
// would allocate each time -- an allocation that could fail after a kernel began writing.
template <class Sig>
class function_ref;
template <class R, class... A>
class function_ref<R(A...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, function_ref>>>
  function_ref(F&& f) noexcept  // NOLINT(google-explicit-constructor)
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, A... a) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<A>(a)...);
        }) {}
  R operator()(A... a) const { return call_(obj_, std::forward<A>(a)...); }

 private:
  void* obj_;
  R (*call_)(void*, A...);
};

int get_num_threads();
// 1 <= n <= kMaxThreads (the binding checks). Starts the workers now; if the system refuses
// to start them all (std::system_error: thread limit, memory), the ones started are stopped,
// the previous count stays, and std::runtime_error("[set_num_threads] ...") is thrown.
void set_num_threads(int n);

// Runs fn(begin, end) over [0, n). Runs inline (one chunk) when n * cost_per_item is below
// the parallel threshold, when one thread is configured, or when called from a pool worker.
void parallel_for(std::size_t n, std::size_t grain, double cost_per_item,
                  function_ref<void(std::size_t, std::size_t)> fn);

// Runs fn(begin, end) over [0, n) in blocks of `block` items (the last one shorter), each block
// taken, in order, by whichever thread is free next (an atomic counter); inline under
// parallel_for's conditions. For loops bound by memory bandwidth, where threads sharing the
// memory system do not progress at the same rate and a fixed split waits for the slower one.
// fn must compute every item the same way whichever block and thread run it: results then do
// not depend on the schedule.
void parallel_for_dynamic(std::size_t n, std::size_t block, double cost_per_item,
                          function_ref<void(std::size_t, std::size_t)> fn);

// Runs fn(k, chunks) for every k in [0, chunks) on the configured pool: at most `chunks`
// threads (the caller included) take part; fewer when fewer are configured. Never changes
// the pool.
void parallel_chunks(int chunks, function_ref<void(int, int)> fn);

// fn(k, threads) on exactly `threads` concurrently running threads (the roofline probes of the
// benchmarks): the configured pool when it is large enough, else a pool started for this call
// only. Kernels use parallel_chunks.
void parallel_for_threads(int threads, function_ref<void(int, int)> fn);

}  // namespace llmk
