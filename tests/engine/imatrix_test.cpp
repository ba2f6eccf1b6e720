// The importance-matrix collector against an independent computation on the tiny random model:
// the inputs of dense matrices from the traced intermediates, the hyper-connection inputs and the
// routed experts' (routing from the traced router logits, SwiGLU from the weights) recomputed in
// FP64 here; then the written file, read back by llama.cpp's format reader of regolith quantize.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "engine_test_util.h"
#include "gguf/gguf.h"
#include "quant/model_quantize.h"
#include "quant/rows.h"
#include "runtime/imatrix_collector.h"
#include "runtime/session.h"

using namespace regolith;
using regolith::test::engine_model;

namespace {

constexpr int64_t kTokens = 40;

class Imatrix : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto model = Qwen4ExpModel::load(engine_model("tiny.gguf"));
    auto owner = std::make_unique<ImatrixCollector>(make_backend("ref"));
    collector_ = owner.get();
    engine_ = std::make_shared<Engine>(model, std::move(owner));
    Session session(engine_);
    session.set_trace([](std::string_view name, int64_t layer, const Tensor& t) {
      if (t.dtype() == DType::F32) trace_[key(name, layer)] = engine_->backend().read_f32(t);
    });
    std::vector<int32_t> tokens;
    for (int64_t i = 0; i < kTokens; ++i) tokens.push_back(static_cast<int32_t>((7 + 31 * i) % 512));
    session.eval(tokens);
  }
  static void TearDownTestSuite() {
    engine_.reset();
    trace_.clear();
  }

  static std::string key(std::string_view name, int64_t layer) { return std::string(name) + "@" + std::to_string(layer); }
  static const std::vector<float>& traced(const char* name, int64_t layer) { return trace_.at(key(name, layer)); }
  static const ImatrixEntry& entry(const std::string& name) { return collector_->entries().at(name); }
  static const Qwen4ExpWeights& weights() { return engine_->model().weights(); }

  // Row r of a weight as doubles.
  static std::vector<double> weight_row(const Weight& w, int64_t r) {
    std::vector<float> f(w.ne[0]);
    dequantize_row(w.type, w.data + r * w.row_bytes, w.ne[0], f.data());
    return {f.begin(), f.end()};
  }

  static inline ImatrixCollector* collector_ = nullptr;
  static inline std::shared_ptr<Engine> engine_;
  static inline std::map<std::string, std::vector<float>> trace_;
};

double dot(const std::vector<double>& a, const float* x) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * x[i];
  return s;
}

double silu(double v) { return v / (1.0 + std::exp(-v)); }

// Σ over rows of x² per column.
std::vector<double> column_sums(const std::vector<float>& rows, int64_t row_len) {
  std::vector<double> s(row_len, 0.0);
  for (size_t i = 0; i < rows.size(); ++i) s[i % row_len] += static_cast<double>(rows[i]) * rows[i];
  return s;
}

void expect_close(const double* got, const std::vector<double>& want, double rel, const std::string& what) {
  const double scale = *std::max_element(want.begin(), want.end());
  ASSERT_GT(scale, 0) << what;
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], rel * scale) << what << " column " << i;
}

}  // namespace

TEST_F(Imatrix, DenseMatricesSumTheirTracedInputs) {
  // (weight, the traced intermediate it multiplies)
  const std::vector<std::tuple<std::string, const char*, int64_t>> cases = {
      {"blk.0.ffn_gate_inp.weight", "hc_ffn.x", 0}, {"blk.0.ffn_up_shexp.weight", "hc_ffn.x", 0},
      {"blk.0.ssm_out.weight", "gdn.normed", 0},    {"blk.3.attn_output.weight", "qsa.attn", 3},
      {"blk.3.attn_q.weight", "hc_attn.x", 3},      {"output.weight", "output_hc.x", -1},
  };
  for (const auto& [name, input, layer] : cases) {
    const ImatrixEntry& e = entry(name);
    EXPECT_EQ(e.counts, std::vector<int64_t>{kTokens}) << name;
    expect_close(e.in_sum2.data(), column_sums(traced(input, layer), e.row_len), 1e-12, name);
  }
}

TEST_F(Imatrix, HyperConnectionInputsAreTheNormedStreamsAndTheLowRankActivation) {
  // Layer 0's attention read sees the embedding in every stream (the PLE block is at layer 1).
  const HcWeights& hc = weights().layers[0].hc_attn;
  const Qwen4ExpHparams& hp = engine_->model().hparams();
  const int64_t H = hp.n_embd, S = hp.hc_count, W = H * S, r = hp.hc_low_rank;
  const std::vector<float>& embd = traced("embd", -1);
  const std::vector<double> gamma = weight_row(hc.norm, 0);
  std::vector<std::vector<double>> down(r);
  for (int64_t j = 0; j < r; ++j) down[j] = weight_row(hc.down, j);
  std::vector<double> want_n(W, 0.0), want_lo(r, 0.0);
  std::vector<float> n(W);
  for (int64_t t = 0; t < kTokens; ++t) {
    const float* e = embd.data() + t * H;
    double ms = 0;
    for (int64_t d = 0; d < H; ++d) ms += static_cast<double>(e[d]) * e[d];
    const double inv = 1.0 / std::sqrt(ms / H + hp.rms_eps);
    for (int64_t i = 0; i < W; ++i) n[i] = static_cast<float>(e[i % H] * inv * gamma[i]);
    for (int64_t i = 0; i < W; ++i) want_n[i] += static_cast<double>(n[i]) * n[i];
    for (int64_t j = 0; j < r; ++j) want_lo[j] += std::pow(silu(dot(down[j], n.data()) / S), 2);
  }
  for (const char* name : {"blk.0.hc_attn_down.weight", "blk.0.hc_attn_inject.weight"}) {
    EXPECT_EQ(entry(name).counts, std::vector<int64_t>{kTokens});
    expect_close(entry(name).in_sum2.data(), want_n, 1e-5, name);
  }
  EXPECT_EQ(entry("blk.0.hc_attn_up.weight").counts, std::vector<int64_t>{kTokens});
  expect_close(entry("blk.0.hc_attn_up.weight").in_sum2.data(), want_lo, 1e-4, "blk.0.hc_attn_up.weight");
}

