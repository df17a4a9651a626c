#include "common/thread_pool.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace llmk {
namespace {

// Below this many "element operations" the wake-up cost of a worker (~5-20 us) outweighs the gain.
constexpr double kParallelThreshold = 1 << 16;

thread_local bool t_in_worker = false;

// Waiting: spin briefly (new work or completion usually arrives within microseconds in a
// sequence of kernel calls), then sleep on a condition variable. The spin saves a futex wake-up
// per parallel region, which costs tens of microseconds in a VM.
constexpr int kSpinIterations = 4000;

inline void cpu_relax() { __builtin_ia32_pause(); }

// Chunks are claimed, not assigned: the caller and every awake worker take the next unclaimed
// chunk until none is left. A worker that is not running when a job starts (asleep, or
// descheduled because other runtimes' spinning threads -- torch's OpenMP, NumPy's OpenBLAS --
// share the cores) then costs nothing: the caller runs its chunks. Which thread runs a chunk
// does not change the result (chunk bounds depend only on the job).
class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
      generation_.fetch_add(1, std::memory_order_release);
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  // Runs job(k, chunks) once for every k in [0, chunks), on the caller and the workers.
  void run(int chunks, const std::function<void(int, int)>& job) {
    std::lock_guard<std::mutex> serial(run_mutex_);  // one parallel job at a time
    std::uint32_t gen;
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &job;
      chunks_ = chunks;
      done_.store(0, std::memory_order_relaxed);
      gen = static_cast<std::uint32_t>(generation_.fetch_add(1, std::memory_order_release) + 1);
      ticket_.store(std::uint64_t{gen} << 32, std::memory_order_release);
    }
    cv_.notify_all();
    t_in_worker = true;
    run_chunks(gen, job, chunks);
    t_in_worker = false;
    for (int i = 0; i < kSpinIterations && done_.load(std::memory_order_acquire) != chunks; ++i)
      cpu_relax();
    if (done_.load(std::memory_order_acquire) != chunks) {
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire) == chunks; });
    }
  }

 private:
  // Claims and runs chunks of job `gen` until none is left; a ticket is (generation << 32 |
  // next chunk), so a late worker cannot claim a chunk of a later job with an earlier job's
  // pointer. Returns after counting each chunk it ran in done_.
  void run_chunks(std::uint32_t gen, const std::function<void(int, int)>& job, int chunks) {
    for (;;) {
      std::uint64_t t = ticket_.load(std::memory_order_acquire);
      do {
        if ((t >> 32) != gen || static_cast<int>(t & 0xffffffffu) >= chunks) return;
      } while (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel));
      job(static_cast<int>(t & 0xffffffffu), chunks);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
        std::lock_guard<std::mutex> lk(m_);
        done_cv_.notify_one();
      }
    }
  }

  void worker_loop() {
    t_in_worker = true;
    unsigned long seen = 0;
    for (;;) {
      for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen;
           ++i)
        cpu_relax();
      const std::function<void(int, int)>* job;
      int chunks;
      {
        // the job's fields are read under the mutex, together with the generation they belong to
        std::unique_lock<std::mutex> lk(m_);
        cv_.wait(lk, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
        if (stop_) return;
        seen = generation_.load(std::memory_order_relaxed);
        job = job_;
        chunks = chunks_;
      }
      run_chunks(static_cast<std::uint32_t>(seen), *job, chunks);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int, int)>* job_ = nullptr;
  int chunks_ = 0;
  std::atomic<int> done_{0};
  std::atomic<std::uint64_t> ticket_{0};
  std::atomic<unsigned long> generation_{0};
  bool stop_ = false;
};

int default_threads() {
  if (const char* env = std::getenv("LLMKERNELS_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n >= 1) return n;
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

std::mutex g_config_mutex;
std::atomic<int> g_num_threads{0};  // 0 = not yet initialised
// Created lazily; shared with every running job, so replacing it (set_num_threads) never
// destroys a pool another thread is still using: the last user releases it.
std::shared_ptr<Pool> g_pool;

void after_fork_in_child() {
  // The workers do not exist in the child. Forget the pool without destroying it (joining
  // threads that do not exist would hang; its mutexes may be in any state): leak it on purpose,
  // and build a new one on first use.
  new std::shared_ptr<Pool>(std::move(g_pool));
  g_pool.reset();
  new (&g_config_mutex) std::mutex();
}

int ensure_threads() {
  int n = g_num_threads.load();
  if (n == 0) {
    static std::once_flag once;
    std::call_once(once, [] { pthread_atfork(nullptr, nullptr, after_fork_in_child); });
    // OpenBLAS runs single-threaded inside our pool's blocks (cpp/ffn.cpp): its own threads
    // would oversubscribe the cores and make results depend on the thread count.
    openblas_set_num_threads(1);
    int expected = 0;
    g_num_threads.compare_exchange_strong(expected, default_threads());
    n = g_num_threads.load();
  }
  return n;
}

std::shared_ptr<Pool> pool_for(int threads) {
  std::lock_guard<std::mutex> lk(g_config_mutex);
  if (!g_pool || g_pool->workers() != threads - 1) g_pool = std::make_shared<Pool>(threads - 1);
  return g_pool;
}

}  // namespace

int get_num_threads() { return ensure_threads(); }

void set_num_threads(int n) {
  ensure_threads();
  g_num_threads.store(std::max(1, n));
}

void parallel_for_threads(int threads, const std::function<void(int, int)>& fn) {
  if (threads <= 1 || t_in_worker) {
    fn(0, 1);
    return;
  }
  pool_for(threads)->run(threads, fn);
}

void parallel_for(std::size_t n, std::size_t grain, double cost_per_item,
                  const std::function<void(std::size_t, std::size_t)>& fn) {
  if (n == 0) return;
  int threads = ensure_threads();
  grain = std::max<std::size_t>(grain, 1);
  std::size_t grains = (n + grain - 1) / grain;
  if (threads <= 1 || t_in_worker || grains < 2 ||
      static_cast<double>(n) * cost_per_item < kParallelThreshold) {
    fn(0, n);
    return;
  }
  int chunks = static_cast<int>(std::min<std::size_t>(threads, grains));
  pool_for(threads)->run(chunks, [&](int k, int total) {
    // contiguous, grain-aligned chunks
    std::size_t g0 = grains * k / total, g1 = grains * (k + 1) / total;
    std::size_t b = g0 * grain, e = std::min(n, g1 * grain);
    if (b < e) fn(b, e);
  });
}

}  // namespace llmk
