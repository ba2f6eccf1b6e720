#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define REGOLITH_CPU_RELAX() _mm_pause()
#else
#define REGOLITH_CPU_RELAX() std::this_thread::yield()
#endif

namespace regolith::cpu {

namespace {

// How long an idle worker keeps polling before it parks: long enough to bridge the gap between
// two ops of one decode step, short enough not to burn a core between requests.
constexpr auto kSpin = std::chrono::microseconds(200);

thread_local bool t_in_pool_job = false;

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(park_mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  park_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::work_on_job() {
  bool was_in_job = t_in_pool_job;
  t_in_pool_job = true;
  for (;;) {
    int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= n_chunks_) break;
    int64_t b = c * grain_, e = std::min(n_, b + grain_);
    try {
      fn_(ctx_, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
  t_in_pool_job = was_in_job;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    auto spin_until = std::chrono::steady_clock::now() + kSpin;
    uint64_t g;
    int polls = 0;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      REGOLITH_CPU_RELAX();
      if (++polls % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(park_mutex_);
        park_cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
    }
    seen = g;
    if (stop_) return;
    work_on_job();
    busy_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int64_t n, int64_t grain, ChunkFn fn, void* ctx) {
  int64_t n_chunks = (n + grain - 1) / grain;
  std::unique_lock<std::mutex> job(job_mutex_, std::defer_lock);
  if (n_chunks == 1 || workers_.empty() || t_in_pool_job || !job.try_lock()) {
    bool was_in_job = t_in_pool_job;
    t_in_pool_job = true;
    try {
      for (int64_t b = 0; b < n; b += grain) fn(ctx, b, std::min(n, b + grain));
    } catch (...) {
      t_in_pool_job = was_in_job;
      throw;
    }
    t_in_pool_job = was_in_job;
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  n_chunks_ = n_chunks;
  error_ = nullptr;
  next_chunk_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    // Under the park mutex, so that a worker between its last check and its wait cannot miss it.
    std::lock_guard<std::mutex> lock(park_mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  park_cv_.notify_all();
  work_on_job();
  while (busy_workers_.load(std::memory_order_acquire) != 0) REGOLITH_CPU_RELAX();
  if (error_) std::rethrow_exception(error_);
}

}  // namespace regolith::cpu
