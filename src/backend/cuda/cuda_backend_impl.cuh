// The CUDA backend (ops.h on one device). Tensors are device memory from a stream-ordered pool;
// every op runs on the backend's one stream, so a freed buffer can be handed out again at once.
// Weights are uploaded once, keyed by (data pointer, type, shape, a sample of the bytes): matrix
// weights keep their ggml block layout and are decoded in the kernels (cuda_quant.cuh); small
// parameter vectors (norm gammas, conv taps, gates) are kept as F32. Activations and the GDN state
// are FP32. This first cut favours plain kernels that mirror the reference op by op; fusion and
// tensor-core GEMMs come later, each against the same op tests.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backend/ops.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_int8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_profile.cuh"
#include "backend/cuda/cuda_step_graph.cuh"

namespace regolith::cuda {

// Device buffers recycled by size class. Safe because every kernel runs on one stream: a buffer
// released on the host is reused only by work queued after everything that used it.
class DevicePool {
 public:
  ~DevicePool();
  // Called before cached buffers go back to the driver (when memory runs out), so that recorded
  // work that still uses them reaches the device first.
  std::function<void()> before_release;
  void* get(size_t bytes, size_t& rounded);
  void put(void* p, size_t rounded);
  size_t cached_bytes() const { return cached_bytes_.load(); }  // free buffers held for reuse

 private:
  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  std::atomic<size_t> cached_bytes_{0};
};

// A matrix weight as the kernels read it: rows of row_bytes in `type`'s block layout.
struct DeviceMatrix {
  const uint8_t* data = nullptr;
  GgmlType type = GgmlType::F32;
  uint64_t row_bytes = 0;
  int64_t K = 0, n_rows = 0;
};

class CudaMailbox;  // cuda_queued.cu

class CudaBackend final : public Backend {
 public:
  // int8_products: prefill products with weights of the int8 tile's types quantize their
  // activations (cuda_gemm_int8.cuh); else every product keeps FP32 activations.
  explicit CudaBackend(bool int8_products = true);
  ~CudaBackend() override;
  std::string_view name() const override { return "cuda"; }

  Tensor alloc(DType dtype, std::array<int64_t, 4> ne) override;
  Tensor alloc_output(DType dtype, std::array<int64_t, 4> ne) override { return alloc_raw(dtype, ne, false); }
  void write(Tensor& dst, const void* src, size_t bytes) override;
  void read(const Tensor& src, void* dst, size_t bytes) override;
  void copy(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) override;
  std::optional<uint64_t> memory_available() const override;  // device free memory + the pool's free buffers

