// Device time per op and per kernel (REGOLITH_CUDA_PROFILE=1): the backend brackets every op, and
// launch() every kernel (cuda_launch.cuh), with two CUDA events; they are resolved whenever the host
// waits for the stream anyway (read), and when the backend is destroyed two tables of milliseconds
// go to stderr, per op and per op/kernel, split into one-token calls (decode) and longer ones
// (prefill). An op's span includes any gap before its first kernel while the stream was idle, so a
// launch-bound run shows up as op time that its kernels do not account for. Off, an op pays one
// branch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace regolith::cuda {

class OpProfiler {
 public:
  explicit OpProfiler(bool enabled) : enabled_(enabled) {}
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  bool enabled() const { return enabled_; }
  // Marks the start and the end of op `name` (a string literal) over T tokens on `stream`; T < 0
  // (an op whose shape does not tell) counts it with the op before.
  // `tag`, when not 0, is printed after the name and kept apart (a matrix's rows, N).
  void begin(const char* name, int64_t T, int64_t tag, cudaStream_t stream);
  void end(cudaStream_t stream);
  // One kernel launch of the op now open (`name` a string literal).
  void kernel_begin(const char* name, cudaStream_t stream);
  void kernel_end(cudaStream_t stream);
  // The op now open did work that is not the op's (a first-use weight upload): its span is dropped.
  void exclude_open() {
    if (depth_ > 0) open_[op_span_].excluded = true;
  }
  // After the stream has drained: adds every finished span to the totals.
  void collect();
  // Ops begun so far (OpScope counts every op, profile on or off): the backend tells by it whether
  // any op ran between two others.
  uint64_t ops_begun() const { return ops_begun_; }
  // fn runs as an op over more than `tokens` tokens begins, before it queues any work.
  void on_op_over(int64_t tokens, std::function<void()> fn) {
    over_tokens_ = tokens;
    on_op_over_ = std::move(fn);
  }
  void count_op(int64_t T) {
    ++ops_begun_;
    if (T > over_tokens_ && on_op_over_) on_op_over_();
  }

 private:
  struct Span {
    std::string name;
    bool decode;
    cudaEvent_t start, stop;
    bool kernel = false, excluded = false;
  };
  struct Total {
    double ms = 0;
    int64_t calls = 0;
  };
  cudaEvent_t event();

  bool enabled_;
  int depth_ = 0;           // ops now open (one op may call another)
  bool decode_ = false;     // the phase of the last op that knew its token count
  std::vector<Span> open_;  // recorded, not yet resolved; the open op's lacks its stop
  size_t op_span_ = 0;      // the open op's span in open_
  std::vector<cudaEvent_t> spare_;
  std::map<std::string, Total> totals_[2][2];  // [kernel?][decode?]
  uint64_t ops_begun_ = 0;
  int64_t over_tokens_ = 0;
  std::function<void()> on_op_over_;
};

// Brackets one op: `OpScope scope(profiler_, "mul_mat", T, stream_);` at the top of every op.
class OpScope {
 public:
  OpScope(OpProfiler& p, const char* name, int64_t T, cudaStream_t stream, int64_t tag = 0) : p_(p), stream_(stream) {
    p_.count_op(T);
    if (p_.enabled()) p_.begin(name, T, tag, stream_);
  }
  ~OpScope() {
    if (p_.enabled()) p_.end(stream_);
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpProfiler& p_;
  cudaStream_t stream_;
};

}  // namespace regolith::cuda
