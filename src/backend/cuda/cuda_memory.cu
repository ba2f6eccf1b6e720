// CUDA backend memory: the device, its stream, pooled tensor storage, host transfers and the
// upload-once weight caches.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "quant/blocks.h"
#include "quant/rows.h"

namespace regolith {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(!options.exact_products);
}

namespace cuda {

namespace {

constexpr size_t kStagingBytes = 16u << 20;

// A small stream-ordered device copy (a cache append) as a kernel rather than cudaMemcpyAsync: it
// takes part in programmatic dependent launch, where a copy between two kernels stalls the stream.
__global__ void copy_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n) {
  grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

// Size classes: 256-byte steps up to 64 KiB, then powers of two (caches grow by doubling).
size_t size_class(size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  if (bytes <= (64u << 10)) return (bytes + 255) & ~size_t{255};
  size_t c = 64u << 10;
  while (c < bytes) c <<= 1;
  return c;
}

uint64_t fnv1a(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

DevicePool::~DevicePool() {
  for (auto& [size, list] : free_)
    for (void* p : list) cudaFree(p);
}

void* DevicePool::get(size_t bytes, size_t& rounded) {
  rounded = size_class(bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(rounded);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= rounded;
      return p;
    }
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, rounded);
  if (e != cudaSuccess) {
    // Give the cached buffers back to the driver and try once more before failing.
    cudaGetLastError();
    if (before_release) before_release();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [size, list] : free_)
      for (void* q : list) cudaFree(q);
    free_.clear();
    cached_bytes_ = 0;
    check(cudaMalloc(&p, rounded), "cudaMalloc");
  }
  return p;
}

void DevicePool::put(void* p, size_t rounded) {
  std::lock_guard<std::mutex> lock(mu_);
  free_[rounded].push_back(p);
  cached_bytes_ += rounded;
}

std::optional<uint64_t> CudaBackend::memory_available() const {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return static_cast<uint64_t>(free + pool_->cached_bytes());
}

namespace {

bool env_is(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v && std::string_view(v) == value;
}

// Step graphs unless REGOLITH_CUDA_GRAPHS=0, or REGOLITH_CUDA_PROFILE=1 alone (its op times need
// the stream's launches).
bool step_graphs_wanted() {
  return !env_is("REGOLITH_CUDA_GRAPHS", "0") &&
         (!env_is("REGOLITH_CUDA_PROFILE", "1") || env_is("REGOLITH_CUDA_GRAPHS", "1"));
}

// The longest piece of a step graph: REGOLITH_CUDA_GRAPH_PIECE (tests send pieces of 8), else 128.
// H200, decode paired in one call, three rounds: the stream 251.0 / 250.5 / 249.3 tok/s; pieces of
// 32: 248.9 / 243.1 / 241.7; 64: 248.9 / 254.6 / 253.1; 128: 253.3 / 255.7 / 256.1. In another
// call 128: 261.8 / 260.5 / 259.7, 256: 261.7 / 253.8 / 256.0, 512: 262.0 / 255.3 / 254.2.
size_t graph_piece_nodes() {
  const char* v = std::getenv("REGOLITH_CUDA_GRAPH_PIECE");
  const unsigned long n = v ? std::strtoul(v, nullptr, 10) : 0;
  return n > 0 ? n : 128;
}

}  // namespace

CudaBackend::CudaBackend(bool int8_products)
    : int8_products_(int8_products),
      pool_(std::make_shared<DevicePool>()),
      profiler_(env_is("REGOLITH_CUDA_PROFILE", "1") && !step_graphs_wanted()) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0)
    fail("cuda backend: no CUDA device (", e != cudaSuccess ? cudaGetErrorString(e) : "none found", ")");
  check(cudaSetDevice(device_), "cudaSetDevice");
  check(upload_iq_grids(), "upload of the I-quant grids");
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  add_read_slots(3);
  check(cudaMallocHost(reinterpret_cast<void**>(&staging_), kStagingBytes), "cudaMallocHost");
  check(cudaMallocHost(reinterpret_cast<void**>(&read_buffer_), kReadBufferBytes), "cudaMallocHost");
  check(cudaEventCreateWithFlags(&gather_copied_, cudaEventDisableTiming), "cudaEventCreate");
  for (cudaEvent_t& e : read_landed_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaMalloc(&counters_, kCounters * sizeof(unsigned)), "cudaMalloc");
  check(cudaMemset(counters_, 0, kCounters * sizeof(unsigned)), "cudaMemset");
  // Programmatic dependent launch (sm_90+) unless REGOLITH_CUDA_PDL=0, on the stream or as the
  // step graphs' edges.
  int major = 0;
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_), "cudaDeviceGetAttribute");
  programmatic_ = major >= 9 && !env_is("REGOLITH_CUDA_PDL", "0");
  queued_steps_ = !env_is("REGOLITH_CUDA_QUEUED", "0");
  if (step_graphs_wanted()) {
    recorder_ = std::make_unique<StepRecorder>(stream_, env_is("REGOLITH_CUDA_PROFILE", "1"), programmatic_,
                                               graph_piece_nodes());
    profiler_.on_op_over(kMatvecMaxTokens, [this] { leave_graphs(); });
    pool_->before_release = [this] {
      flush();
      wait_stream("release of cached buffers");
    };
  }
  attach_hooks(recorder_ != nullptr);
}

