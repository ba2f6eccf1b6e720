// The host's time to issue one kernel launch on this machine, by launch API. A decode step issues
// about 571 launches, and regolith bench's "issue ms/token" (2.5–4.1 ms on the H200 machines) is
// close to the device's own 4.4 ms a step, so the host's cost per launch bounds decode in stretches.
// Empty kernels with ten parameters (each calls griddepcontrol like regolith's kernels), batches of
// 256 launches (well under the launch queue's depth, so the host never waits for the device) timed
// on the host; the stream drains between batches, and the batch's time to drain gives the device's
// time per launch of such a chain.
//   nvcc -O2 -std=c++20 -gencode arch=compute_90,code=sm_90 -o /tmp/launch_cost tools/cuda/launch_cost.cu
//   /tmp/launch_cost
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

__global__ void empty_kernel(const float* a, const float* b, float* c, int n, int m, int k, float s, float t,
                             unsigned* counters, int flag) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  if (flag == 12345) c[threadIdx.x] = a[n] + b[m] + s * t + static_cast<float>(k + counters[0]);  // never taken
}

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}

void check(CUresult e, const char* what) {
  if (e == CUDA_SUCCESS) return;
  std::fprintf(stderr, "%s: CUresult %d\n", what, static_cast<int>(e));
  std::exit(1);
}

using Clock = std::chrono::steady_clock;
double micros(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::micro>(b - a).count(); }

using CuLaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);

struct Args {
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  int n = 0, m = 0, k = 0;
  float s = 1, t = 2;
  unsigned* counters = nullptr;
  int flag = 0;
  void* pointers[10] = {&a, &b, &c, &n, &m, &k, &s, &t, &counters, &flag};
};

// Median host µs a launch and device µs a launch over `batches` batches of `per_batch` launches.
template <typename Launch>
void measure(const char* name, cudaStream_t stream, Launch launch) {
  constexpr int kBatches = 40, kPerBatch = 256;
  std::vector<double> host, device;
  for (int b = 0; b < kBatches + 2; ++b) {  // the first two warm up
    check(cudaStreamSynchronize(stream), "sync");
    const auto t0 = Clock::now();
    for (int i = 0; i < kPerBatch; ++i) launch();
    const auto t1 = Clock::now();
    check(cudaStreamSynchronize(stream), name);
    const auto t2 = Clock::now();
    if (b < 2) continue;
    host.push_back(micros(t0, t1) / kPerBatch);
    device.push_back(micros(t0, t2) / kPerBatch);
  }
  std::sort(host.begin(), host.end());
  std::sort(device.begin(), device.end());
  std::printf("| %s | %.2f | %.2f | %.2f |\n", name, host[host.size() / 2], host[host.size() / 10],
              device[device.size() / 2]);
}

}  // namespace

int main() {
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  Args args;
  check(cudaMalloc(&args.c, 4096), "cudaMalloc");
  check(cudaMalloc(&args.counters, 64), "cudaMalloc");
  args.a = args.c;
  args.b = args.c;
  const dim3 grid(132), block(128);
  const void* kernel = reinterpret_cast<const void*>(empty_kernel);

  CUfunction function = nullptr;
  check(cudaGetFuncBySymbol(&function, kernel), "cudaGetFuncBySymbol");
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &entry, 12000, cudaEnableDefault, &found),
        "cudaGetDriverEntryPointByVersion");
  if (found != cudaDriverEntryPointSuccess || !entry) {
    std::fprintf(stderr, "cuLaunchKernelEx not found\n");
    return 1;
  }
  const auto launch_ex = reinterpret_cast<CuLaunchKernelEx>(entry);

  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  CUlaunchAttribute cu_pdl{};
  cu_pdl.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  cu_pdl.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cu_config{};
  cu_config.gridDimX = grid.x, cu_config.gridDimY = 1, cu_config.gridDimZ = 1;
  cu_config.blockDimX = block.x, cu_config.blockDimY = 1, cu_config.blockDimZ = 1;
  cu_config.hStream = stream;

  std::printf("| launch API (empty kernel, 132 × 128 threads, 10 parameters) | host µs a launch (median) | "
              "host µs (10th percentile) | device µs a launch of the chain |\n|---|---:|---:|---:|\n");
  measure("`<<<>>>`", stream, [&] {
    empty_kernel<<<grid, block, 0, stream>>>(args.a, args.b, args.c, args.n, args.m, args.k, args.s, args.t,
                                             args.counters, args.flag);
  });
  measure("`cudaLaunchKernel`", stream,
          [&] { check(cudaLaunchKernel(kernel, grid, block, args.pointers, 0, stream), "cudaLaunchKernel"); });
  measure("`cudaLaunchKernelExC`, programmatic", stream, [&] {
    cudaLaunchConfig_t config{grid, block, 0, stream, &pdl, 1};
    check(cudaLaunchKernelExC(&config, kernel, args.pointers), "cudaLaunchKernelExC");
  });
  measure("`cuLaunchKernelEx`, programmatic, function looked up once", stream, [&] {
    cu_config.attrs = &cu_pdl, cu_config.numAttrs = 1;
    check(launch_ex(&cu_config, function, args.pointers, nullptr), "cuLaunchKernelEx");
  });
  measure("`cuLaunchKernelEx`, function looked up once", stream, [&] {
    cu_config.attrs = nullptr, cu_config.numAttrs = 0;
    check(launch_ex(&cu_config, function, args.pointers, nullptr), "cuLaunchKernelEx");
  });
  measure("`cudaLaunchKernelExC`, programmatic (again)", stream, [&] {
    cudaLaunchConfig_t config{grid, block, 0, stream, &pdl, 1};
    check(cudaLaunchKernelExC(&config, kernel, args.pointers), "cudaLaunchKernelExC");
  });
  cudaFree(args.c);
  cudaFree(args.counters);
  cudaStreamDestroy(stream);
  return 0;
}
