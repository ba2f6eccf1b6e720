// The reference backend: plain scalar loops over host memory, FP64 accumulation, no fusion and no
// tricks. It is the judge every optimized backend is tested against (tests/ops/), so clarity wins
// over speed; the only concession is splitting independent rows or tokens over threads.
#pragma once

#include "backend/ops.h"

namespace regolith {

class RefBackend final : public Backend {
 public:
  std::string_view name() const override { return "ref"; }

  Tensor alloc(DType dtype, std::array<int64_t, 4> ne) override;
  void write(Tensor& dst, const void* src, size_t bytes) override;
  void read(const Tensor& src, void* dst, size_t bytes) override;
  void copy(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) override;

  void get_rows(const Weight& table, std::span<const int64_t> ids, Tensor& out) override;
  void mul_mat(const Weight& w, const Tensor& x, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void repeat_streams(const Tensor& x, int64_t n_streams, Tensor& out) override;
  void rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out) override;
  void rope(Tensor& x, std::span<const int64_t> positions, int64_t n_rot, float theta) override;
  void swiglu(const Tensor& g, const Tensor& u, Tensor& out) override;
  void add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& s) override;
  void causal_conv(const Tensor& x, Tensor& history, const Weight& w, int64_t dilation, Tensor& out) override;

  void hc_read(const HcReadArgs& a) override;
  void hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) override;

  void gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias, Tensor& g,
                 Tensor& beta) override;
  void gdn_recurrent(const GdnScanArgs& a) override;
  void gdn_chunked(const GdnScanArgs& a) override;
  void gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) override;

  void split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) override;
  void qsa_pool(const QsaPoolArgs& a) override;
  void qsa_select(const QsaSelectArgs& a) override;
  void qsa_attend(const QsaAttendArgs& a) override;

  void moe_route(const Tensor& logits, int64_t k, Tensor& ids, Tensor& weights) override;
  void moe_experts(const MoeExpertsArgs& a) override;

  void ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) override;
};

}  // namespace regolith
