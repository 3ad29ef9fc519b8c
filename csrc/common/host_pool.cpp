// The host thread pool of host_pool.h.
#include "common/host_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace opforge {

namespace {

// How long a worker spins after a job before it sleeps: a frame copy every ~150 us finds it awake.
constexpr auto kHostPoolSpin = std::chrono::microseconds(200);
constexpr int kMaxWorkers = 255;

// A spinning thread gives its CPU to any other runnable thread (the caller's consumer thread, the
// CUDA driver's): a pool that spun with pause instructions kept 15 of 16 CPUs busy between frames
// and starved them (FrameStream ran at half the speed of the same copies on one thread).
inline void cpu_relax() {
  std::this_thread::yield();
}

struct Pool {
  std::mutex job_mu;  // one job at a time
  std::mutex mu;      // with cv: sleeping workers
  std::condition_variable cv;
  std::atomic<uint64_t> generation{0};  // bumped to start a job
  std::atomic<int> pending{0};          // workers yet to finish the current job
  const std::function<void(int)>* fn = nullptr;
  int parts = 0;
  int stride = 1;  // threads taking part in the job: worker w runs parts w, w + stride, ...
  int workers = 0;
};

// Leaked on purpose: workers are detached and may still wait on it while statics are destroyed.
Pool* g_pool = nullptr;
std::once_flag g_pool_once;
thread_local bool t_in_job = false;

void run_parts(const Pool& p, int first) {
  for (int i = first; i < p.parts; i += p.stride) (*p.fn)(i);
}

void worker_main(Pool* p, int index, uint64_t seen) {
  t_in_job = true;  // a job's fn that starts another job runs it alone
  for (;;) {
    uint64_t g = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 1; (g = p->generation.load(std::memory_order_acquire)) == seen; ++k) {
      cpu_relax();
      if ((k & 15) == 0 && std::chrono::steady_clock::now() - t0 > kHostPoolSpin) {
        std::unique_lock<std::mutex> lock(p->mu);
        p->cv.wait(lock, [&] { return (g = p->generation.load(std::memory_order_acquire)) != seen; });
        break;
      }
    }
    seen = g;
    if (index < p->stride) run_parts(*p, index);
    p->pending.fetch_sub(1, std::memory_order_release);
  }
}

// A child process has none of the parent's workers (and may have forked while a job held the
// locks): it starts from a new pool.
void reset_after_fork() {
  g_pool = new Pool();
}

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool();
    pthread_atfork(nullptr, nullptr, reset_after_fork);
  });
  return *g_pool;
}

}  // namespace

int host_pool_max_threads() {
  static const int n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxWorkers + 1);
  return n;
}

void host_parallel(int parts, int threads, const std::function<void(int)>& fn) {
  threads = std::min({threads, parts, host_pool_max_threads()});
  if (threads <= 1 || t_in_job) {
    for (int i = 0; i < parts; ++i) fn(i);
    return;
  }
  Pool& p = pool();
  std::lock_guard<std::mutex> job(p.job_mu);
  while (p.workers < threads - 1) {
    std::thread(worker_main, &p, p.workers + 1, p.generation.load()).detach();
    ++p.workers;
  }
  p.fn = &fn;
  p.parts = parts;
  p.stride = threads;
  p.pending.store(p.workers, std::memory_order_relaxed);  // every worker answers, busy or not
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.generation.fetch_add(1, std::memory_order_release);
  }
  p.cv.notify_all();
  t_in_job = true;
  run_parts(p, 0);
  t_in_job = false;
  while (p.pending.load(std::memory_order_acquire) > 0) cpu_relax();
}

}  // namespace opforge
