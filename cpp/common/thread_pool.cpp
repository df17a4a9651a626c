#include "common/thread_pool.hpp"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
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
// does not change the result (chunk bounds depend only on the job). A job may have fewer
// chunks than the pool has threads (the idle workers find nothing to claim) or more (claimed
// in turn).
class Pool {
 public:
  // Starts up to `workers` threads. If the system refuses one (std::system_error: EAGAIN from
  // a thread or memory limit; std::bad_alloc), the pool keeps the ones already running and
  // remembers why: a partly built pool is a working pool, never a half-constructed object
  // whose destructor would meet joinable threads.
  explicit Pool(int workers) {
    threads_.reserve(static_cast<std::size_t>(workers));
    for (int i = 0; i < workers; ++i) {
      try {
        threads_.emplace_back([this] { worker_loop(); });
      } catch (const std::exception& e) {
        start_error_ = e.what();
        break;
      }
    }
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
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int size() const { return static_cast<int>(threads_.size()) + 1; }  // workers + the caller
  const std::string& start_error() const { return start_error_; }

  // Runs job(k, chunks) once for every k in [0, chunks), on the caller and the workers. The
  // first exception a chunk throws (on any thread) is rethrown here once every thread has left
  // the job; the chunks not yet started when it was thrown are skipped.
  void run(int chunks, function_ref<void(int, int)> job) {
    std::lock_guard<std::mutex> serial(run_mutex_);  // one parallel job at a time
    std::uint32_t gen;
    {
      std::lock_guard<std::mutex> lk(m_);
      job_ = &job;
      chunks_ = chunks;
      error_ = nullptr;
      failed_.store(false, std::memory_order_relaxed);
      done_.store(0, std::memory_order_relaxed);
      gen = static_cast<std::uint32_t>(generation_.fetch_add(1, std::memory_order_release) + 1);
      ticket_.store(std::uint64_t{gen} << 32, std::memory_order_release);
    }
    cv_.notify_all();
    const bool was_in_worker = t_in_worker;
    t_in_worker = true;
    run_chunks(gen, job, chunks);
    t_in_worker = was_in_worker;
    for (int i = 0; i < kSpinIterations && done_.load(std::memory_order_acquire) != chunks; ++i)
      cpu_relax();
    if (done_.load(std::memory_order_acquire) != chunks) {
      std::unique_lock<std::mutex> lk(m_);
      done_cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire) == chunks; });
    }
    if (failed_.load(std::memory_order_acquire)) {
      std::exception_ptr e;
      {
        std::lock_guard<std::mutex> lk(m_);
        e = std::move(error_);
        error_ = nullptr;
      }
      std::rethrow_exception(e);
    }
  }

 private:
  // Claims and runs chunks of job `gen` until none is left; a ticket is (generation << 32 |
  // next chunk), so a late worker cannot claim a chunk of a later job with an earlier job's
  // pointer. Counts each chunk it claimed in done_ (run or skipped). Never throws. `job` lives
  // on the caller's stack: it is only touched after a chunk of its job was claimed (the caller
  // cannot return before that chunk is counted), never by a late worker.
  void run_chunks(std::uint32_t gen, const function_ref<void(int, int)>& job,
                  int chunks) noexcept {
    for (;;) {
      std::uint64_t t = ticket_.load(std::memory_order_acquire);
      do {
        if ((t >> 32) != gen || static_cast<int>(t & 0xffffffffu) >= chunks) return;
      } while (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel));
      if (!failed_.load(std::memory_order_acquire)) {
        try {
          job(static_cast<int>(t & 0xffffffffu), chunks);
        } catch (...) {
          std::lock_guard<std::mutex> lk(m_);
          if (!error_) error_ = std::current_exception();
          failed_.store(true, std::memory_order_release);
        }
      }
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
      const function_ref<void(int, int)>* job;
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
  std::string start_error_;
  std::mutex run_mutex_;
  std::mutex m_;
  std::condition_variable cv_, done_cv_;
  const function_ref<void(int, int)>* job_ = nullptr;
  int chunks_ = 0;
  std::exception_ptr error_;      // first exception of the current job (under m_)
  std::atomic<bool> failed_{false};
  std::atomic<int> done_{0};
  std::atomic<std::uint64_t> ticket_{0};
  std::atomic<unsigned long> generation_{0};
  bool stop_ = false;
};

