// The importance matrix (`regolith imatrix`): a Backend decorator that forwards every op to the
// backend it wraps and, for each weight matrix the forward pass multiplies, accumulates the sum of
// squared input activations per input column and the number of input rows seen — per expert for
// the stacked routed expert tensors (a token counts toward the experts it is routed to only). It
// writes llama.cpp's imatrix GGUF (v0.5.0 tools/imatrix: "<tensor>.in_sum2" [ne0, n_mat] and
// "<tensor>.counts" [1, n_mat] F32, general.type "imatrix", imatrix.datasets / chunk_count /
// chunk_size), which `regolith quantize --imatrix` and llama.cpp's llama-quantize both read.
//
// Inputs read back to the host: mul_mat's and mul_mat_shared_input's x; moe_experts' x and, for
// the down projections, the SwiGLU of each routed (token, expert) pair, recomputed through the
// wrapped backend on one-expert views of the stacked weights (a GPU backend stages those views
// separately); hc_read's normed
// streams (input of down and inject) and silu(down·n/S) (input of up), also recomputed. Token
// embeddings and the n-gram table are row gathers, not products, and get no entry.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace regolith {

struct ImatrixEntry {
  int64_t row_len = 0;          // input columns (the weight's ne[0])
  std::vector<double> in_sum2;  // [n_mat][row_len]: Σ x² over the rows counted
  std::vector<int64_t> counts;  // [n_mat]: input rows seen (one matrix, or one per expert)
};

class ImatrixCollector : public Backend {
 public:
  explicit ImatrixCollector(std::unique_ptr<Backend> inner);

  const std::map<std::string, ImatrixEntry>& entries() const { return entries_; }
  // Writes the entries as llama.cpp's imatrix GGUF (tensor names sorted, as llama.cpp writes them).
  void write_gguf(const std::string& path, const std::vector<std::string>& datasets, uint32_t chunk_count,
                  uint32_t chunk_size) const;

  std::string_view name() const override { return inner_->name(); }
  Tensor alloc(DType dtype, std::array<int64_t, 4> ne) override { return inner_->alloc(dtype, ne); }
  Tensor alloc_output(DType dtype, std::array<int64_t, 4> ne) override { return inner_->alloc_output(dtype, ne); }
  void write(Tensor& dst, const void* src, size_t bytes) override { inner_->write(dst, src, bytes); }
  void read(const Tensor& src, void* dst, size_t bytes) override { inner_->read(src, dst, bytes); }
  void copy(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) override {
    inner_->copy(src, src_off, dst, dst_off, n);
  }
  void get_rows(const Weight& table, std::span<const int64_t> ids, Tensor& out) override {
    inner_->get_rows(table, ids, out);
  }
  void mul_mat(const Weight& w, const Tensor& x, Tensor& out) override;
  void mul_mat_shared_input(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor* const> outs) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override { inner_->add(a, b, out); }
  void repeat_streams(const Tensor& x, int64_t n_streams, Tensor& out) override {
    inner_->repeat_streams(x, n_streams, out);
  }
  void rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out) override {
    inner_->rms_norm(x, w, group, eps, out);
  }
  void rope(Tensor& x, std::span<const int64_t> positions, int64_t n_rot, float theta) override {
    inner_->rope(x, positions, n_rot, theta);
  }
  void swiglu(const Tensor& g, const Tensor& u, Tensor& out) override { inner_->swiglu(g, u, out); }
  void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& s) override { inner_->add_sigmoid_gated(acc, x, s); }
  void causal_conv(const Tensor& x, Tensor& history, const Weight& w, int64_t dilation, Tensor& out) override {
    inner_->causal_conv(x, history, w, dilation, out);
  }
  void hc_read(const HcReadArgs& a) override;
  void hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) override { inner_->hc_write(R, y, inject_w); }
  void gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias, Tensor& g,
                 Tensor& beta) override {
    inner_->gdn_gates(alpha, beta_raw, ssm_a, dt_bias, g, beta);
  }
  void gdn_recurrent(const GdnScanArgs& a) override { inner_->gdn_recurrent(a); }
  void gdn_chunked(const GdnScanArgs& a) override { inner_->gdn_chunked(a); }
  void gdn_scan(const GdnScanArgs& a) override { inner_->gdn_scan(a); }
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) override {
    inner_->gated_rms_norm(x, z, w, eps, out);
  }
  void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) override { inner_->split_q_gate(qg, q, gate); }
  void qsa_pool(const QsaPoolArgs& a) override { inner_->qsa_pool(a); }
  void qsa_select(const QsaSelectArgs& a) override { inner_->qsa_select(a); }
  void qsa_attend(const QsaAttendArgs& a) override { inner_->qsa_attend(a); }
  void moe_route(const Tensor& logits, int64_t k, Tensor& ids, Tensor& weights) override {
    inner_->moe_route(logits, k, ids, weights);
  }
  void moe_experts(const MoeExpertsArgs& a) override;
  void ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) override {
    inner_->ple_gate(key, qry, val, n_streams, out);
  }

 private:
  ImatrixEntry& entry(const Weight& w, int64_t n_mat);
  // Adds rows [n rows of w.ne[0] values] to matrix `mat` of w's entry.
  void accumulate(const Weight& w, int64_t n_mat, int64_t mat, const float* rows, int64_t n);

  std::unique_ptr<Backend> inner_;
  std::map<std::string, ImatrixEntry> entries_;
};

}  // namespace regolith
