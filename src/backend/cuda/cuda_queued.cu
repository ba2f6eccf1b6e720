// Queued decode steps (Session::queue_step): a step is issued before its token is known and reads
// that token (and its n-gram rows) from a mailbox in mapped host memory when the device reaches
// it. The kernel that reads a mailbox first waits on the device until the host has released it,
// so the host can issue step t+1 while the device runs step t, and the device starts step t+1 a
// PCIe round trip after its token is given rather than after the host has issued all of it.
// While such a read waits, the host must not wait for the stream (wait_stream refuses). Each
// step's logits come back by read_later: a copy queued behind the step into pinned memory. A step
// graph (cuda_step_graph.cuh) sends such a step whole.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>

#include "backend/cuda/cuda_backend_impl.cuh"

namespace regolith::cuda {

class CudaMailbox final : public HostMailbox {
 public:
  CudaMailbox(CudaBackend& backend, size_t bytes) : backend_(backend), size_(bytes) {
    check(cudaHostAlloc(reinterpret_cast<void**>(&host_), kHeader + bytes, cudaHostAllocMapped), "cudaHostAlloc (mailbox)");
    std::memset(host_, 0, kHeader + bytes);
    check(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_), host_, 0), "cudaHostGetDevicePointer");
    backend_.add_mailbox(this);
  }
  ~CudaMailbox() override {
    backend_.remove_mailbox(this);
    if (reads_waiting_) release();             // the device would wait for it forever
    cudaStreamSynchronize(backend_.stream());  // no queued read is left to run on freed memory
    cudaFreeHost(host_);
  }
  std::span<uint8_t> bytes() override { return {host_ + kHeader, size_}; }
  void release() override {
    std::atomic_ref<uint32_t>(*reinterpret_cast<uint32_t*>(host_)).store(++released_, std::memory_order_release);
    reads_waiting_ = false;
  }
  // A read queued now waits for the next release.
  uint32_t read_queued() {
    reads_waiting_ = true;
    return released_ + 1;
  }
  bool awaits_release() const { return reads_waiting_; }
  const uint32_t* device_counter() const { return reinterpret_cast<const uint32_t*>(device_); }
  const uint8_t* device_bytes() const { return device_ + kHeader; }

 private:
  static constexpr size_t kHeader = 64;  // the release counter, on its own line before the bytes
  CudaBackend& backend_;
  size_t size_;
  uint8_t* host_ = nullptr;
  uint8_t* device_ = nullptr;  // the same memory, as the device addresses it
  uint32_t released_ = 0;
  bool reads_waiting_ = false;
};

class CudaPendingRead final : public PendingRead {
 public:
  CudaPendingRead(CudaBackend& backend, CudaBackend::ReadSlot& slot, size_t n) : backend_(backend), slot_(slot), n_(n) {}
  ~CudaPendingRead() override {
    cudaEventSynchronize(slot_.landed);  // the slot is reused only once its copy has landed
    slot_.busy = false;
  }
  std::span<const float> wait() override {
    check(cudaEventSynchronize(slot_.landed), "read (a kernel before it failed)");
    backend_.landed_ = std::max(backend_.landed_, slot_.staged);
    return {slot_.host, n_};
  }

 private:
  CudaBackend& backend_;
  CudaBackend::ReadSlot& slot_;
  size_t n_;
};

namespace {

constexpr int kThreads = 256;

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

bool CudaBackend::awaits_release() const {
  return std::any_of(mailboxes_.begin(), mailboxes_.end(), [](const CudaMailbox* m) { return m->awaits_release(); });
}

// Only with step graphs: on the stream a queued step's receive kernel would start waiting as soon
// as it is issued, while the host still issues the rest of the step, and a host call there that
// waits for the device (a first use's allocation or upload) would wait forever. On an H200,
// `regolith run` with REGOLITH_CUDA_GRAPHS=0 hung so. A step graph goes out once it is recorded.
std::unique_ptr<HostMailbox> CudaBackend::mailbox(size_t bytes) {
  if (!queued_steps_ || !recorder_) return nullptr;
  auto m = std::make_unique<CudaMailbox>(*this, bytes);
  const size_t wanted = (mailboxes_.size() + 1) / 2 * 3;
  if (read_slots_.size() < wanted) add_read_slots(wanted - read_slots_.size());
  return m;
}

void CudaBackend::add_read_slots(size_t n) {
  for (size_t i = 0; i < n; ++i) {
    ReadSlot& slot = read_slots_.emplace_back();
    check(cudaMallocHost(reinterpret_cast<void**>(&slot.host), kReadBufferBytes), "cudaMallocHost");
    check(cudaEventCreateWithFlags(&slot.landed, cudaEventDisableTiming), "cudaEventCreate");
  }
}

void CudaBackend::receive(HostMailbox& from, size_t offset, Tensor& dst) {
  OpScope scope(profiler_, "receive", -1, stream_);
  auto* mailbox = dynamic_cast<CudaMailbox*>(&from);
  if (!mailbox) fail("receive: not a mailbox of the cuda backend");
  check_receive(from, offset, dst);
  if (offset % 4) fail("receive: offset ", offset, " is not a whole word");
  const size_t bytes = dst.n_bytes();
  q8_output_ = {};
  if (recording_) recorder_->whole_step();
  const auto n = static_cast<int64_t>(bytes / 4);
  launch(stream_, "receive_kernel", receive_kernel, blocks_for(n, kThreads), kThreads, 0, mailbox->device_counter(),
         mailbox->read_queued(), reinterpret_cast<const uint32_t*>(mailbox->device_bytes() + offset),
         static_cast<uint32_t*>(dst.data()), n);
}

CudaBackend::ReadSlot* CudaBackend::free_read_slot() {
  auto slot = std::find_if(read_slots_.begin(), read_slots_.end(), [](const ReadSlot& s) { return !s.busy; });
  return slot == read_slots_.end() ? nullptr : &*slot;
}

void CudaBackend::drop_early_read() {
  if (early_read_.slot) early_read_.slot->busy = false;  // a later copy into it follows the early one
  early_read_ = {};
}

std::unique_ptr<PendingRead> CudaBackend::read_later(const Tensor& src) {
  if (src.dtype() != DType::F32) fail("read_later on a non-F32 tensor");
  const size_t bytes = src.n_bytes();
  ReadSlot* slot = nullptr;
  int64_t skip = 0;
  if (early_read_.values == src.f32() && early_read_.n == src.n_elements()) {
    // The product's first rows are on their way already (mul_mat): the rest follows into their
    // slot, which stays busy for this read.
    slot = early_read_.slot, skip = early_read_.first;
    early_read_ = {};
  }
  drop_early_read();
  if (bytes > kReadBufferBytes) return Backend::read_later(src);  // read now
  if (!slot) slot = free_read_slot();
  if (!slot) {
    // More sessions than slots: one more, unless a queued read waits (a pinned allocation may wait
    // for the device); then this read happens now, or fails in wait_stream.
    if (awaits_release()) return Backend::read_later(src);
    add_read_slots(1);
    slot = &read_slots_.back();
  }
  flush();
  resume_graphs();
  check(cudaMemcpyAsync(slot->host + skip, src.f32() + skip, bytes - static_cast<size_t>(skip) * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        "read");
  check(cudaEventRecord(slot->landed, stream_), "cudaEventRecord");
  slot->staged = staged_;
  slot->busy = true;
  return std::make_unique<CudaPendingRead>(*this, *slot, static_cast<size_t>(src.n_elements()));
}

}  // namespace regolith::cuda
