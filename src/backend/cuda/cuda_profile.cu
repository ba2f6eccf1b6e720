#include "backend/cuda/cuda_profile.cuh"

#include <algorithm>
#include <cstdio>

#include "backend/cuda/cuda_common.cuh"

namespace regolith::cuda {

cudaEvent_t OpProfiler::event() {
  if (!spare_.empty()) {
    cudaEvent_t e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  check(cudaEventCreate(&e), "profile event");
  return e;
}

void OpProfiler::begin(const char* name, int64_t T, int64_t tag, cudaStream_t stream) {
  if (depth_++ > 0) return;  // an op inside an op: the outer span holds it
  if (T >= 0) decode_ = T == 1;
  Span s{tag ? std::string(name) + "[" + std::to_string(tag) + "]" : std::string(name), decode_, event(), nullptr};
  check(cudaEventRecord(s.start, stream), "profile event");
  op_span_ = open_.size();
  open_.push_back(s);
}

void OpProfiler::end(cudaStream_t stream) {
  if (--depth_ > 0) return;
  open_[op_span_].stop = event();
  check(cudaEventRecord(open_[op_span_].stop, stream), "profile event");
}

void OpProfiler::kernel_begin(const char* name, cudaStream_t stream) {
  std::string op = depth_ > 0 ? open_[op_span_].name : std::string("-");
  Span s{op + "/" + name, decode_, event(), nullptr, true};
  check(cudaEventRecord(s.start, stream), "profile event");
  open_.push_back(s);
}

void OpProfiler::kernel_end(cudaStream_t stream) {
  open_.back().stop = event();
  check(cudaEventRecord(open_.back().stop, stream), "profile event");
}

void OpProfiler::collect() {
  if (depth_ > 0) return;  // an op is open: its span is resolved at a later wait
  for (Span& s : open_) {
    float ms = 0;
    if (s.stop && !s.excluded && cudaEventElapsedTime(&ms, s.start, s.stop) == cudaSuccess) {
      Total& t = totals_[s.kernel ? 1 : 0][s.decode ? 1 : 0][s.name];
      t.ms += ms;
      ++t.calls;
    }
    spare_.push_back(s.start);
    if (s.stop) spare_.push_back(s.stop);
  }
  open_.clear();
  cudaGetLastError();  // an unfinished span is not an error of the next op
}

OpProfiler::~OpProfiler() {
  if (!enabled_) return;
  collect();
  for (int decode = 1; decode >= 0; --decode) {
    for (int kernel = 0; kernel <= 1; ++kernel) {
      std::vector<std::pair<std::string, Total>> rows(totals_[kernel][decode].begin(), totals_[kernel][decode].end());
      if (rows.empty()) continue;
      std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
      double all = 0;
      for (const auto& r : rows) all += r.second.ms;
      std::fprintf(stderr, "cuda profile, %s calls, per %s: %.1f ms in all\n  %-44s %10s %8s %10s %6s\n",
                   decode ? "one-token" : "multi-token", kernel ? "op/kernel" : "op", all, "name", "ms", "calls",
                   "us/call", "share");
      for (const auto& [name, t] : rows)
        std::fprintf(stderr, "  %-44s %10.2f %8lld %10.2f %5.1f%%\n", name.c_str(), t.ms,
                     static_cast<long long>(t.calls), 1e3 * t.ms / static_cast<double>(t.calls), 100.0 * t.ms / all);
    }
  }
  for (cudaEvent_t e : spare_) cudaEventDestroy(e);
}

}  // namespace regolith::cuda
