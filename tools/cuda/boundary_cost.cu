// What a dependency between two steps of a decode chain costs on the device: a kernel boundary
// (one kernel a step, programmatic dependent launch or plain stream order, replayed from a CUDA
// graph so that the host's launch cost stays out) against a grid-wide barrier inside one
// persistent kernel (cooperative launch, every block resident). A decode token is a chain of about
// 571 dependent kernels; if a barrier costs much less than a boundary, a persistent decode kernel
// would gain that difference at every step of the chain.
// Each step is nearly empty: thread 0 of every block reads a value another block wrote in the step
// before and writes its own, so each step truly depends on the last.
//   nvcc -O2 -std=c++20 -gencode arch=compute_90,code=sm_90 -o /tmp/boundary_cost tools/cuda/boundary_cost.cu
//   /tmp/boundary_cost
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace {

constexpr int kSteps = 2000;
constexpr int kThreads = 256;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

// Step `step` of the chain for block b of n: reads block b + 1's value of the step before.
__device__ __forceinline__ void chain_step(float* buf, int step, int b, int n) {
  if (threadIdx.x != 0) return;
  const float v = __ldcg(buf + ((step + 1) & 1) * n + (b + 1) % n);
  __stcg(buf + (step & 1) * n + b, v + 1.0f);
}

__global__ void __launch_bounds__(kThreads) step_kernel(float* buf, int step) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  chain_step(buf, step, blockIdx.x, gridDim.x);
}

__global__ void __launch_bounds__(kThreads) persistent_kernel(float* buf, int steps) {
  cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  for (int step = 0; step < steps; ++step) {
    chain_step(buf, step, blockIdx.x, gridDim.x);
    grid.sync();
  }
}

// Device µs a step of `run` (kSteps steps), by events: the median of 5 runs after one to warm up.
template <typename Run>
float step_us(cudaStream_t stream, Run run) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  float times[5];
  run();
  for (float& t : times) {
    check(cudaEventRecord(a, stream), "record");
    run();
    check(cudaEventRecord(b, stream), "record");
    check(cudaEventSynchronize(b), "sync");
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
  }
  std::sort(times, times + 5);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1e3f * times[2] / kSteps;
}

// Device µs a step of a graph of kSteps step kernels.
float graph_step_us(cudaStream_t stream, float* buf, int blocks, bool programmatic) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  for (int step = 0; step < kSteps; ++step) {
    cudaLaunchConfig_t config{dim3(blocks), dim3(kThreads), 0, stream, programmatic ? &pdl : nullptr,
                              programmatic ? 1u : 0u};
    check(cudaLaunchKernelEx(&config, step_kernel, buf, step), "step_kernel");
  }
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  cudaGraphExec_t exec = nullptr;
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  const float us = step_us(stream, [&] { check(cudaGraphLaunch(exec, stream), "graph launch"); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us;
}

// Device µs a step of one persistent kernel with a grid barrier after every step.
float persistent_step_us(cudaStream_t stream, float* buf, int blocks) {
  int steps = kSteps;
  void* args[] = {&buf, &steps};
  return step_us(stream, [&] {
    check(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(persistent_kernel), dim3(blocks),
                                      dim3(kThreads), args, 0, stream),
          "cooperative launch");
  });
}

}  // namespace

int main() {
  check(cudaSetDevice(0), "cudaSetDevice");
  int sms = 0, resident = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent_kernel, kThreads, 0), "occupancy");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  float* buf = nullptr;
  const int max_blocks = sms * resident;
  check(cudaMalloc(&buf, 2 * max_blocks * sizeof(float)), "cudaMalloc");
  check(cudaMemset(buf, 0, 2 * max_blocks * sizeof(float)), "cudaMemset");
  std::printf("%d SMs, %d blocks of %d threads resident an SM; %d dependent steps\n", sms, resident, kThreads, kSteps);
  std::printf("| blocks | kernel a step, programmatic (graph) µs | kernel a step, stream order (graph) µs | "
              "persistent kernel, grid barrier µs |\n|---:|---:|---:|---:|\n");
  for (int per_sm : {1, 2, 4}) {
    if (per_sm > resident) break;
    const int blocks = sms * per_sm;
    std::printf("| %d | %.2f | %.2f | %.2f |\n", blocks, graph_step_us(stream, buf, blocks, true),
                graph_step_us(stream, buf, blocks, false), persistent_step_us(stream, buf, blocks));
  }
  cudaFree(buf);
  cudaStreamDestroy(stream);
  return 0;
}
