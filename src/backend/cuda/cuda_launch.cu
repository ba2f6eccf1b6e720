#include "backend/cuda/cuda_launch.cuh"

#include <mutex>
#include <unordered_map>

namespace regolith::cuda {

namespace {

std::mutex hooks_mu;
std::unordered_map<cudaStream_t, StreamHooks>& hooks_table() {
  static std::unordered_map<cudaStream_t, StreamHooks> table;
  return table;
}

}  // namespace

StreamHooks hooks_of(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(hooks_mu);
  auto it = hooks_table().find(stream);
  return it == hooks_table().end() ? StreamHooks{} : it->second;
}

void set_hooks(cudaStream_t stream, StreamHooks hooks) {
  std::lock_guard<std::mutex> lock(hooks_mu);
  if (hooks.recorder || hooks.profiler || hooks.programmatic)
    hooks_table()[stream] = hooks;
  else
    hooks_table().erase(stream);
}

void memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, const char* what,
                  bool beside) {
  if (bytes == 0) return;
  if (StepRecorder* r = hooks_of(stream).recorder) return r->memcpy(dst, src, bytes, kind, beside);
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream), what);
}

void memset_async(void* dst, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (StepRecorder* r = hooks_of(stream).recorder) return r->memset(dst, bytes);
  check(cudaMemsetAsync(dst, 0, bytes, stream), "cudaMemsetAsync");
}

}  // namespace regolith::cuda