int default_threads() {
  if (const char* env = std::getenv("LLMKERNELS_NUM_THREADS")) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(env, &end, 10);
    if (errno == 0 && end != env && n >= 1) return static_cast<int>(std::min<long>(n, kMaxThreads));
  }
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(std::min<unsigned>(hw, kMaxThreads));
}

std::mutex g_config_mutex;
std::atomic<int> g_num_threads{0};  // 0 = not yet initialised
// Sized to the configured count; shared with every running job, so replacing it
// (set_num_threads) never destroys a pool another thread is still using: the last user
// releases it.
std::shared_ptr<Pool> g_pool;
pid_t g_pool_pid = 0;  // the process that made g_pool (guarded by g_config_mutex)

void after_fork_in_child() {
  // The workers do not exist in the child. Forget the pool without destroying it (joining
  // threads that do not exist would hang; its mutexes may be in any state): leak it on purpose,
  // and build a new one on first use.
  new std::shared_ptr<Pool>(std::move(g_pool));
  g_pool.reset();
  new (&g_config_mutex) std::mutex();
}

// Registered when the module loads, not on first use. glibc (2.35+) lets other threads
// register handlers while a fork runs the prepare handlers (OpenBLAS's thread shutdown among
// them, which takes a while) and skips those late ones in the child: a thread whose first kernel
// call registered the handler and then took g_config_mutex in that window left the child with
// the mutex held and no handler to reset it. An import holds the GIL, which os.fork keeps for
// the whole fork, so a load-time registration always precedes any fork that can see the mutex.
[[maybe_unused]] const int g_fork_handler = pthread_atfork(nullptr, nullptr, after_fork_in_child);

int ensure_threads() {
  int n = g_num_threads.load();
  if (n == 0) {
    // OpenBLAS runs single-threaded inside our pool's blocks (cpp/ffn.cpp): its own threads
    // would oversubscribe the cores and make results depend on the thread count.
    openblas_set_num_threads(1);
    int expected = 0;
    g_num_threads.compare_exchange_strong(expected, default_threads());
    n = g_num_threads.load();
  }
  return n;
}

// The pool of the configured size, started on first use (and after a fork or a change of the
// count). If the system refuses some of its threads here (the count came from
// LLMKERNELS_NUM_THREADS or the core count, not from a set_num_threads call that could report
// it), the kernels run on the threads that started and the configured count becomes that
// number, so the next call does not try again.
std::shared_ptr<Pool> current_pool() {
  std::lock_guard<std::mutex> lk(g_config_mutex);
  const int n = g_num_threads.load();
  // A pool made by another process (this one is a forked child of it) has no workers here and
  // may be mid-job: leak it, as after_fork_in_child does (a fork that races the registration of
  // that handler, or a job starting on another thread, would otherwise hand it to the child)
  if (g_pool && g_pool_pid != getpid()) {
    new std::shared_ptr<Pool>(std::move(g_pool));
    g_pool.reset();
  }
  if (!g_pool || g_pool->size() != n) {
    g_pool.reset();
    auto pool = std::make_shared<Pool>(n - 1);  // std::bad_alloc: the call fails, count kept
    if (pool->size() < n) g_num_threads.store(pool->size());
    g_pool = std::move(pool);
    g_pool_pid = getpid();
  }
  return g_pool;
}

}  // namespace

int get_num_threads() { return ensure_threads(); }

