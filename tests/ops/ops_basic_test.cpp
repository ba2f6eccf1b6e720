// Generic ops of every backend against float64 evaluations: gather, matrix product in every
// readable weight type, norms, RoPE, elementwise, dilated causal conv. Sizes are deliberately odd.
#include <algorithm>

#include "core/error.h"
#include "op_bounds.h"

namespace regolith::test {
namespace {

class BasicOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string reason;
    be = backend_or_skip_reason(GetParam(), reason);
    if (!be) GTEST_SKIP() << reason;
  }
  std::unique_ptr<Backend> be;
};

// Every weight type, from a table a backend may copy to its device and from one that stays on the
// host (the PLE n-gram table's placement). Rows of 7 values (F16) end in a partial chunk. A device
// decoder may round the dequantization's products differently (fused multiply-adds): 1e-6 of the
// largest value, where a wrong row or chunk is off by whole values.
TEST_P(BasicOps, GetRows) {
  std::vector<int64_t> ids{12, 0, 5, 5, 3, 12};
  for (GgmlType type : every_weight_type())
    for (bool stays_on_host : {false, true}) {
      const int64_t block = traits(type).block_size, n = type == GgmlType::F16 ? 7 : block == 1 ? 40 : 2 * block;
      auto table = make_weight("table", type, {n, 13, 1, 1}, random_values(n * 13, 1));
      table->w.stays_on_host = stays_on_host;
      Tensor out = be->alloc_f32(n, static_cast<int64_t>(ids.size()));
      be->get_rows(table->w, ids, out);
      auto v = table->values();
      std::vector<double> want;
      for (int64_t id : ids) want.insert(want.end(), v.begin() + id * n, v.begin() + id * n + n);
      expect_close(be->read_f32(out), want, 1e-6, cat("get_rows ", type_name(type), stays_on_host ? " (host)" : ""));
      std::vector<int64_t> bad{13};
      EXPECT_THROW(be->get_rows(table->w, bad, out), Error);
    }
}

// Every weight type, at a decode and a small prefill token count: within the activation
// rounding a backend may apply (op_bounds.h) of the float64 product with the original x.
TEST_P(BasicOps, MulMatEveryType) {
  int64_t K = 256, N = 37;
  for (int64_t T : {1, 5}) {
    auto x = random_values(K * T, 2);
    for (GgmlType type : every_weight_type()) {
      auto w = make_weight("w", type, {K, N, 1, 1}, random_values(K * N, 3, 0.2f));
      Tensor out = be->alloc_f32(N, T);
      be->mul_mat(w->w, upload(*be, x, {K, T, 1, 1}), out);
      expect_within(be->read_f32(out), product(*w, exact(x), T), cat("mul_mat ", type_name(type), " T=", T));
    }
  }
}

TEST_P(BasicOps, ElementwiseAndStreams) {
  int64_t n = 11, T = 3;
  auto a = random_values(n * T, 4), b = random_values(n * T, 5), s = random_values(T, 6);
  Tensor ta = upload(*be, a, {n, T, 1, 1}), tb = upload(*be, b, {n, T, 1, 1});
  Tensor out = be->alloc_f32(n, T);
  be->add(ta, tb, out);
  std::vector<double> want(n * T);
  for (int64_t i = 0; i < n * T; ++i) want[i] = static_cast<double>(a[i]) + b[i];
  expect_close(be->read_f32(out), want, 1e-7, "add");
  be->swiglu(ta, tb, out);
  for (int64_t i = 0; i < n * T; ++i) want[i] = silu(a[i]) * b[i];
  expect_close(be->read_f32(out), want, 1e-6, "swiglu");
  Tensor acc = upload(*be, a, {n, T, 1, 1});
  be->add_sigmoid_gated(acc, tb, upload(*be, s, {1, T, 1, 1}));
  for (int64_t i = 0; i < n * T; ++i) want[i] = a[i] + sigmoid(s[i / n]) * b[i];
  expect_close(be->read_f32(acc), want, 1e-6, "add_sigmoid_gated");
  Tensor wide = be->alloc_f32(3 * n, T);
  be->repeat_streams(ta, 3, wide);
  std::vector<double> rep;
  for (int64_t t = 0; t < T; ++t)
    for (int s3 = 0; s3 < 3; ++s3) rep.insert(rep.end(), a.begin() + t * n, a.begin() + (t + 1) * n);
  expect_close(be->read_f32(wide), rep, 0, "repeat_streams");
}

