// The CPU backend: the ops of ops.h over host memory, multithreaded on a persistent pool, with
// SIMD kernels (kernels.h) chosen at run time. Weights are read in place from the GGUF mapping.
// Quantized rows that few tokens share (decode) meet activations quantized once per call to Q8_0
// or Q8_K in quant's dot kernels, as llama.cpp does; float rows, and quantized rows at more tokens,
// are widened or dequantized to FP32 and meet FP32 activations. The GDN state stays FP32.
// Judged op by op against `ref` (tests/ops/): within float rounding, plus the bound of that
// activation rounding for products with quantized weights.
#pragma once

#include <memory>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/ops.h"

namespace regolith {

struct CpuOptions {
  int n_threads = 0;                 // <= 0: every core
  cpu::Isa isa = cpu::best_isa();    // a lesser set may be forced (tests, benchmarks)
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuOptions& options = {});
  std::string_view name() const override { return "cpu"; }
  int n_threads() const { return pool_.size(); }
  cpu::Isa isa() const { return k_.isa; }

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

 private:
  const cpu::Kernels& k_;
  cpu::ThreadPool pool_;
};

}  // namespace regolith
