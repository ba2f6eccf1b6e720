// The op vocabulary of the qwen4exp forward pass, as an abstract Backend. Model code
// (src/model/qwen4exp.cpp) is written once against these ops and never sees which backend runs
// them; `ref` (src/backend/ref/) is the plain scalar judge, optimized backends implement the same
// interface and are tested op by op against it (tests/ops/).
//
// Shapes are in ggml `ne` order: ne[0] is the innermost, contiguous dimension. Activations are
// FP32 and stored token-major: a tensor [n, T] holds T contiguous rows of n values. Tensors live in
// the backend's memory (host for ref/cpu, device for a GPU backend); model code moves data only
// through write/read/copy. Weights are views of GGUF tensors (any type dequantize_row supports);
// a backend may stage them elsewhere once, keyed by the Weight's data pointer.
//
// Legend: H hidden, S hyper-connection streams, W = S·H, T tokens in the call, E experts,
// hd head width, nh heads, dk/dv GDN key/value head widths, nk/nv GDN key/value heads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/ggml_type.h"

namespace regolith {

// BF16 holds only the GDN state when it is asked for (BackendOptions::gdn_state).
enum class DType : uint8_t { F32, I32, BF16 };

inline size_t dtype_bytes(DType t) { return t == DType::BF16 ? 2 : 4; }
const char* dtype_name(DType t);

// A tensor in a backend's memory. Copies share the storage; reshaped() is a view with the same
// elements under another shape.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::array<int64_t, 4> ne, std::shared_ptr<void> storage, int64_t offset = 0)
      : dtype_(dtype), ne_(ne), storage_(std::move(storage)), offset_(offset) {}

  DType dtype() const { return dtype_; }
  const std::array<int64_t, 4>& ne() const { return ne_; }
  int64_t ne(int i) const { return ne_[i]; }
  int64_t n_elements() const { return ne_[0] * ne_[1] * ne_[2] * ne_[3]; }
  size_t n_bytes() const { return static_cast<size_t>(n_elements()) * dtype_bytes(dtype_); }
  bool empty() const { return storage_ == nullptr; }
  Tensor reshaped(std::array<int64_t, 4> ne) const;  // throws when the element count differs
  // Indices first .. first + n − 1 of dimension dim, sharing the storage; every dimension above
  // dim must be 1 (so the slice is contiguous).
  Tensor slice(int dim, int64_t first, int64_t n) const;
  // The same elements read as another dtype of the same width (I32 words received as F32 values).
  Tensor bitcast(DType dtype) const;
  std::string shape_string() const;

  // Raw access, for backends only (model code must not dereference: the memory may be a GPU's).
  float* f32() const { return static_cast<float*>(storage_.get()) + offset_; }
  int32_t* i32() const { return static_cast<int32_t*>(storage_.get()) + offset_; }
  uint16_t* bf16() const { return static_cast<uint16_t*>(storage_.get()) + offset_; }
  void* data(int64_t element = 0) const {  // where element `element` begins, any dtype
    return static_cast<uint8_t*>(storage_.get()) + (offset_ + element) * dtype_bytes(dtype_);
  }

 private:
  DType dtype_ = DType::F32;
  std::array<int64_t, 4> ne_{0, 1, 1, 1};
  std::shared_ptr<void> storage_;
  int64_t offset_ = 0;  // in elements
};

// A weight: a read-only view of one GGUF tensor. Row r (of ne[1]·ne[2]·ne[3] rows) starts at
// data + r·row_bytes and holds ne[0] values of `type`.
struct Weight {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::array<int64_t, 4> ne{0, 1, 1, 1};
  const uint8_t* data = nullptr;
  uint64_t row_bytes = 0;
  // Read where it lies (mapped file, host memory), never copied to an accelerator: the PLE n-gram
  // table, whose real size (51 G values) is far beyond device memory. Its rows are gathered on the host.
  bool stays_on_host = false;

  bool present() const { return data != nullptr; }
  int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t n_elements() const { return ne[0] * n_rows(); }
};