  void get_rows(const Weight& table, std::span<const int64_t> ids, Tensor& out) override;
  void get_rows_by(const Weight& table, const Tensor& ids, Tensor& out) override;
  // cuda_queued.cu: queued steps' inputs (mapped host memory) and their logits' reads. No
  // mailboxes without step graphs or with REGOLITH_CUDA_QUEUED=0 (a queued step then runs when its
  // token is given).
  std::unique_ptr<PendingRead> read_later(const Tensor& src) override;
  std::unique_ptr<HostMailbox> mailbox(size_t bytes) override;
  void receive(HostMailbox& from, size_t offset, Tensor& dst) override;
  // A mailbox's life (it registers itself): the host must not wait for the stream while a read
  // queued on a mailbox waits for the host to release it (wait_stream).
  void add_mailbox(CudaMailbox* m) { mailboxes_.push_back(m); }
  void remove_mailbox(CudaMailbox* m) { std::erase(mailboxes_, m); }
  void mul_mat(const Weight& w, const Tensor& x, Tensor& out) override;
  void mul_mat_shared_input(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor* const> outs) override;
  void argmax(const Tensor& x, Tensor& ids) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void repeat_streams(const Tensor& x, int64_t n_streams, Tensor& out) override;
  void rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out) override;
  void rope(Tensor& x, std::span<const int64_t> positions, int64_t n_rot, float theta) override;
  void swiglu(const Tensor& g, const Tensor& u, Tensor& out) override;
  void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& s) override;
  void causal_conv(const Tensor& x, Tensor& history, const Weight& w, int64_t dilation, Tensor& out) override;
  void causal_conv_columns(const Tensor& x, std::span<Tensor* const> histories, const Weight& w, int64_t dilation,
                           Tensor& out) override;

  void hc_read(const HcReadArgs& a) override;
  void hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) override;
  void hc_write_read(Tensor& R, const Tensor& y, const Tensor& inject_w, const HcReadArgs& a) override;

  void gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias, Tensor& g,
                 Tensor& beta) override;
  void gdn_recurrent(const GdnScanArgs& a) override;
  void gdn_chunked(const GdnScanArgs& a) override;
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) override;
  void gdn_core(const GdnCoreArgs& a) override;
  void gdn_core_columns(const GdnCoreArgs& a, std::span<Tensor* const> states) override;

  void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) override;
  void qsa_prepare(const QsaPrepareArgs& a) override;
  void qsa_pool(const QsaPoolArgs& a) override;
  void qsa_select(const QsaSelectArgs& a) override;
  void qsa_attend(const QsaAttendArgs& a) override;

  void moe_route(const Tensor& logits, int64_t k, Tensor& ids, Tensor& weights) override;
  void moe_experts(const MoeExpertsArgs& a) override;
  void moe_ffn(const MoeFfnArgs& a) override;

  void ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) override;
  void ple_inject(const PleInjectArgs& a) override;

  // ---- for the op files ----
  cudaStream_t stream() const { return stream_; }
  // The weight on the device, uploaded on first use.
  const DeviceMatrix& matrix(const Weight& w);
  // All values of a (small) weight as F32 on the device.
  const float* values(const Weight& w);
  // A scratch buffer from the pool, released (stream-ordered) when the returned tensor goes.
  Tensor scratch_f32(int64_t n) { return alloc_raw(DType::F32, {n, 1, 1, 1}, false); }
  Tensor scratch_bytes(size_t bytes) { return alloc_raw(DType::F32, {static_cast<int64_t>((bytes + 3) / 4), 1, 1, 1}, false); }
  // Scratch for n activations quantized for the int8 products (codes, and a scale pair a chunk).
  QuantizedActivations q8_scratch(int64_t n) { return {scratch_bytes(static_cast<size_t>(n)), scratch_f32(n / 32 * 2)}; }
  // Host values copied into a scratch buffer (positions, ids).
  template <typename T>
  Tensor upload_scratch(std::span<const T> v) {
    Tensor t = scratch_bytes(std::max<size_t>(v.size_bytes(), 4));
    upload_bytes(t.f32(), v.data(), v.size_bytes());
    return t;
  }
  // Host values the kernels read again and again (RoPE frequencies, a step's positions), uploaded
  // once per distinct content: the last few stay on the device, so repeated ops add no copies.
  template <typename T>
  const T* cached_upload(std::span<const T> v) {
    return static_cast<const T*>(cached_upload_bytes(v.data(), v.size_bytes()));
  }
  const void* cached_upload_bytes(const void* src, size_t bytes);
  // n device counters at zero for a kernel whose last block to finish (of all, or of a group)
  // does the final step; that block sets its counter back to zero. Kernels on the one stream run
  // one after another, so they share the counters.
  unsigned* counters(int64_t n) const {
    if (n > kCounters) fail("cuda: a kernel needs ", n, " completion counters (at most ", kCounters, ")");
    return counters_;
  }
  // Host bytes to the device in stream order; small copies go through a pinned staging ring, so
  // the host never waits for the stream to drain (pageable copies may).
  void upload_bytes(void* dst, const void* src, size_t bytes);
  // Rows gathered on the host into `dst` (bytes of them): fill(host) writes them into a pinned
  // buffer, which is then copied in stream order. Large gathers (a prefill's embedding and n-gram
  // rows) fill by several host threads into a buffer of their own; a pageable copy of them stalled
  // the stream for milliseconds.
  void upload_gathered(void* dst, size_t bytes, const std::function<void(uint8_t* host)>& fill);
  // An op's output `out` in Q8_0 beside its FP32 values, for the products of the op right after
  // it (decode, and prefill's on Q8_0 activations), which then read these codes instead of
  // quantizing `out` themselves: the op that writes `out` asks for the buffers (null when
  // products keep FP32 activations, or `out` does not fill 32-value chunks) and fills both. Any
  // later op, host write or zero fill drops it.
  QuantizeTarget q8_output(const Tensor& out);
  // rms_norm that also writes out's Q8_0 codes into q8 (groups a multiple of 32 values).
  void rms_norm_q8(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out, QuantizeTarget q8);
  // x's Q8_0 form when the op just before the calling op wrote it beside x, else null.
  const QuantizedActivations* q8_input(const Tensor& x) const;
  // Whether a product of T > kMatvecMaxTokens tokens with weights of `type` runs on int8 codes.
  bool int8_product(GgmlType type) const;
  // Whether a decode product with weights of `type` reads int8 activations (cuda_gemv.cuh Int8Unit).
  bool int8_decode(GgmlType type) const;
  // out [N, T] = W·x for raw device pointers (x [K, T] contiguous); x_q8, when given, is x in Q8_0.
  void matmul(const DeviceMatrix& w, const float* x, int64_t T, float* out, const QuantizedActivations* x_q8 = nullptr);
  // outs[i] = ms[i]·x for matrices that share x (rows of K): decode launches grouped by type, the
  // int8 products (decode and prefill) on x quantized once per activation format (Q8_0: x_q8 if given).
  void matmul_shared(std::span<const DeviceMatrix* const> ms, const float* x, int64_t K, int64_t T,
                     std::span<float* const> outs, const QuantizedActivations* x_q8 = nullptr);
  void chunked_scan(const GdnScanArgs& a, size_t prep_bytes, size_t pass_bytes);
  void gdn_core_step(const GdnCoreArgs& a, std::span<Tensor* const> columns);
  template <typename Id>
  void get_device_rows(const Weight& table, const Id* ids, int64_t n_ids, Tensor& out);
  bool hc_read_decodes(const HcReadArgs& a);
  void hc_read_decode(const HcReadArgs& a, const float* y, const float* write_w);
  template <int TB>
  void launch_hc_read_decode(const HcReadArgs& a, const float* y, const float* write_w);
  bool hc_read_tiles(const HcReadArgs& a);
  void hc_read_tiled(const HcReadArgs& a, const float* y, const float* write_w);

 private:
  Tensor alloc_raw(DType dtype, std::array<int64_t, 4> ne, bool zero);
  using WeightKey = std::tuple<const uint8_t*, GgmlType, int64_t, int64_t, int64_t, int64_t, uint64_t>;
  static WeightKey key_of(const Weight& w);

  int device_ = 0;
  bool int8_products_ = true;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<DevicePool> pool_;
  std::map<WeightKey, DeviceMatrix> matrices_;
  std::map<WeightKey, const float*> vectors_;
  std::vector<void*> weight_buffers_;  // owned, freed with the backend
  // Pinned ring for upload_bytes. Offsets count every byte ever staged (the ring's place is the
  // offset modulo its size): staged_ is where the next upload goes, landed_ where the copies not
  // yet known to have landed begin.
  uint8_t* staging_ = nullptr;
  uint64_t staged_ = 0, landed_ = 0;
  cudaStream_t upload_stream_ = nullptr;  // weights' first uploads, waited for alone
  uint8_t* read_buffer_ = nullptr;  // pinned landing place of small reads (a decode step's logits)
  std::array<cudaEvent_t, 4> read_landed_{};  // a small read's pieces, each copied out once it lands
  // read_later's landing places, made with the backend, with each session's mailboxes and when
  // none is free while no queued read waits (a pinned allocation may wait for the device):
  // kReadBufferBytes each, an event for the copy into each, reused once free. A deque: pending
  // reads hold references to their slots.
  struct ReadSlot {
    float* host = nullptr;
    cudaEvent_t landed = nullptr;
    uint64_t staged = 0;  // staged_ when the read was queued: the uploads before it land with it
    bool busy = false;
  };
  static constexpr size_t kReadBufferBytes = 4u << 20;  // a logits row of a 1M-token vocabulary
  // A session queues up to two steps while it reads the last one: three slots per two mailboxes.
  std::deque<ReadSlot> read_slots_;
  void add_read_slots(size_t n);
  ReadSlot* free_read_slot();  // null when every slot is busy
  // A one-token product of at least kEarlyReadRows rows (the LM head) inside a step graph runs as
  // two launches, its first rows copied to a free read slot beside the second launch; read_later
  // of that output then copies only the rest (H100: the logits' copy held the device 30 µs a
  // token). Dropped, its slot freed, by the next product or read of anything else.
  struct EarlyRead {
    const float* values = nullptr;
    int64_t n = 0, first = 0;  // the output's values, those already on their way
    ReadSlot* slot = nullptr;
  };
  static constexpr int64_t kEarlyReadRows = 65536;
  EarlyRead early_read_;
  void drop_early_read();
  friend class CudaPendingRead;
  bool queued_steps_ = true;  // mailbox() makes mailboxes (unless REGOLITH_CUDA_QUEUED=0)
  std::vector<CudaMailbox*> mailboxes_;
  uint8_t* gather_ = nullptr;  // pinned buffer of large upload_gathered calls, grown as needed
  size_t gather_bytes_ = 0;
  cudaEvent_t gather_copied_ = nullptr;  // its last copy has finished
  struct CachedUpload {
    std::vector<uint8_t> bytes;
    Tensor device;
  };
  std::vector<CachedUpload> uploads_;  // cached_upload's, the most recently used first
  static constexpr int64_t kCounters = 4096;
  unsigned* counters_ = nullptr;
  struct Q8Output {
    const float* values = nullptr;  // the FP32 output it stands beside
    int64_t n = 0;
    uint64_t op = 0;  // profiler_.ops_begun() of the op that wrote it
    QuantizedActivations q;
  };
  Q8Output q8_output_;  // q8_output's, until dropped

  // Step graphs (unless REGOLITH_CUDA_GRAPHS=0): the stream records its work
  // (cuda_step_graph.cuh), and everything queued between two host waits (a decode step: the ops
  // from one logits read to the next) goes to the device as graphs in pieces, each reused while its
  // sequence of kernels stays the same. Host waits and direct transfers (pageable uploads, weight
  // uploads) call flush() first.
  void flush();
  // Waits for everything queued on the stream (after flush()), `what` naming the reason in
  // errors; fails instead where a queued read waits for the host to release its mailbox, since
  // the device would never get there.
  void wait_stream(const char* what);
  bool awaits_release() const;  // some queued read waits for its mailbox's release
  // An op over more tokens than the decode kernels take (prefill) sends the rest of its step to
  // the stream: its kernels are long enough that launching them costs nothing, where graphs would
  // cost a build for every new prompt shape (H200, one run at depth 1K: pp512 5,028 tok/s as
  // graphs, 5,896 on the stream; pp2048 −1.5% with three runs). read() records again.
  void leave_graphs();
  void resume_graphs();
  // The stream's hooks: the recorder when `record`, else programmatic launches (and the profiler).
  void attach_hooks(bool record);
  std::unique_ptr<StepRecorder> recorder_;
  bool recording_ = false, programmatic_ = false;

  OpProfiler profiler_;  // REGOLITH_CUDA_PROFILE=1 (on the stream, not with step graphs): device time per op
};

}  // namespace regolith::cuda
