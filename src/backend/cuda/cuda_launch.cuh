// Every kernel launch, memset and copy of the CUDA backend goes through here, so that what a
// stream is attached to can take them: a StepRecorder (cuda_step_graph.cuh) keeps the work as a
// list to replay as one CUDA graph instead of sending it to the driver; an OpProfiler
// (cuda_profile.cuh) brackets every kernel with events. Unattached, launch() is cudaLaunchKernel
// with the arguments converted to the kernel's parameter types, and an error names the kernel.
// A stream may also launch with programmatic dependent launch (sm_90+): each kernel may be
// scheduled while its predecessor still runs, and every kernel calls grid_dependency_wait()
// (cuda_common.cuh) before it touches memory its predecessor may write.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_profile.cuh"
#include "backend/cuda/cuda_step_graph.cuh"

namespace regolith::cuda {

// What a stream is attached to and how it launches (cuda_launch.cu keeps the table).
struct StreamHooks {
  StepRecorder* recorder = nullptr;
  OpProfiler* profiler = nullptr;
  bool programmatic = false;  // launch with cudaLaunchAttributeProgrammaticStreamSerialization
};
StreamHooks hooks_of(cudaStream_t stream);
void set_hooks(cudaStream_t stream, StreamHooks hooks);


// Stream-ordered copy and fill that a recording stream keeps as graph nodes.
// beside: on a recording stream, work after the copy does not wait for it (StepRecorder::memcpy).
void memcpy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream, const char* what,
                  bool beside = false);
void memset_async(void* dst, size_t bytes, cudaStream_t stream);

namespace detail {

template <typename... P, typename Tuple, size_t... I>
void launch_tuple(cudaStream_t stream, const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                  Tuple& values, std::index_sequence<I...>) {
  void* args[sizeof...(P) + 1] = {static_cast<void*>(&std::get<I>(values))...};
  constexpr size_t sizes[sizeof...(P) + 1] = {sizeof(std::tuple_element_t<I, Tuple>)...};
  const StreamHooks hooks = hooks_of(stream);
  if (hooks.recorder) {
    hooks.recorder->kernel(reinterpret_cast<const void*>(kernel), grid, block, smem, args, sizes, sizeof...(P));
    return;
  }
  if (hooks.profiler) hooks.profiler->kernel_begin(name, stream);
  if (hooks.programmatic) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{grid, block, smem, stream, &attribute, 1};
    check(cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(kernel), args), name);
  } else {
    check(cudaLaunchKernel(reinterpret_cast<const void*>(kernel), grid, block, args, smem, stream), name);
  }
  if (hooks.profiler) hooks.profiler->kernel_end(stream);
}

}  // namespace detail

// kernel<<<grid, block, smem, stream>>>(args...); `name` (a string literal) for errors and the
// profile.
template <typename... P, typename... A>
void launch(cudaStream_t stream, const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
            A&&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "launch: argument count differs from the kernel's");
  std::tuple<std::decay_t<P>...> values(static_cast<std::decay_t<P>>(args)...);
  detail::launch_tuple(stream, name, kernel, grid, block, smem, values, std::index_sequence_for<P...>{});
}

}  // namespace regolith::cuda