// Hyper-connection read (model-spec §4.2).
struct HcReadArgs {
  const Tensor* R = nullptr;        // [W, T] wide residual
  const Weight* norm = nullptr;     // {W}  grouped RMSNorm gamma (already 1 + w)
  const Weight* down = nullptr;     // {W, r}
  const Weight* up = nullptr;       // {r, W}
  const Weight* inject = nullptr;   // {W, S}, or null for the final mixer
  int64_t n_streams = 0;            // S
  float eps = 1e-6f;
  Tensor* x = nullptr;              // out [H, T]: (1/S)·Σ_s sigmoid(up·silu(down·n/S))_s ⊙ n_s
  Tensor* inject_w = nullptr;       // out [S, T]: 2·sigmoid((inject·n)/S); unused without inject
};

// PLE injection of one sequence's tokens (model-spec §4.8.4), on R in place: the pending HC write
// R += inject_w ⊙ y first when y is set, then with groups of H values
//   key = rms_norm(key_proj, norm_key), qry = rms_norm(R, norm_query), G = ple_gate(key, qry, val),
//   N = rms_norm(G, norm_conv), C = causal_conv(N, history, conv, dilation), R += G, R += C.
struct PleInjectArgs {
  Tensor* R = nullptr;                  // [W, T] wide residual, updated
  const Tensor* y = nullptr;            // [H, T] a pending write's sublayer output, or null
  const Tensor* inject_w = nullptr;     // [S, T] its inject weights (with y)
  const Tensor* key_proj = nullptr;     // [W, T] key projection of the n-gram rows
  const Tensor* val = nullptr;          // [H, T] value projection
  const Weight* norm_key = nullptr;     // {W} grouped gammas (already 1 + w)
  const Weight* norm_query = nullptr;   // {W}
  const Weight* norm_conv = nullptr;    // {W}
  const Weight* conv = nullptr;         // {K, W}
  Tensor* history = nullptr;            // [W, (K−1)·dilation] the conv's last inputs, updated
  int64_t n_streams = 0;                // S
  int64_t dilation = 1;
  float eps = 1e-6f;
  Tensor* conv_inputs = nullptr;        // out [W, T]: N, for a caller that rewinds the history; or null
};

// Gated-delta-rule scan of one GDN layer (model-spec §4.4), FP32 state.
struct GdnScanArgs {
  const Tensor* qkv = nullptr;      // [2·nk·dk + nv·dv, T] conv output: q | k | v, head-major
  const Tensor* g = nullptr;        // [nv, T] log decay (<= 0)
  const Tensor* beta = nullptr;     // [nv, T]
  Tensor* state = nullptr;          // [dv, dk, nv] S_h[i][j], i over k dims; read and updated. F32, or
                                    // BF16: rounded (via FP32) once at the end of every call
  Tensor* out = nullptr;            // [dv·nv, T]
  int64_t n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0;
  // v head h reads k/q head h % nk (the GGUF's tiled v-head order, model-spec §6.3 item 3).
  // q and k are l2-normalised (eps 1e-6 inside the rsqrt); q is scaled by 1/sqrt(dk).
};

// A QSA layer's projections made ready for attention (model-spec §4.5): the query split from its
// output gate, q and k RMS-normed per head and rotated, the indexer query normed per head and
// rotated; k, v and the raw indexer key appended to the caches at token n0 (row n0 + t of each).
struct QsaPrepareArgs {
  const Tensor* qg = nullptr;       // [2·hd, nh, T] query projection: per head hd query, hd gate values
  const Tensor* k = nullptr;        // [hd·nh_kv, T] key projection
  const Tensor* v = nullptr;        // [hd·nh_kv, T]
  const Tensor* iq = nullptr;       // [di·nh_idx, T] indexer query projection
  const Tensor* ik = nullptr;       // [di, T] indexer key projection (cached raw)
  const Weight* q_norm = nullptr;   // {hd}
  const Weight* k_norm = nullptr;   // {hd}
  const Weight* iq_norm = nullptr;  // {di}
  std::span<const int64_t> positions;  // [T]
  int64_t n_rot = 0;
  float theta = 0, eps = 1e-6f;
  Tensor* q_out = nullptr;          // [hd, nh, T]
  Tensor* gate_out = nullptr;       // [hd, nh, T]
  Tensor* k_out = nullptr;          // [hd, nh_kv, T] normed, rotated (also written to k_cache)
  Tensor* iq_out = nullptr;         // [di, nh_idx, T]
  Tensor* k_cache = nullptr;        // [hd, nh_kv, n_cap]
  Tensor* v_cache = nullptr;        // [hd, nh_kv, n_cap]
  Tensor* ik_cache = nullptr;       // [di, n_cap]
  int64_t n0 = 0;
};