void set_num_threads(int n) {
  if (n < 1 || n > kMaxThreads)  // the binding reports it; never start an absurd count
    throw std::invalid_argument("[set_num_threads] n must be between 1 and " +
                                std::to_string(kMaxThreads) + ", got " + std::to_string(n));
  ensure_threads();
  std::lock_guard<std::mutex> lk(g_config_mutex);
  const int previous = g_num_threads.load();
  if (g_pool && g_pool->size() == n) {
    g_num_threads.store(n);
    return;
  }
  if (n == 1) {
    g_pool.reset();  // our reference: a job still running on it keeps it alive until it ends
    g_num_threads.store(1);
    return;
  }
  // the old pool stays in force until the new one is complete
  auto pool = std::make_shared<Pool>(n - 1);
  if (pool->size() < n) {
    const std::string why = pool->start_error();
    const int started = pool->size() - 1;
    pool.reset();  // stops and joins the workers that did start
    throw std::runtime_error("[set_num_threads] could not start " + std::to_string(n) +
                             " threads: the system refused after " + std::to_string(started) +
                             " worker threads (" + why + "); the thread count stays " +
                             std::to_string(previous));
  }
  g_num_threads.store(n);
  g_pool = std::move(pool);  // the old one goes when its last running job ends
  g_pool_pid = getpid();
}

void parallel_chunks(int chunks, function_ref<void(int, int)> fn) {
  if (chunks <= 0) return;
  if (chunks == 1 || t_in_worker || ensure_threads() <= 1) {
    for (int k = 0; k < chunks; ++k) fn(k, chunks);
    return;
  }
  current_pool()->run(chunks, fn);
}

void parallel_for_threads(int threads, function_ref<void(int, int)> fn) {
  if (threads <= 1 || t_in_worker) {
    fn(0, 1);
    return;
  }
  threads = std::min(threads, kMaxThreads);
  // a probe asking for more threads than configured gets a pool of its own for this call
  std::shared_ptr<Pool> pool =
      ensure_threads() >= threads ? current_pool() : std::make_shared<Pool>(threads - 1);
  pool->run(threads, fn);
}

void parallel_for(std::size_t n, std::size_t grain, double cost_per_item,
                  function_ref<void(std::size_t, std::size_t)> fn) {
  if (n == 0) return;
  int threads = ensure_threads();
  grain = std::max<std::size_t>(grain, 1);
  std::size_t grains = (n + grain - 1) / grain;
  if (threads <= 1 || t_in_worker || grains < 2 ||
      static_cast<double>(n) * cost_per_item < kParallelThreshold) {
    fn(0, n);
    return;
  }
  std::shared_ptr<Pool> pool = current_pool();
  int chunks = static_cast<int>(std::min<std::size_t>(pool->size(), grains));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  pool->run(chunks, [&](int k, int total) {
    // contiguous, grain-aligned chunks
    std::size_t g0 = grains * k / total, g1 = grains * (k + 1) / total;
    std::size_t b = g0 * grain, e = std::min(n, g1 * grain);
    if (b < e) fn(b, e);
  });
}

void parallel_for_dynamic(std::size_t n, std::size_t block, double cost_per_item,
                          function_ref<void(std::size_t, std::size_t)> fn) {
  if (n == 0) return;
  const int threads = ensure_threads();
  block = std::max<std::size_t>(block, 1);
  const std::size_t blocks = (n + block - 1) / block;
  if (threads <= 1 || t_in_worker || blocks < 2 ||
      static_cast<double>(n) * cost_per_item < kParallelThreshold) {
    fn(0, n);
    return;
  }
  std::shared_ptr<Pool> pool = current_pool();
  const int chunks = static_cast<int>(std::min<std::size_t>(pool->size(), blocks));
  // blocks [0, chunks) go one to each thread; the rest to whichever asks next
  std::atomic<std::size_t> next{static_cast<std::size_t>(chunks)};
  pool->run(chunks, [&](int k, int) {
    for (std::size_t b = static_cast<std::size_t>(k); b < blocks;
         b = next.fetch_add(1, std::memory_order_relaxed))
      fn(b * block, std::min(n, (b + 1) * block));
  });
}

}  // namespace llmk
