// A one-line progress display for long jobs; silent when stderr is not a terminal.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace regolith {

class Progress {
 public:
  Progress(std::string label, uint64_t total) : label_(std::move(label)), total_(total), tty_(isatty(2)) {}
  ~Progress() { done(); }

  void advance(uint64_t amount) {
    current_ += amount;
    if (!tty_) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(200) && current_ < total_) return;
    last_ = now;
    double secs = std::chrono::duration<double>(now - start_).count();
    double pct = total_ ? 100.0 * current_ / total_ : 100.0;
    std::fprintf(stderr, "\r%s: %5.1f%%  %.1f / %.1f MiB  %.0f MiB/s   ", label_.c_str(), pct, current_ / 1048576.0,
                 total_ / 1048576.0, secs > 0 ? current_ / 1048576.0 / secs : 0.0);
  }

  void done() {
    if (tty_ && !finished_) std::fprintf(stderr, "\n");
    finished_ = true;
  }

 private:
  std::string label_;
  uint64_t total_, current_ = 0;
  bool tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_{};
};

}  // namespace regolith