// A GDN layer after its convolution (model-spec §4.4): gdn_gates into g and beta, gdn_scan of qkv
// with them into core, then gated_rms_norm(core, z, norm) into out.
struct GdnCoreArgs {
  const Tensor* qkv = nullptr;       // [2·nk·dk + nv·dv, T] conv output
  const Tensor* alpha = nullptr;     // [nv, T]
  const Tensor* beta_raw = nullptr;  // [nv, T]
  const Weight* ssm_a = nullptr;     // {nv}
  const Weight* dt_bias = nullptr;   // {nv}
  const Tensor* z = nullptr;         // [dv·nv, T] output gate
  const Weight* norm = nullptr;      // {dv}
  float eps = 1e-6f;
  Tensor* state = nullptr;           // as GdnScanArgs::state
  int64_t n_k_heads = 0, n_v_heads = 0, dk = 0, dv = 0;
  Tensor* g = nullptr;               // out [nv, T]
  Tensor* beta = nullptr;            // out [nv, T]
  Tensor* core = nullptr;            // out [dv·nv, T]: the scan's output
  Tensor* out = nullptr;             // out [dv·nv, T]
  // Set for a verify pass: the tokens step one at a time, as decode does (not the chunked scan),
  // and out [dv, dk, nv, T − 1] (the state's type) receives the state after each but the last.
  Tensor* states_after = nullptr;
};

// Pools complete indexer blocks [block_begin, block_end) (model-spec §4.5).
struct QsaPoolArgs {
  const Tensor* raw_keys = nullptr; // [d, n_cap] raw indexer keys (no norm, no rope)
  Tensor* pooled = nullptr;         // [d, n_block_cap] out: rope(rmsnorm(mean of the block's keys))
  const Weight* k_norm = nullptr;   // {d}
  int64_t block_begin = 0, block_end = 0, ratio = 0;
  int64_t n_rot = 0;                // rotated at the block's first position, block·ratio
  float theta = 0, eps = 1e-6f;
};

// Per query row: the top min(top_blocks, nb) complete blocks by Σ_h relu(q_h·K_b)/sqrt(d), nb =
// (p+1)/ratio, chosen by qsa_top_blocks() (backend/qsa_topk.h: equal scores go to the lower block
// index), then the incomplete tail [nb·ratio, p].
struct QsaSelectArgs {
  const Tensor* iq = nullptr;       // [d, nh_idx, T] indexer queries (normed, rotated)
  const Tensor* pooled = nullptr;   // [d, >= nb of the last row]
  std::span<const int64_t> positions;  // [T] absolute positions
  int64_t ratio = 0, top_blocks = 0;
  Tensor* sel = nullptr;            // I32 [max_sel, T] out: selected positions, ascending, then -1
                                    // to the row's end (every entry is written)
  Tensor* n_sel = nullptr;          // I32 [T] out: how many entries of each row are valid
};

// Gated attention over selected positions (model-spec §4.5).
struct QsaAttendArgs {
  const Tensor* q = nullptr;        // [hd, nh, T] normed, rotated
  const Tensor* gate = nullptr;     // [hd, nh, T] output gate (pre-sigmoid)
  const Tensor* k_cache = nullptr;  // [hd, nh_kv, n_cap] normed, rotated keys
  const Tensor* v_cache = nullptr;  // [hd, nh_kv, n_cap]
  const Tensor* sel = nullptr;      // I32 [max_sel, T]; null when every row is dense (below)
  const Tensor* n_sel = nullptr;    // I32 [T]; null with sel
  float scale = 0;                  // softmax scale, 1/sqrt(hd)
  Tensor* out = nullptr;            // [hd·nh, T]: softmax(q·K/…)·V ⊙ sigmoid(gate); q head h uses kv head h/(nh/nh_kv)
  // Rows t < dense_rows select exactly the positions 0 .. dense_n0 + t (the indexer keeps every
  // block while a row's cache is short, model-spec §4.5): a backend may attend to them causally
  // without sel. dense_n0 is the first row's position. When every row is dense the model runs no
  // qsa_select, and sel and n_sel are null.
  int64_t dense_n0 = 0, dense_rows = 0;
  // The weight the op after this one reads (the output projection), which a backend may ask its
  // memory for while attention runs; a hint only (CUDA: one-token decode without a selection).
  const Weight* next = nullptr;
};

