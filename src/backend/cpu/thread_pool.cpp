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

uint32_t generation_of(uint64_t state) { return static_cast<uint32_t>(state >> 32); }

// The chunk index of a closed generation: above any job's chunk count (those stay below 2^31).
constexpr uint64_t kClosedChunk = UINT32_MAX;

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(park_mutex_);
    stop_.store(true, std::memory_order_release);
  }
  park_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

// Claims and runs chunks of job `generation` until none is left (or a later job has begun).
void ThreadPool::work_on(uint32_t generation) {
  bool was_in_job = t_in_pool_job;
  t_in_pool_job = true;
  uint64_t s = state_.load(std::memory_order_acquire);
  for (;;) {
    if (generation_of(s) != generation) break;
    uint32_t c = static_cast<uint32_t>(s);
    if (c >= n_chunks_.load(std::memory_order_relaxed)) break;  // a stale count only makes the claim below fail
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
    int64_t b = static_cast<int64_t>(c) * grain_, e = std::min(n_, b + grain_);
    try {
      fn_(ctx_, b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    done_chunks_.fetch_add(1, std::memory_order_release);
    s = state_.load(std::memory_order_acquire);
  }
  t_in_pool_job = was_in_job;
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  for (;;) {
    auto spin_until = std::chrono::steady_clock::now() + kSpin;
    int polls = 0;
    uint32_t g;
    while ((g = generation_of(state_.load(std::memory_order_acquire))) == seen) {
      if (stop_.load(std::memory_order_acquire)) return;
      REGOLITH_CPU_RELAX();
      if (++polls % 64 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(park_mutex_);
        park_cv_.wait(lock, [&] {
          return stop_.load(std::memory_order_acquire) || generation_of(state_.load(std::memory_order_acquire)) != seen;
        });
      }
    }
    seen = g;
    work_on(g);
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
  if (n_chunks > UINT32_MAX / 2) {  // keep the chunk index inside its 32 bits
    grain = (n + UINT32_MAX / 2 - 1) / (UINT32_MAX / 2);
    n_chunks = (n + grain - 1) / grain;
  }
  // Close the finished job's generation before touching the job fields: a worker still holding
  // that generation's state word could otherwise claim "chunk n" of the job being written (its
  // compare-and-swap would match the unchanged word). A closed generation has no claimable chunk,
  // and every claim compares the whole word, so stale claims fail from here on.
  uint32_t finished = generation_of(state_.load(std::memory_order_relaxed));
  state_.store((static_cast<uint64_t>(finished + 1) << 32) | kClosedChunk, std::memory_order_release);
  fn_ = fn;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  n_chunks_.store(static_cast<uint32_t>(n_chunks), std::memory_order_relaxed);
  error_ = nullptr;
  done_chunks_.store(0, std::memory_order_relaxed);
  uint32_t generation = finished + 2;
  {
    // Under the park mutex, so that a worker between its last check and its wait cannot miss it.
    std::lock_guard<std::mutex> lock(park_mutex_);
    state_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
  }
  park_cv_.notify_all();
  work_on(generation);
  for (int polls = 0; done_chunks_.load(std::memory_order_acquire) != n_chunks; ++polls) {
    if (polls < 4096)
      REGOLITH_CPU_RELAX();
    else
      std::this_thread::yield();  // a worker holding a chunk was descheduled
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace regolith::cpu