TEST_F(Imatrix, ExpertsCountOnlyTheTokensRoutedToThem) {
  const MoeWeights& moe = weights().layers[0].moe;
  const Qwen4ExpHparams& hp = engine_->model().hparams();
  const int64_t H = hp.n_embd, E = hp.n_expert, F = hp.n_ff_exp, k = hp.n_expert_used;
  const std::vector<float>& x = traced("hc_ffn.x", 0);
  const std::vector<float>& router = traced("moe.router", 0);
  std::vector<int64_t> want_counts(E, 0);
  std::vector<double> want_x(E * H, 0.0), want_h(E * F, 0.0);
  std::vector<int64_t> order(E);
  for (int64_t t = 0; t < kTokens; ++t) {
    const float* l = router.data() + t * E;
    const float* xt = x.data() + t * H;
    // softmax is monotonic: the top k logits, the lower id first on ties (ops.h moe_route)
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = order[j];
      ++want_counts[e];
      for (int64_t d = 0; d < H; ++d) want_x[e * H + d] += static_cast<double>(xt[d]) * xt[d];
      for (int64_t f = 0; f < F; ++f) {
        const double g = dot(weight_row(moe.gate_exps, e * F + f), xt), u = dot(weight_row(moe.up_exps, e * F + f), xt);
        want_h[e * F + f] += std::pow(silu(g) * u, 2);
      }
    }
  }
  EXPECT_EQ(std::accumulate(want_counts.begin(), want_counts.end(), int64_t{0}), kTokens * k);
  for (const char* name : {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"})
    EXPECT_EQ(entry(name).counts, want_counts) << name;
  for (int64_t e = 0; e < E; ++e) {
    if (want_counts[e] == 0) continue;
    const std::string tag = " expert " + std::to_string(e);
    expect_close(entry("blk.0.ffn_gate_exps.weight").in_sum2.data() + e * H,
                 {want_x.begin() + e * H, want_x.begin() + (e + 1) * H}, 1e-12, "gate_exps" + tag);
    expect_close(entry("blk.0.ffn_down_exps.weight").in_sum2.data() + e * F,
                 {want_h.begin() + e * F, want_h.begin() + (e + 1) * F}, 1e-4, "down_exps" + tag);
  }
}

TEST_F(Imatrix, WritesLlamaCppsImatrixGgufThatQuantizeReads) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("regolith_imatrix_" + std::to_string(::getpid()) + ".gguf")).string();
  collector_->write_gguf(path, {"tokens.txt"}, 1, kTokens);
  {
    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.get("general.type").as_string(), "imatrix");
    EXPECT_EQ(f.get("imatrix.datasets").as_string_array(), std::vector<std::string>{"tokens.txt"});
    EXPECT_EQ(f.get("imatrix.chunk_count").as_int(), 1);
    EXPECT_EQ(f.get("imatrix.chunk_size").as_int(), kTokens);
    EXPECT_EQ(f.tensors().size(), 2 * collector_->entries().size());
    const Qwen4ExpHparams& hp = engine_->model().hparams();
    EXPECT_EQ(f.tensor("blk.0.ffn_down_exps.weight.in_sum2").ne, (std::vector<int64_t>{hp.n_ff_exp, hp.n_expert}));
    EXPECT_EQ(f.tensor("blk.0.ffn_down_exps.weight.counts").ne, (std::vector<int64_t>{1, hp.n_expert}));
    EXPECT_EQ(f.tensor("blk.0.attn_qkv.weight.in_sum2").ne, (std::vector<int64_t>{hp.n_embd, 1}));
  }
  ImportanceMatrix m = ImportanceMatrix::load(path);
  EXPECT_EQ(m.size(), collector_->entries().size());
  const ImatrixEntry& e = entry("blk.0.ffn_down_exps.weight");
  const int64_t F = e.row_len, E = static_cast<int64_t>(e.counts.size()), rows_per_expert = weights().layers[0].moe.down_exps.ne[1];
  for (int64_t x = 0; x < E; ++x) {
    const float* w = m.row_weights("blk.0.ffn_down_exps.weight", F, rows_per_expert, E, x * rows_per_expert);
    for (int64_t i = 0; i < F; ++i) {
      const double want = e.counts[x] ? e.in_sum2[x * F + i] / e.counts[x] : 1.0;  // never routed: uniform
      ASSERT_NEAR(w[i], want, 1e-6 * want) << "expert " << x;
    }
  }
  std::filesystem::remove(path);
}