// Each row's selection as a host-side qsa_attend reads it: sel's rows, or with sel null the dense
// rows' causal prefixes (all of them prefixes of one run of positions).
class QsaRows {
 public:
  explicit QsaRows(const QsaAttendArgs& a);
  const int32_t* positions(int64_t t) const { return sel_ ? sel_ + t * slots_ : dense_.data(); }
  int64_t count(int64_t t) const { return n_sel_ ? n_sel_[t] : n0_ + t + 1; }
  int64_t slots() const { return slots_; }  // the longest a row's selection can be

 private:
  const int32_t *sel_ = nullptr, *n_sel_ = nullptr;
  std::vector<int32_t> dense_;
  int64_t n0_ = 0, slots_ = 0;
};

// Routed experts (model-spec §4.6): out[:, t] = Σ_k w[k,t]·down_e(silu(gate_e·x_t) ⊙ up_e·x_t), e = ids[k,t].
struct MoeExpertsArgs {
  const Tensor* x = nullptr;        // [H, T]
  const Weight* gate_exps = nullptr;  // {H, F, E}
  const Weight* up_exps = nullptr;    // {H, F, E}
  const Weight* down_exps = nullptr;  // {F, H, E}
  const Tensor* ids = nullptr;      // I32 [k, T]
  const Tensor* weights = nullptr;  // [k, T]
  Tensor* out = nullptr;            // [H, T]
};

// A whole MoE block (model-spec §4.6): router logits, top-k routing, the routed experts and the
// shared expert gated per token:
//   out = moe_experts(x) + sigmoid(shared_gate_inp·x)·shared_down(silu(shared_gate·x) ⊙ shared_up·x).
struct MoeFfnArgs {
  const Tensor* x = nullptr;                // [H, T]
  const Weight* router = nullptr;           // {H, E}
  const Weight* gate_exps = nullptr;        // {H, F, E}
  const Weight* up_exps = nullptr;          // {H, F, E}
  const Weight* down_exps = nullptr;        // {F, H, E}
  const Weight* shared_gate = nullptr;      // {H, Fs}
  const Weight* shared_up = nullptr;        // {H, Fs}
  const Weight* shared_down = nullptr;      // {Fs, H}
  const Weight* shared_gate_inp = nullptr;  // {H, 1}
  int64_t k = 0;                            // experts per token
  Tensor* logits = nullptr;                 // [E, T] out: the router's logits
  Tensor* out = nullptr;                    // [H, T]
};

// Argument checks every backend's ops share: throw Error naming the op, the argument, what it
// is and what was expected.
void expect_shape(const Tensor& t, std::array<int64_t, 4> ne, const char* op, const char* what);
void expect_elements(const Tensor& t, int64_t n, const char* op, const char* what);

