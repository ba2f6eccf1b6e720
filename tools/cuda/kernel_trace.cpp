// Kernel timeline of a running program, for where decode time goes inside the pipeline (Nsight
// Systems cannot make reports on the GPU machine; Nsight Compute runs kernels one at a time, so it
// shows neither programmatic-launch overlap nor launch gaps). A CUDA injection library: the driver
// loads it when CUDA_INJECTION64_PATH names it and calls InitializeInjection, which turns on CUPTI's
// concurrent-kernel activity records (GPU start and end of every kernel, as the kernels overlap in
// the real stream), and with KERNEL_TRACE_API=1 the CUDA runtime calls' host start and end on the
// same clock, so that a kernel can be matched with the call that launched it (for a graph's
// kernels, the graph's launch). At exit the kernels go to $KERNEL_TRACE_OUT as "start_ns end_ns
// grid_x grid_y grid_z block_x registers correlation name" lines, in start order, and the runtime
// calls to $KERNEL_TRACE_OUT.api as "start_ns end_ns callback_id correlation" lines.
//   g++ -O2 -shared -fPIC -I$CUDA/include tools/cuda/kernel_trace.cpp -o /tmp/libkernel_trace.so \
//       -L$CUDA/lib64 -lcupti
//   CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT=/tmp/trace.txt regolith bench ...
#include <cupti.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Record {
  uint64_t start, end;
  uint32_t grid[3], block_x, registers, correlation;
  std::string name;
};
struct ApiRecord {
  uint64_t start, end;
  uint32_t callback, correlation;
};

std::mutex records_mutex;
std::vector<Record> records;
std::vector<ApiRecord> api_records;

constexpr size_t kBufferBytes = 8 << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  CUpti_Activity* activity = nullptr;
  std::lock_guard<std::mutex> lock(records_mutex);
  while (cuptiActivityGetNextRecord(buffer, valid_bytes, &activity) == CUPTI_SUCCESS) {
    if (activity->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(activity);
      api_records.push_back({a->start, a->end, a->cbid, a->correlationId});
      continue;
    }
    if (activity->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(activity);
    records.push_back({k->start, k->end, {static_cast<uint32_t>(k->gridX), static_cast<uint32_t>(k->gridY),
                                          static_cast<uint32_t>(k->gridZ)},
                       static_cast<uint32_t>(k->blockX), k->registersPerThread, k->correlationId,
                       k->name ? k->name : "?"});
  }
  std::free(buffer);
}

void write_records() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("KERNEL_TRACE_OUT");
  FILE* f = std::fopen(path ? path : "kernel_trace.txt", "w");
  if (!f) return;
  std::lock_guard<std::mutex> lock(records_mutex);
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) { return a.start < b.start; });
  for (const Record& r : records)
    std::fprintf(f, "%llu %llu %u %u %u %u %u %u %s\n", static_cast<unsigned long long>(r.start),
                 static_cast<unsigned long long>(r.end), r.grid[0], r.grid[1], r.grid[2], r.block_x, r.registers,
                 r.correlation, r.name.c_str());
  std::fclose(f);
  if (api_records.empty()) return;
  FILE* api = std::fopen((std::string(path ? path : "kernel_trace.txt") + ".api").c_str(), "w");
  if (!api) return;
  for (const ApiRecord& a : api_records)
    std::fprintf(api, "%llu %llu %u %u\n", static_cast<unsigned long long>(a.start),
                 static_cast<unsigned long long>(a.end), a.callback, a.correlation);
  std::fclose(api);
}

}  // namespace

extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  // The runtime calls slow the host (a decode step's issue 1.2-1.4 ms -> 2.2 ms on the GPU machine).
  if (const char* api = std::getenv("KERNEL_TRACE_API"); api && api[0] == '1' &&
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS)
    return 0;
  std::atexit(write_records);
  return 1;
}
