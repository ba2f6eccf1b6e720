// A persistent pool of worker threads for the CPU backend's ops. The calling thread takes part;
// workers spin briefly after each job (decode runs many short ops back to back) and then park on a
// condition variable. Work is handed out in chunks from an atomic counter, so uneven chunks
// balance themselves. One job at a time: a parallel_for issued while another runs (from a worker,
// or from a second thread using the same backend) runs on its calling thread alone.
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
    auto call = [](void* ctx, int64_t b, int64_t e) { (*static_cast<F*>(ctx))(b, e); };
    run(n, grain < 1 ? 1 : grain, call, &fn);
  }

 private:
  using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
  void run(int64_t n, int64_t grain, ChunkFn fn, void* ctx);
  void work_on_job();
  void worker_loop();

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex job_mutex_;  // one job at a time

  // The current job.
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, grain_ = 1, n_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> busy_workers_{0};
  std::exception_ptr error_;
  std::mutex error_mutex_;

  // Workers wait for the generation to change.
  std::atomic<uint64_t> generation_{0};
  std::mutex park_mutex_;
  std::condition_variable park_cv_;
  bool stop_ = false;
};

}  // namespace regolith::cpu
