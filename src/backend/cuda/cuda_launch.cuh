// Every kernel launch, memset and copy of the CUDA backend goes through here, so that a stream can
// be switched into recording (cuda_step_graph.cuh): then the work is kept as a list instead of
// being sent to the driver, and replayed later as one CUDA graph. Off, launch() is
// cudaLaunchKernel with the arguments converted to the kernel's parameter types.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_common.cuh"

namespace regolith::cuda {

class StepRecorder;

// The recorder a stream is attached to, or null (the stream runs its work at once).
StepRecorder* recorder_of(cudaStream_t stream);
void record_kernel(StepRecorder& r, const void* func, dim3 grid, dim3 block, size_t smem, void** args,
                   const size_t* arg_sizes, size_t n_args);

// Stream-ordered copy and fill that a recording stream keeps as graph nodes.
void memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, const char* what);
void memset_async(void* dst, size_t bytes, cudaStream_t stream);

namespace detail {

template <typename... P, typename Tuple, size_t... I>
void launch_tuple(cudaStream_t stream, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, Tuple& values,
                  std::index_sequence<I...>) {
  void* args[sizeof...(P) + 1] = {static_cast<void*>(&std::get<I>(values))...};
  constexpr size_t sizes[sizeof...(P) + 1] = {sizeof(std::tuple_element_t<I, Tuple>)...};
  if (StepRecorder* r = recorder_of(stream)) {
    record_kernel(*r, reinterpret_cast<const void*>(kernel), grid, block, smem, args, sizes, sizeof...(P));
    return;
  }
  check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, smem, stream), "kernel launch");
}

}  // namespace detail

// launch(stream, kernel, grid, block, smem, args...), recorded when the stream records.
template <typename... P, typename... A>
void launch(cudaStream_t stream, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch: argument count differs from the kernel's");
  std::tuple<std::decay_t<P>...> values(static_cast<std::decay_t<P>>(args)...);
  detail::launch_tuple(stream, kernel, grid, block, smem, values, std::index_sequence_for<P...>{});
}

}  // namespace regolith::cuda