// One check per Backend op, with the op's arguments, called by every backend before it runs the
// op: shapes, widths and host-side indices (the contents of tensors are the backend's to check).
void check_get_rows(const Weight& table, std::span<const int64_t> ids, const Tensor& out);
void check_mul_mat(const Weight& w, const Tensor& x, const Tensor& out);
void check_add(const Tensor& a, const Tensor& b, const Tensor& out);
void check_repeat_streams(const Tensor& x, int64_t n_streams, const Tensor& out);
void check_rms_norm(const Tensor& x, const Weight* w, int64_t group, const Tensor& out);
void check_rope(const Tensor& x, std::span<const int64_t> positions, int64_t n_rot);
void check_swiglu(const Tensor& g, const Tensor& u, const Tensor& out);
void check_add_sigmoid_gated(const Tensor& acc, const Tensor& x, const Tensor& s);
// GdnCoreArgs::states_after's shape for T tokens of `state` (one state at least, unused at T = 1).
std::array<int64_t, 4> states_after_shape(const Tensor& state, int64_t T);
void check_states_after(const GdnCoreArgs& a);
// The columns ops' one state per column.
void check_columns(int64_t columns, size_t states, const char* op);
void check_argmax(const Tensor& x, const Tensor& ids);
void check_causal_conv(const Tensor& x, const Tensor& history, const Weight& w, int64_t dilation, const Tensor& out);
void check_hc_read(const HcReadArgs& a);
void check_qsa_prepare(const QsaPrepareArgs& a);
void check_hc_write(const Tensor& R, const Tensor& y, const Tensor& inject_w);
void check_hc_write_read(const Tensor& R, const Tensor& y, const Tensor& inject_w, const HcReadArgs& a);
void check_gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias,
                     const Tensor& g, const Tensor& beta);
void check_gdn_scan(const GdnScanArgs& a, const char* op);  // op: "gdn_recurrent" or "gdn_chunked"
void check_gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, const Tensor& out);
void check_split_q_gate(const Tensor& qg, const Tensor& q, const Tensor& gate);
void check_qsa_pool(const QsaPoolArgs& a);
void check_qsa_select(const QsaSelectArgs& a);  // also each row's block count and selection size
void check_qsa_attend(const QsaAttendArgs& a);
void check_moe_route(const Tensor& logits, int64_t k, const Tensor& ids, const Tensor& weights);
void check_moe_experts(const MoeExpertsArgs& a);
void check_moe_ffn(const MoeFfnArgs& a);
void check_ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, const Tensor& out);
void check_ple_inject(const PleInjectArgs& a);

// Host memory that queued work reads when the device reaches it, not when it is issued: the host
// fills it after issuing that work and then releases it (a decode step issued before its token is
// known, Qwen4ExpModel::forward_queued). Each release lets the reads queued before it run; the
// host writes again only once those reads are done.
class HostMailbox {
 public:
  virtual ~HostMailbox() = default;
  virtual std::span<uint8_t> bytes() = 0;
  virtual void release() = 0;
};
void check_receive(HostMailbox& from, size_t offset, const Tensor& dst);

// A read queued in stream order (Backend::read_later), waited for later.
class PendingRead {
 public:
  virtual ~PendingRead() = default;
  // Waits for the values; they stay valid while this object lives.
  virtual std::span<const float> wait() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // ---- memory ----
  virtual Tensor alloc(DType dtype, std::array<int64_t, 4> ne) = 0;  // zero-filled
  Tensor alloc_f32(int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) { return alloc(DType::F32, {ne0, ne1, ne2, 1}); }
  // Storage for an op's output, which writes every element: a backend may skip the zero fill (a
  // GPU saves a memset launch per op).
  virtual Tensor alloc_output(DType dtype, std::array<int64_t, 4> ne) { return alloc(dtype, ne); }
  Tensor output_f32(int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1) {
    return alloc_output(DType::F32, {ne0, ne1, ne2, 1});
  }
  virtual void write(Tensor& dst, const void* src, size_t bytes) = 0;  // from host, at the start of dst
  virtual void read(const Tensor& src, void* dst, size_t bytes) = 0;   // to host, from the start of src
  // n elements from src[src_off..] to dst[dst_off..] (same dtype), e.g. appending to a cache.
  virtual void copy(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) = 0;
  std::vector<float> read_f32(const Tensor& t);
  std::vector<int32_t> read_i32(const Tensor& t);
  // F32 src to the host once the work queued before it is done; the default reads it now.
  virtual std::unique_ptr<PendingRead> read_later(const Tensor& src);
  // ---- queued inputs ----
  // A mailbox of `bytes`, or null where ops run as they are called (nothing is ever queued).
  virtual std::unique_ptr<HostMailbox> mailbox(size_t bytes);
  // dst.n_bytes() bytes from `from` at `offset`, once the host has released it. The default, for
  // backends that run ops as they are called, copies them now (from a mailbox released already).
  virtual void receive(HostMailbox& from, size_t offset, Tensor& dst);
  // Bytes this backend could still allocate for activations (a GPU's free memory, the host's
  // available memory), or nullopt when it cannot tell. The default reads the host's
  // (backend/memory_available.cpp).
  virtual std::optional<uint64_t> memory_available() const;