// argmax of each column, the first of equal largest values (std::max_element's choice), into a
// slice of a longer id tensor: column 0's largest value three times (rows 1701, 1702 — one run of
// four — and 2900: the first wins), column 1's at its last row, column 2 all equal (row 0), column
// 3 random. More rows than a block's threads; 3,000 rows in runs of four, 3,001 not.
TEST_P(BasicOps, ArgmaxPicksTheFirstLargest) {
  const int64_t T = 4;
  for (int64_t N : {3001, 3000}) {
    auto x = random_values(N * T, 8);
    x[1701] = x[1702] = x[2900] = 5.0f;
    x[N + N - 1] = 6.0f;
    std::fill(x.begin() + 2 * N, x.begin() + 3 * N, -1.5f);
    std::vector<int32_t> want(T);
    for (int64_t t = 0; t < T; ++t)
      want[t] = static_cast<int32_t>(std::max_element(x.begin() + t * N, x.begin() + (t + 1) * N) - (x.begin() + t * N));
    EXPECT_EQ(want[0], 1701);
    Tensor ids = be->alloc(DType::I32, {T + 2, 1, 1, 1});
    const std::vector<int32_t> marks(T + 2, -7);
    be->write(ids, marks.data(), marks.size() * sizeof(int32_t));
    Tensor into = ids.slice(0, 1, T);
    be->argmax(upload(*be, x, {N, T, 1, 1}), into);
    std::vector<int32_t> got = be->read_i32(ids);
    EXPECT_EQ(std::vector<int32_t>(got.begin() + 1, got.end() - 1), want) << "N=" << N;
    EXPECT_EQ(got.front(), -7);
    EXPECT_EQ(got.back(), -7);
    Tensor short_ids = be->alloc(DType::I32, {T - 1, 1, 1, 1});
    EXPECT_THROW(be->argmax(upload(*be, x, {N, T, 1, 1}), short_ids), Error);
  }
}

// A slice of the outermost dimension is a view (the batched forward pass runs a sequence's ops on
// its columns): an op into columns 1..2 of a [12, 4] tensor changes those and nothing else.
TEST_P(BasicOps, SlicesAreViewsOfTheirColumns) {
  int64_t n = 12, T = 4;
  auto a = random_values(n * T, 7);
  Tensor whole = upload(*be, a, {n, T, 1, 1});
  Tensor cols = whole.slice(1, 1, 2);
  EXPECT_EQ(cols.ne(), (std::array<int64_t, 4>{n, 2, 1, 1}));
  be->add(cols, cols, cols);
  std::vector<double> want(a.begin(), a.end());
  for (int64_t i = n; i < 3 * n; ++i) want[i] *= 2;
  expect_close(be->read_f32(whole), want, 0, "add into a slice");
  Tensor heads = be->alloc_f32(n, 3).reshaped({4, 3, 3, 1});
  EXPECT_EQ(heads.slice(2, 2, 1).ne(), (std::array<int64_t, 4>{4, 3, 1, 1}));
  EXPECT_THROW(heads.slice(1, 0, 1), Error);  // not the outermost dimension
  EXPECT_THROW(whole.slice(1, 3, 2), Error);  // past the end
  EXPECT_THROW(whole.slice(1, -1, 1), Error);
  EXPECT_THROW(whole.slice(4, 0, 1), Error);
}

TEST_P(BasicOps, RmsNormPerHeadAndGrouped) {
  int64_t hd = 24, nh = 3, T = 5;
  auto x = random_values(hd * nh * T, 7, 3.0f);
  auto head_w = make_weight("head", GgmlType::F32, {hd, 1, 1, 1}, random_values(hd, 8));
  auto full_w = make_weight("full", GgmlType::F32, {hd * nh, 1, 1, 1}, random_values(hd * nh, 9));
  for (bool per_head : {true, false}) {
    const Weight& w = per_head ? head_w->w : full_w->w;
    auto wv = per_head ? head_w->values() : full_w->values();
    // Per head: rows of hd values; grouped: rows of nh·hd values normed per group of hd.
    std::array<int64_t, 4> ne = per_head ? std::array<int64_t, 4>{hd, nh, T, 1} : std::array<int64_t, 4>{hd * nh, T, 1, 1};
    Tensor out = be->alloc(DType::F32, ne);
    be->rms_norm(upload(*be, x, ne), &w, hd, 1e-6f, out);
    std::vector<double> want(x.size());
    for (int64_t g = 0; g < nh * T; ++g) {
      double ss = 0;
      for (int64_t i = 0; i < hd; ++i) ss += static_cast<double>(x[g * hd + i]) * x[g * hd + i];
      double r = 1 / std::sqrt(ss / hd + 1e-6);
      for (int64_t i = 0; i < hd; ++i) want[g * hd + i] = x[g * hd + i] * r * wv[per_head ? i : (g % nh) * hd + i];
    }
    expect_close(be->read_f32(out), want, 1e-6, per_head ? "rms_norm per head" : "rms_norm grouped");
  }
}

