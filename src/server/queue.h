// The queues between threads. A ResultChannel carries one request's events from the scheduler to
// the HTTP worker that serves it (unbounded: the scheduler never blocks on a slow client; a client
// that stops reading is dropped by the transport and cancels its request). A Submission is what
// the scheduler's bounded task queue holds.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "server/task.h"

namespace regolith::server {

class ResultChannel {
 public:
  void push(ResultEvent event) {
    {
      std::lock_guard lock(mutex_);
      events_.push_back(std::move(event));
    }
    ready_.notify_one();
  }

  // Waits up to `timeout` for the next event.
  std::optional<ResultEvent> pop(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    ResultEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<ResultEvent> events_;
};

// One request as the scheduler sees it: its tasks (one per prompt), where results go, and the
// flag its HTTP worker sets when the client goes away.
struct Submission {
  std::vector<GenerationTask> tasks;
  std::shared_ptr<ResultChannel> results;
  std::shared_ptr<std::atomic<bool>> cancelled;
  std::chrono::steady_clock::time_point submitted;
};

}  // namespace regolith::server
