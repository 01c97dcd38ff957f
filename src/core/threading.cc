#include "psflow/core/threading.h"

#include <cblas.h>
#include <omp.h>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/threading_internal.h"

namespace psflow {
namespace {

// psflow's own pool for element-wise kernels (bias, relu, pooling). Hand-written because the
// kernels need only "run these N blocks and wait", and a persistent pool avoids creating threads
// per op; OpenMP's pool belongs to oneDNN and OpenBLAS has its own.
class ThreadPool {
 public:
  explicit ThreadPool(int num_workers) {
    workers_.reserve(num_workers);
    for (int i = 0; i < num_workers; ++i) {
      workers_.emplace_back([this] {
        FlushDenormalsOnThisThread();
        WorkerLoop();
      });
    }
  }

  ~ThreadPool() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

  // Runs fn(b) for every b in [0, num_blocks) on the workers and the calling thread; returns
  // when all blocks are done. Which thread runs a block does not matter: blocks write disjoint
  // outputs.
  void Run(int num_blocks, const std::function<void(int)>& fn) {
    auto job = std::make_shared<Job>(&fn, num_blocks);
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(job);
    }
    RunBlocks(*job);
    {
      absl::MutexLock lock(&mu_);
      auto it = std::find(queue_.begin(), queue_.end(), job);
      if (it != queue_.end()) queue_.erase(it);
    }
    absl::MutexLock lock(&job->mu);
    job->mu.Await(absl::Condition(
        +[](Job* j) ABSL_EXCLUSIVE_LOCKS_REQUIRED(j->mu) { return j->done == j->num_blocks; }, job.get()));
  }

 private:
  struct Job {
    Job(const std::function<void(int)>* f, int n) : fn(f), num_blocks(n) {}
    const std::function<void(int)>* fn;
    const int num_blocks;
    std::atomic<int> next{0};
    absl::Mutex mu;
    int done ABSL_GUARDED_BY(mu) = 0;
  };

  static void RunBlocks(Job& job);
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

// True while this thread runs a block; a nested ParallelFor then runs inline.
thread_local bool t_in_parallel_block = false;

void ThreadPool::RunBlocks(Job& job) {
  for (int b = job.next.fetch_add(1); b < job.num_blocks; b = job.next.fetch_add(1)) {
    t_in_parallel_block = true;
    (*job.fn)(b);
    t_in_parallel_block = false;
    absl::MutexLock lock(&job.mu);
    ++job.done;
  }
}

void ThreadPool::WorkerLoop() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->stop_ || !p->queue_.empty(); }, this));
      if (stop_) return;
      job = queue_.front();
      if (job->next.load() >= job->num_blocks) {
        queue_.pop_front();  // exhausted: its caller is finishing the last blocks
        continue;
      }
    }
    RunBlocks(*job);
  }
}

// Computed once: hardware_concurrency() reads /sys/devices/system/cpu/online on every call (three
// syscalls), and IntraOpThreads() asks on every ParallelFor of a task that never set a count (a ps).
int DefaultThreads() {
  static const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return threads;
}

absl::Mutex g_mu(absl::kConstInit);
int g_threads ABSL_GUARDED_BY(g_mu) = 0;  // 0: not set yet, use DefaultThreads()
std::shared_ptr<ThreadPool> g_pool ABSL_GUARDED_BY(g_mu);
// Mirrors g_threads for lock-free reads on hot paths.
std::atomic<int> g_threads_fast{0};

std::shared_ptr<ThreadPool> GetPool() {
  {
    absl::ReaderMutexLock lock(&g_mu);
    if (g_pool != nullptr) return g_pool;
  }
  absl::MutexLock lock(&g_mu);
  const int threads = g_threads > 0 ? g_threads : DefaultThreads();
  if (g_pool == nullptr) g_pool = std::make_shared<ThreadPool>(threads - 1);
  return g_pool;
}

thread_local int t_openmp_threads_applied = 0;

// Sets the thread count of this thread's OpenMP team, and the denormal mode on its workers
// (libgomp keeps its worker threads, so the mode stays set on them).
void ApplyToOpenMp(int n) {
  omp_set_num_threads(n);
  if (n > 1) {
#pragma omp parallel num_threads(n)
    FlushDenormalsOnThisThread();
  }
  t_openmp_threads_applied = n;
}

}  // namespace

void SetIntraOpThreads(int n) {
  if (n <= 0) n = DefaultThreads();
  std::shared_ptr<ThreadPool> old_pool;
  {
    absl::MutexLock lock(&g_mu);
    if (g_threads != n) {
      old_pool = std::move(g_pool);  // joined below, outside the lock; in-flight users hold a ref
      g_pool = nullptr;
    }
    g_threads = n;
    g_threads_fast.store(n);
  }
  openblas_set_num_threads(n);
  FlushDenormalsOnThisThread();
  ApplyToOpenMp(n);
}

void FlushDenormalsOnThisThread() {
#if defined(__x86_64__)
  // MXCSR's FTZ (0x8000) and DAZ (0x0040) bits, which every x86-64 CPU has. Written directly
  // rather than with pmmintrin.h's macro, which needs -msse3: the portable build targets the
  // SSE2 baseline, and the bits must be set there too (same numbers on every CPU).
  _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
}

int IntraOpThreads() {
  const int n = g_threads_fast.load(std::memory_order_relaxed);
  return n > 0 ? n : DefaultThreads();
}

void ParallelFor(int64_t n, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_block = std::max<int64_t>(min_block, 1);
  const int threads = IntraOpThreads();
  const int64_t blocks = std::min<int64_t>(threads, (n + min_block - 1) / min_block);
  if (blocks <= 1 || t_in_parallel_block) {
    fn(0, n);
    return;
  }
  std::shared_ptr<ThreadPool> pool = GetPool();
  pool->Run(static_cast<int>(blocks), [&](int b) { fn(n * b / blocks, n * (b + 1) / blocks); });
}

namespace internal {
void PrepareThreadForKernels() {
  const int n = IntraOpThreads();
  if (t_openmp_threads_applied != n) {
    FlushDenormalsOnThisThread();
    ApplyToOpenMp(n);
  }
}
}  // namespace internal

}  // namespace psflow