TEST_P(BasicOps, RopeRotatesThePartialDimsOnly) {
  int64_t hd = 20, nh = 2, n_rot = 12, T = 4;
  float theta = 10000.0f;
  auto x = random_values(hd * nh * T, 10);
  std::vector<int64_t> pos{0, 1, 17, 4000};
  Tensor t = upload(*be, x, {hd, nh, T, 1});
  be->rope(t, pos, n_rot, theta);
  std::vector<double> want(x.begin(), x.end());
  for (int64_t r = 0; r < nh * T; ++r) {
    int64_t p = pos[r / nh];
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      double ang = p * std::pow(static_cast<double>(theta), -2.0 * i / n_rot);
      double x1 = x[r * hd + i], x2 = x[r * hd + i + n_rot / 2];
      want[r * hd + i] = x1 * std::cos(ang) - x2 * std::sin(ang);
      want[r * hd + i + n_rot / 2] = x2 * std::cos(ang) + x1 * std::sin(ang);
    }
  }
  // FP32 angles (as transformers computes them) at position 4000 differ from FP64 by ~1e-4 rad.
  expect_close(be->read_f32(t), want, 2e-3, "rope");
  auto got = be->read_f32(t);
  for (int64_t i = 0; i < hd * nh; ++i) EXPECT_EQ(got[i], x[i]) << "position 0 is the identity";
}

TEST_P(BasicOps, CausalConvDilatedAndSplit) {
  int64_t C = 9, T = 11;
  for (auto [K, dil] : {std::pair<int64_t, int64_t>{4, 1}, {4, 3}, {2, 1}}) {
    int64_t L = (K - 1) * dil;
    auto x = random_values(C * T, 11);
    auto w = make_weight("conv", GgmlType::F32, {K, C, 1, 1}, random_values(K * C, 12));
    auto wv = w->values();
    std::vector<double> want(C * T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          int64_t src = t - (K - 1 - k) * dil;
          if (src >= 0) s += wv[c * K + k] * static_cast<double>(x[src * C + c]);
        }
        want[t * C + c] = silu(s);
      }
    // Whole, then as three calls carrying the history.
    Tensor hist = be->alloc_f32(C, L), out = be->alloc_f32(C, T);
    be->causal_conv(upload(*be, x, {C, T, 1, 1}), hist, w->w, dil, out);
    expect_close(be->read_f32(out), want, 1e-6, "causal_conv whole");
    Tensor hist2 = be->alloc_f32(C, L);
    std::vector<float> got;
    for (auto [t0, n] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {5, T - 5}}) {  // pieces shorter than L too
      std::vector<float> part(x.begin() + t0 * C, x.begin() + (t0 + n) * C);
      Tensor o = be->alloc_f32(C, n);
      be->causal_conv(upload(*be, part, {C, n, 1, 1}), hist2, w->w, dil, o);
      auto v = be->read_f32(o);
      got.insert(got.end(), v.begin(), v.end());
    }
    expect_close(got, want, 1e-6, "causal_conv split");
    expect_close(be->read_f32(hist2), std::vector<double>(x.end() - L * C, x.end()), 0, "causal_conv history");
  }
  // Dilation 0 (every tap on the same token) is refused, though its history has no rows.
  int64_t K = 4;
  auto w = make_weight("conv", GgmlType::F32, {K, C, 1, 1}, random_values(K * C, 13));
  Tensor no_hist = be->alloc_f32(C, 0), out = be->alloc_f32(C, T);
  EXPECT_THROW(be->causal_conv(upload(*be, random_values(C * T, 14), {C, T, 1, 1}), no_hist, w->w, 0, out), Error);
}

// "auto" is cuda exactly when a cuda backend can be made here (built in, and a usable GPU), else cpu.
TEST(BackendRegistry, AutoIsCudaWhenUsableElseCpu) {
  bool cuda_usable = false;
  for (const std::string& name : backend_names()) {
    if (name != "cuda") continue;
    try {
      cuda_usable = make_backend("cuda") != nullptr;
    } catch (const Error&) {
    }
  }
  auto be = make_backend(BackendOptions{.name = "auto", .n_threads = 1});
  EXPECT_EQ(be->name(), cuda_usable ? "cuda" : "cpu");
  EXPECT_THROW(make_backend("gpu"), Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, BasicOps, ::testing::ValuesIn(backend_names()), backend_param_name);

}  // namespace
}  // namespace regolith::test
