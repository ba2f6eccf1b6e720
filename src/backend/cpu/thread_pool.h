// A persistent pool of worker threads for the CPU backend's ops. The calling thread takes part;
// workers spin briefly after each job (decode runs many short ops back to back) and then park on a
// condition variable. Chunks are claimed from one atomic word that carries the job's generation,
// so a worker that wakes late can never take a chunk of a later job, and the caller waits only
// for chunks that were claimed, never for a worker that has not woken yet. One job at a time: a
// parallel_for issued while another runs (from inside a chunk, or from a second thread using the
// same backend) runs on its calling thread alone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace regolith::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // threads in all, the caller included; <= 0: every core
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(begin, end) over [0, n) in chunks of `grain` items (the last may be shorter). The first
  // exception thrown by any chunk is rethrown here once every chunk has finished.
  template <class F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    using Fn = std::remove_reference_t<F>;
    auto call = [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); };
    run(n, grain < 1 ? 1 : grain, call, const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, int64_t grain, ChunkFn fn, void* ctx);
  void work_on(uint32_t generation);
  void worker_loop();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex job_mutex_;  // one job at a time

  // The current job; written before its generation is published, constant until its last chunk
  // is done.
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<uint32_t> n_chunks_{0};  // atomic: a late worker may read it while the next job is set up
  // generation << 32 | next chunk to claim
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> done_chunks_{0};
  std::exception_ptr error_;
  std::mutex error_mutex_;

  std::mutex park_mutex_;
  std::condition_variable park_cv_;
  std::atomic<bool> stop_{false};
};

}  // namespace regolith::cpu