CudaBackend::~CudaBackend() {
  pool_->before_release = nullptr;  // tensors may outlive the backend
  try {
    flush();
  } catch (const Error&) {
    // The recorded work of a failed step is lost with the backend anyway.
  }
  cudaStreamSynchronize(stream_);
  set_hooks(stream_, {});
  recorder_.reset();
  for (void* p : weight_buffers_) cudaFree(p);
  cudaFreeHost(staging_);
  cudaFreeHost(read_buffer_);
  cudaFreeHost(gather_);
  cudaEventDestroy(gather_copied_);
  for (cudaEvent_t e : read_landed_) cudaEventDestroy(e);
  for (const ReadSlot& slot : read_slots_) cudaFreeHost(slot.host), cudaEventDestroy(slot.landed);
  cudaStreamDestroy(upload_stream_);
  cudaFree(counters_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::flush() {
  if (recorder_) recorder_->submit();
}

void CudaBackend::attach_hooks(bool record) {
  recording_ = record;
  set_hooks(stream_, {record ? recorder_.get() : nullptr, profiler_.enabled() ? &profiler_ : nullptr,
                      programmatic_ && !record});
}

void CudaBackend::leave_graphs() {
  if (!recording_) return;
  recorder_->submit();
  // Drained, so that the stream's first programmatic launch follows no graph (a prefill step's
  // first ops: microseconds).
  wait_stream("step graphs before a prefill");
  attach_hooks(false);
}

void CudaBackend::wait_stream(const char* what) {
  if (awaits_release())
    fail("cuda: ", what, " would wait for a queued step that waits for its token (give it first)");
  check(cudaStreamSynchronize(stream_), cat(what, " (a kernel before it failed)").c_str());
}

void CudaBackend::resume_graphs() {
  if (recorder_ && !recording_) attach_hooks(true);
}

Tensor CudaBackend::alloc_raw(DType dtype, std::array<int64_t, 4> ne, bool zero) {
  int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
  if (n < 0 || ne[0] < 0 || ne[1] < 0 || ne[2] < 0 || ne[3] < 0) fail("alloc: negative shape");
  size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_bytes(dtype), rounded = 0;
  void* p = pool_->get(bytes, rounded);
  if (p == early_read_.values) drop_early_read();  // another tensor's now: its early copy is stale
  if (zero) {
    memset_async(p, bytes, stream_);
    q8_output_ = {};  // the buffer may be an earlier output's
  }
  std::shared_ptr<DevicePool> pool = pool_;
  return Tensor(dtype, ne, std::shared_ptr<void>(p, [pool, rounded](void* q) { pool->put(q, rounded); }));
}

Tensor CudaBackend::alloc(DType dtype, std::array<int64_t, 4> ne) { return alloc_raw(dtype, ne, true); }

void CudaBackend::upload_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (bytes > kStagingBytes / 4) {
    // From pageable memory the copy is staged before the call returns, so src may go right after.
    flush();
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
    return;
  }
  const size_t need = (bytes + 255) & ~size_t{255};
  uint64_t at = staged_;
  if (at % kStagingBytes + need > kStagingBytes) at += kStagingBytes - at % kStagingBytes;  // from the ring's start
  if (at + need - landed_ > kStagingBytes) {  // would overwrite a copy that may not have landed
    flush();
    wait_stream("upload");
    landed_ = at;
  }
  uint8_t* p = staging_ + at % kStagingBytes;
  std::memcpy(p, src, bytes);
  staged_ = at + need;
  memcpy_async(dst, p, bytes, cudaMemcpyHostToDevice, stream_, "upload");
}

void CudaBackend::upload_gathered(void* dst, size_t bytes, const std::function<void(uint8_t* host)>& fill) {
  if (bytes == 0) return;
  if (bytes <= kStagingBytes / 4) {
    std::vector<uint8_t> host(bytes);
    fill(host.data());
    upload_bytes(dst, host.data(), bytes);
    return;
  }
  check(cudaEventSynchronize(gather_copied_), "upload of gathered rows (a kernel before it failed)");
  if (bytes > gather_bytes_) {
    cudaFreeHost(gather_);
    gather_ = nullptr, gather_bytes_ = 0;
    check(cudaMallocHost(reinterpret_cast<void**>(&gather_), bytes), "cudaMallocHost");
    gather_bytes_ = bytes;
  }
  fill(gather_);
  flush();
  check(cudaMemcpyAsync(dst, gather_, bytes, cudaMemcpyHostToDevice, stream_), "upload of gathered rows");
  check(cudaEventRecord(gather_copied_, stream_), "cudaEventRecord");
}

const void* CudaBackend::cached_upload_bytes(const void* src, size_t bytes) {
  constexpr size_t kKept = 8;
  const auto* p = static_cast<const uint8_t*>(src);
  auto hit = std::find_if(uploads_.begin(), uploads_.end(), [&](const CachedUpload& u) {
    return u.bytes.size() == bytes && std::equal(p, p + bytes, u.bytes.begin());
  });
  if (hit == uploads_.end()) {
    if (uploads_.size() == kKept) uploads_.pop_back();  // its buffer returns to the pool in stream order
    uploads_.push_back({std::vector<uint8_t>(p, p + bytes), upload_scratch(std::span<const uint8_t>(p, bytes))});
    hit = uploads_.end() - 1;
  }
  std::rotate(uploads_.begin(), hit, hit + 1);
  return uploads_.front().device.f32();
}

void CudaBackend::write(Tensor& dst, const void* src, size_t bytes) {
  if (bytes > dst.n_bytes()) fail("write: ", bytes, " bytes into ", dst.shape_string());
  q8_output_ = {};
  upload_bytes(dst.data(), src, bytes);
}

void CudaBackend::read(const Tensor& src, void* dst, size_t bytes) {
  if (bytes > src.n_bytes()) fail("read: ", bytes, " bytes from ", src.shape_string());
  if (awaits_release()) fail("cuda: a read would wait for a queued step that waits for its token (give it first)");
  flush();
  resume_graphs();
  if (bytes > kReadBufferBytes) {
    check(cudaMemcpyAsync(dst, src.data(), bytes, cudaMemcpyDeviceToHost, stream_), "read");
    wait_stream("read");
  } else {
    // Small reads land in pinned memory first (into pageable memory the driver stages the copy
    // itself: a decode step's logits, 1 MB, took about 3% longer to come back that way), in pieces
    // of at least 64 KB, each copied out while the next is still on its way.
    const size_t n = read_landed_.size(), piece = std::max<size_t>(64u << 10, (bytes + n - 1) / n);
    const auto* from = static_cast<const uint8_t*>(src.data());
    for (size_t at = 0, i = 0; at < bytes; at += piece, ++i) {
      check(cudaMemcpyAsync(read_buffer_ + at, from + at, std::min(piece, bytes - at), cudaMemcpyDeviceToHost, stream_), "read");
      check(cudaEventRecord(read_landed_[i], stream_), "cudaEventRecord");
    }
    for (size_t at = 0, i = 0; at < bytes; at += piece, ++i) {
      check(cudaEventSynchronize(read_landed_[i]), "read (a kernel before it failed)");
      std::memcpy(static_cast<uint8_t*>(dst) + at, read_buffer_ + at, std::min(piece, bytes - at));
    }
  }
  profiler_.collect();
  landed_ = staged_;  // every staged upload has landed
}

void CudaBackend::copy(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) {
  OpScope scope(profiler_, "copy", -1, stream_);
  if (src.dtype() != dst.dtype()) fail("copy: dtypes differ");
  if (n < 0 || src_off < 0 || dst_off < 0 || src_off + n > src.n_elements() || dst_off + n > dst.n_elements())
    fail("copy: range [", src_off, ", +", n, ") of ", src.shape_string(), " to [", dst_off, ", +", n, ") of ",
         dst.shape_string(), " is out of bounds");
  if (n == 0) return;
  // Large (a cache growing, bench's copy bandwidth): straight to the stream, where a 1 GiB copy
  // ran at 4,149 GB/s on an H200 and as a graph's copy node at 2,714. Not FP32-sized: the copy
  // engine, in a step graph or not.
  const size_t size = dtype_bytes(src.dtype()), bytes = static_cast<size_t>(n) * size;
  if (n >= (int64_t{1} << 20)) {
    flush();
    check(cudaMemcpyAsync(dst.data(dst_off), src.data(src_off), bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
    return;
  }
  if (size != sizeof(float)) {
    memcpy_async(dst.data(dst_off), src.data(src_off), bytes, cudaMemcpyDeviceToDevice, stream_, "copy");
    return;
  }
  launch(stream_, "copy_kernel", copy_kernel, blocks_for(n, 256), 256, 0, src.f32() + src_off, dst.f32() + dst_off, n);
}

// The bytes of a weight can change behind one pointer only when the host frees and reuses it
// (tests do); the shape, type and a sample of the first and last bytes tell such weights apart.
CudaBackend::WeightKey CudaBackend::key_of(const Weight& w) {
  uint64_t bytes = w.row_bytes * static_cast<uint64_t>(w.n_rows());
  size_t head = static_cast<size_t>(std::min<uint64_t>(bytes, 64));
  uint64_t h = fnv1a(0xcbf29ce484222325ull, w.data, head);
  h = fnv1a(h, w.data + bytes - head, head);
  return {w.data, w.type, w.ne[0], w.ne[1], w.ne[2], w.ne[3], h};
}

namespace {

// Host rows [r0, r1) of w in the device layout: rows padded to `pitch` bytes, Q8_0 rows as their
// codes followed by their scales (cuda_quant.cuh), other types as stored.
void to_device_layout(const Weight& w, int64_t r0, int64_t r1, uint64_t pitch, uint8_t* out) {
  std::memset(out, 0, static_cast<size_t>((r1 - r0) * pitch));
  const int64_t K = w.ne[0];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* src = w.data + static_cast<uint64_t>(r) * w.row_bytes;
    uint8_t* dst = out + static_cast<uint64_t>(r - r0) * pitch;
    if (w.type != GgmlType::Q8_0) {
      std::memcpy(dst, src, w.row_bytes);
      continue;
    }
    const auto* blocks = reinterpret_cast<const quant::BlockQ8_0*>(src);
    for (int64_t b = 0; b < K / 32; ++b) {
      std::memcpy(dst + b * 32, blocks[b].qs, 32);
      std::memcpy(dst + K + b * 2, &blocks[b].d, 2);
    }
  }
}

}  // namespace

const DeviceMatrix& CudaBackend::matrix(const Weight& w) {
  if (!w.present()) fail("cuda: weight ", w.name, " is missing");
  WeightKey key = key_of(w);
  auto it = matrices_.find(key);
  if (it != matrices_.end()) return it->second;
  DeviceMatrix m{nullptr, w.type, w.row_bytes, w.ne[0], w.n_rows()};
  profiler_.exclude_open();
  void* p = nullptr;
  if (has_device_decoder(w.type)) {
    // Staged through a bounded host buffer, whatever the tensor's size.
    m.row_bytes = (w.row_bytes + 15) / 16 * 16;
    check(cudaMalloc(&p, std::max<size_t>(m.row_bytes * static_cast<size_t>(m.n_rows), 16)), "cudaMalloc (weight)");
    const int64_t rows_per_step = std::max<int64_t>(1, static_cast<int64_t>((64u << 20) / m.row_bytes));
    std::vector<uint8_t> host(static_cast<size_t>(std::min(rows_per_step, m.n_rows) * m.row_bytes));
    for (int64_t r0 = 0; r0 < m.n_rows; r0 += rows_per_step) {
      int64_t r1 = std::min(m.n_rows, r0 + rows_per_step);
      to_device_layout(w, r0, r1, m.row_bytes, host.data());
      check(cudaMemcpyAsync(static_cast<uint8_t*>(p) + r0 * m.row_bytes, host.data(), (r1 - r0) * m.row_bytes,
                            cudaMemcpyHostToDevice, upload_stream_),
            "upload weight");
      check(cudaStreamSynchronize(upload_stream_), "upload weight");  // before the buffer is refilled
    }
  } else {
    // No device decoder yet: dequantize once on the host and keep F32 rows.
    std::vector<float> f(static_cast<size_t>(w.n_elements()));
    for (int64_t r = 0; r < w.n_rows(); ++r) dequantize_row(w.type, w.data + r * w.row_bytes, w.ne[0], f.data() + r * w.ne[0]);
    check(cudaMalloc(&p, std::max<size_t>(f.size() * 4, 4)), "cudaMalloc (weight)");
    check(cudaMemcpyAsync(p, f.data(), f.size() * 4, cudaMemcpyHostToDevice, upload_stream_), "upload weight");
    check(cudaStreamSynchronize(upload_stream_), "upload weight");
    m.type = GgmlType::F32;
    m.row_bytes = static_cast<uint64_t>(w.ne[0]) * 4;
  }
  weight_buffers_.push_back(p);
  m.data = static_cast<const uint8_t*>(p);
  return matrices_.emplace(key, m).first->second;
}

const float* CudaBackend::values(const Weight& w) {
  if (!w.present()) fail("cuda: weight ", w.name, " is missing");
  WeightKey key = key_of(w);
  auto it = vectors_.find(key);
  if (it != vectors_.end()) return it->second;
  std::vector<float> f(static_cast<size_t>(w.n_elements()));
  for (int64_t r = 0; r < w.n_rows(); ++r) dequantize_row(w.type, w.data + r * w.row_bytes, w.ne[0], f.data() + r * w.ne[0]);
  void* p = nullptr;
  profiler_.exclude_open();
  check(cudaMalloc(&p, std::max<size_t>(f.size() * 4, 4)), "cudaMalloc (weight)");
  check(cudaMemcpyAsync(p, f.data(), f.size() * 4, cudaMemcpyHostToDevice, upload_stream_), "upload weight");
  check(cudaStreamSynchronize(upload_stream_), "upload weight");
  weight_buffers_.push_back(p);
  return vectors_.emplace(key, static_cast<const float*>(p)).first->second;
}

}  // namespace cuda
}  // namespace regolith
