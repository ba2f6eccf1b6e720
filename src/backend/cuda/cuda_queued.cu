// Queued decode steps (Session::queue_step): a step is issued before its token is known and reads
// that token (and its n-gram rows) from a mailbox in mapped host memory when the device reaches
// it. The first kernel that reads a mailbox waits on the device until the host has released it,
// so the host issues step t+1 while the device runs step t, and the device starts step t+1 a
// PCIe round trip after the host gives its token, instead of after the host has issued it.
// Each step's logits come back by read_later: a copy queued behind the step into pinned memory.
#include <atomic>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace regolith::cuda {

namespace {

constexpr int kThreads = 256;
constexpr size_t kMailboxHeader = 64;  // the release counter, on its own line before the bytes

class CudaMailbox final : public HostMailbox {
 public:
  CudaMailbox(cudaStream_t stream, size_t bytes) : stream_(stream), size_(bytes) {
    check(cudaHostAlloc(reinterpret_cast<void**>(&host_), kMailboxHeader + bytes, cudaHostAllocMapped),
          "cudaHostAlloc (mailbox)");
    std::memset(host_, 0, kMailboxHeader + bytes);
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0), "cudaHostGetDevicePointer");
  }
  ~CudaMailbox() override {
    cudaStreamSynchronize(stream_);  // no queued read is left to run on freed memory
    cudaFreeHost(host_);
  }
  std::span<uint8_t> bytes() override { return {host_ + kMailboxHeader, size_}; }
  void release() override {
    std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(host_)).store(++released_, std::memory_order_release);
  }
  // What a read queued now waits for: the next release.
  uint32_t next_release() const { return released_ + 1; }
  const uint32_t* device_counter() const { return reinterpret_cast<const uint32_t*>(device_); }
  const uint8_t* device_bytes() const { return device_ + kMailboxHeader; }
  size_t size() const { return size_; }

 private:
  cudaStream_t stream_;
  size_t size_;
  uint8_t* host_ = nullptr;
  uint8_t* device_ = nullptr;  // the same memory, as the device addresses it
  uint32_t released_ = 0;
};

class CudaPendingRead final : public PendingRead {
 public:
  // busy: the slot's flag, cleared when this read is dropped.
  CudaPendingRead(float* host, size_t n, cudaEvent_t landed, bool* busy)
      : host_(host), n_(n), landed_(landed), busy_(busy) {}
  ~CudaPendingRead() override {
    cudaEventSynchronize(landed_);  // the slot is reused only once its copy has landed
    *busy_ = false;
  }
  std::span<const float> wait() override {
    check(cudaEventSynchronize(landed_), "read (a kernel before it failed)");
    return {host_, n_};
  }

 private:
  float* host_;
  size_t n_;
  cudaEvent_t landed_;
  bool* busy_;
};

__device__ __forceinline__ uint32_t load_acquire_system(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// dst[i] = src[i] for n words of mapped host memory, once the host's release counter has reached
// `release`. Thread 0 of each block waits; the words are read past the caches (the host rewrites
// them every other step).
__global__ void receive_kernel(const uint32_t* counter, uint32_t release, const uint32_t* src, uint32_t* dst,
                               int64_t n) {
  grid_dependency_wait();
  if (threadIdx.x == 0)
    while (load_acquire_system(counter) < release) __nanosleep(128);
  __syncthreads();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __ldcv(src + i);
}

}  // namespace

std::unique_ptr<HostMailbox> CudaBackend::mailbox(size_t bytes) { return std::make_unique<CudaMailbox>(stream_, bytes); }

void CudaBackend::receive(HostMailbox& from, size_t offset, Tensor& dst) {
  OpScope scope(profiler_, "receive", -1, stream_);
  auto* mailbox = dynamic_cast<CudaMailbox*>(&from);
  if (!mailbox) fail("receive: not a mailbox of the cuda backend");
  const size_t bytes = dst.n_bytes();
  if (offset % 4 || offset + bytes > mailbox->size())
    fail("receive: ", bytes, " bytes at ", offset, " of a ", mailbox->size(), "-byte mailbox");
  q8_output_ = {};
  const auto n = static_cast<int64_t>(bytes / 4);
  launch(stream_, "receive_kernel", receive_kernel, blocks_for(n, kThreads), kThreads, 0, mailbox->device_counter(),
         mailbox->next_release(), reinterpret_cast<const uint32_t*>(mailbox->device_bytes() + offset),
         static_cast<uint32_t*>(dst.data()), n);
}

std::unique_ptr<PendingRead> CudaBackend::read_later(const Tensor& src) {
  if (src.dtype() != DType::F32) fail("read_later on a non-F32 tensor");
  flush();
  resume_graphs();
  const size_t bytes = src.n_bytes();
  ReadSlot* slot = nullptr;
  for (const auto& s : read_slots_)
    if (!s->busy && s->bytes >= bytes) slot = s.get();
  if (!slot) {
    read_slots_.push_back(std::make_unique<ReadSlot>());
    slot = read_slots_.back().get();
    check(cudaMallocHost(reinterpret_cast<void**>(&slot->host), bytes), "cudaMallocHost");
    slot->bytes = bytes;
    check(cudaEventCreateWithFlags(&slot->landed, cudaEventDisableTiming), "cudaEventCreate");
  }
  check(cudaMemcpyAsync(slot->host, src.data(), bytes, cudaMemcpyDeviceToHost, stream_), "read");
  check(cudaEventRecord(slot->landed, stream_), "cudaEventRecord");
  slot->busy = true;
  return std::make_unique<CudaPendingRead>(slot->host, static_cast<size_t>(src.n_elements()), slot->landed,
                                           &slot->busy);
}

}  // namespace regolith::cuda
