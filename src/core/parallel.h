// parallel_for: splits [0, n) into contiguous ranges over the machine's cores for
// coarse-grained, independent work (file generation, conversion). Not for per-op kernels.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace regolith {

inline void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn,
                         int64_t min_per_thread = 1) {
  int64_t hw = std::max(1u, std::thread::hardware_concurrency());
  int64_t n_threads = std::clamp<int64_t>(n / std::max<int64_t>(1, min_per_thread), 1, hw);
  if (n_threads == 1) {
    fn(0, n);
    return;
  }
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n_threads);
  for (int64_t t = 0; t < n_threads; ++t)
    threads.emplace_back([&, t] {
      try {
        fn(n * t / n_threads, n * (t + 1) / n_threads);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace regolith