  // ---- generic ----
  // out [ne0, n_ids] = rows ids of table {ne0, rows} (token embedding; PLE n-gram gather, where the
  // 16 heads' rows of one token land side by side, so out may be shaped [H, T]).
  virtual void get_rows(const Weight& table, std::span<const int64_t> ids, Tensor& out) = 0;
  // The same with ids, I32 [n_ids], in this backend's memory (written by a receive); the default
  // reads them back.
  virtual void get_rows_by(const Weight& table, const Tensor& ids, Tensor& out);
  // out [N, T] = W·x; W {K, N}, x [K, T].
  virtual void mul_mat(const Weight& w, const Tensor& x, Tensor& out) = 0;
  // outs[i] = ws[i]·x for weights that share one input (a layer's projections); a backend may run
  // them together. The default calls mul_mat for each.
  virtual void mul_mat_shared_input(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor* const> outs);
  // ids[t] = the row index of column t's largest value in x [N, T] (F32), the first of equal ones, as
  // std::max_element picks; ids I32 [T], left in this backend's memory (a draft chosen where its
  // logits are). The default reads x back.
  virtual void argmax(const Tensor& x, Tensor& ids);
  // out = a + b (same shape; out may alias a).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // out [S·H, T]: every stream a copy of x [H, T].
  virtual void repeat_streams(const Tensor& x, int64_t n_streams, Tensor& out) = 0;
  // RMSNorm over consecutive groups of `group` values of each row of x: x·rsqrt(mean(x²)+eps)·w.
  // w {group} (shared by every group, e.g. per head) or {ne0} (grouped HC/PLE norms); null: no w.
  virtual void rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out) = 0;
  // Partial NeoX RoPE in place on x [hd, nh, T]: the first n_rot dims of each head, at positions[t],
  // inv_freq[i] = theta^(-2i/n_rot) in FP32 (text M-RoPE: all three axes share the position).
  virtual void rope(Tensor& x, std::span<const int64_t> positions, int64_t n_rot, float theta) = 0;
  // out = silu(g) ⊙ u.
  virtual void swiglu(const Tensor& g, const Tensor& u, Tensor& out) = 0;
  // acc [n, T] += sigmoid(s[0, t])·x[:, t]; s [1, T] (shared-expert gate).
  virtual void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& s) = 0;
  // Depthwise causal conv + SiLU: out[c,t] = silu(Σ_k w[c,k]·x̃[c, t − (K−1−k)·dilation]) with x̃ the
  // sequence [history | x]; history [C, (K−1)·dilation] (oldest row first) is updated to the last
  // (K−1)·dilation inputs. x [C, T], w {K, C}; K and dilation at least 1.
  virtual void causal_conv(const Tensor& x, Tensor& history, const Weight& w, int64_t dilation, Tensor& out) = 0;
  // causal_conv of one token each of several sequences: column t of x and out is sequence t's,
  // whose history is histories[t] (a batched decode step). The default runs causal_conv a column
  // at a time; a backend may run them all at once.
  virtual void causal_conv_columns(const Tensor& x, std::span<Tensor* const> histories, const Weight& w,
                                   int64_t dilation, Tensor& out);

  // ---- hyper-connections ----
  virtual void hc_read(const HcReadArgs& a) = 0;
  // R[s·H + d, t] += inject_w[s, t]·y[d, t]; R [W, T], y [H, T], inject_w [S, T].
  virtual void hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) = 0;
  // hc_write(R, y, inject_w), then hc_read(a) of that R (a.R == &R): one sublayer's write and the
  // next sublayer's read, which a backend may run as one step. The default runs the two ops.
  virtual void hc_write_read(Tensor& R, const Tensor& y, const Tensor& inject_w, const HcReadArgs& a);

  // ---- Gated DeltaNet ----
  // g[h,t] = ssm_a[h]·softplus(alpha[h,t] + dt_bias[h]); beta = sigmoid(beta_raw). [nv, T] each.
  virtual void gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias,
                         Tensor& g, Tensor& beta) = 0;
  // The delta rule token by token (decode), and the chunked WY/UT form (prefill): equal results.
  virtual void gdn_recurrent(const GdnScanArgs& a) = 0;
  virtual void gdn_chunked(const GdnScanArgs& a) = 0;
  // What model code calls: one token -> recurrent step, more -> chunked scan.
  virtual void gdn_scan(const GdnScanArgs& a);
  // out = w ⊙ rmsnorm(x) ⊙ sigmoid(z), per head of x [dv, nv, T]; w {dv} plain gamma.
  virtual void gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) = 0;
  // What model code calls. The default runs gdn_gates, gdn_scan and gated_rms_norm (a token at a
  // time with a.states_after); a backend may fuse.
  virtual void gdn_core(const GdnCoreArgs& a);
  // gdn_core of one token each of several sequences: column t of every tensor of a is sequence t's,
  // whose recurrent state is states[t] (a.state is unused). The default runs gdn_core a column at a
  // time; a backend may run them all at once.
  virtual void gdn_core_columns(const GdnCoreArgs& a, std::span<Tensor* const> states);

  // ---- QSA ----
  // qg [2·hd, nh, T] (per head: hd query values then hd gate values) -> q, gate [hd, nh, T].
  virtual void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) = 0;
  // What model code calls. The default runs split_q_gate, rms_norm, rope and copy; a backend may fuse.
  virtual void qsa_prepare(const QsaPrepareArgs& a);
  virtual void qsa_pool(const QsaPoolArgs& a) = 0;
  virtual void qsa_select(const QsaSelectArgs& a) = 0;
  virtual void qsa_attend(const QsaAttendArgs& a) = 0;

  // ---- MoE ----
  // Softmax over logits [E, T] (FP32), top k (ties: lower expert id), renormalised to sum 1.
  virtual void moe_route(const Tensor& logits, int64_t k, Tensor& ids, Tensor& weights) = 0;
  virtual void moe_experts(const MoeExpertsArgs& a) = 0;
  // What model code calls. The default runs the ops above one after another; a backend may fuse.
  virtual void moe_ffn(const MoeFfnArgs& a);

  // ---- PLE ----
  // out[s·H + d, t] = sigmoid(ssqrt(key_s·qry_s / sqrt(H)))·val[d, t], ssqrt(x) = sign(x)·sqrt(max(|x|, 1e-6)).
  // key, qry [W, T] (normed), val [H, T], out [W, T].
  virtual void ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) = 0;
  // What model code calls. The default runs hc_write, rms_norm, ple_gate, causal_conv and add; a
  // backend may fuse.
  virtual void ple_inject(const PleInjectArgs& a);

 private:
  // gdn_core with states_after: one gdn_core a token, the state copied after each but the last.
  void gdn_core_each_token(const GdnCoreArgs& a);
};

// Which backend to make: its name ("ref", "cpu", "cuda", or "auto": cuda when this build has it
// and a GPU is usable, else cpu) and, for the host-threaded cpu backend, how many threads (0:
// every core).
struct BackendOptions {
  std::string name = "auto";
  int n_threads = 0;
  // Not the backend's but the engine's (Engine::open): the dtype sessions keep the GDN recurrent
  // state in. BF16 halves that state's memory (a session, a cached prefix) and its traffic per
  // decode step, at the cost of rounding it after every forward call.
  DType gdn_state = DType::F32;
  // CUDA: prefill products with quantized weights keep FP32 activations (split-TF32 tensor cores)
  // instead of rounding them to Q8_0/Q8_K for the int8 tensor cores, as llama.cpp's do. Slower;
  // the products are then within FP32 rounding of the dequantized weights' (cuda_gemm.cuh).
  bool exact_products = false;
};

// Backends by name; throws naming an unknown backend and listing the known ones.
std::unique_ptr<Backend> make_backend(const BackendOptions& options);
std::unique_ptr<Backend> make_backend(std::string_view name);
std::vector<std::string> backend_names();

}  // namespace regolith
