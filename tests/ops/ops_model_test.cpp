// Model-shaped ops of every backend against float64 evaluations written here from model-spec §4:
// hyper-connections, Gated DeltaNet (recurrent and chunked, with a carried state), QSA pool /
// select / attend, MoE routing and experts, the PLE gate and injection.
#include <numeric>

#include "backend/qsa_topk.h"
#include "core/error.h"
#include "core/half.h"
#include "op_bounds.h"

namespace regolith::test {
namespace {

class ModelOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string reason;
    be = backend_or_skip_reason(GetParam(), reason);
    if (!be) GTEST_SKIP() << reason;
  }
  std::unique_ptr<Backend> be;
};

TEST_P(ModelOps, HcReadAndWrite) {
  int64_t S = 4, H = 10, W = S * H, r = 6, T = 3;
  auto R = random_values(W * T, 1, 2.0f);
  auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 2));
  auto down = make_weight("down", GgmlType::F16, {W, r, 1, 1}, random_values(W * r, 3, 0.5f));
  auto up = make_weight("up", GgmlType::BF16, {r, W, 1, 1}, random_values(r * W, 4, 0.5f));
  auto inject = make_weight("inject", GgmlType::F32, {W, S, 1, 1}, random_values(W * S, 5, 0.5f));
  HcReadExpected want = hc_read_expected(R, *norm, *down, *up, inject.get(), S, 1e-6);
  Tensor tR = upload(*be, R, {W, T, 1, 1}), x = be->alloc_f32(H, T), iw = be->alloc_f32(S, T);
  be->hc_read({.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w, .inject = &inject->w, .n_streams = S,
               .eps = 1e-6f, .x = &x, .inject_w = &iw});
  expect_within(be->read_f32(x), want.x, "hc_read x");
  expect_within(be->read_f32(iw), want.inject_w, "hc_read inject");
  Tensor x2 = be->alloc_f32(H, T);
  be->hc_read({.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w, .inject = nullptr, .n_streams = S,
               .eps = 1e-6f, .x = &x2, .inject_w = nullptr});
  expect_within(be->read_f32(x2), want.x, "hc_read without inject");

  auto y = random_values(H * T, 6);
  be->hc_write(tR, upload(*be, y, {H, T, 1, 1}), iw);
  std::vector<double> want_R(W * T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < W; ++i) want_R[t * W + i] = R[t * W + i] + want.inject_w.want[t * S + i / H] * y[t * H + i % H];
  expect_close(be->read_f32(tR), want_R, 1e-6, "hc_write");
}

struct GdnCase {
  int64_t nk = 2, nv = 6, dk = 8, dv = 12;
  int64_t C() const { return 2 * nk * dk + nv * dv; }
};

// The delta rule token by token, straight from model-spec §4.4 (v head h reads k head h % nk).
std::vector<double> gdn_expected(const GdnCase& c, const std::vector<float>& qkv, const std::vector<float>& g,
                                 const std::vector<float>& beta, std::vector<double>& S, int64_t T) {
  std::vector<double> out(c.nv * c.dv * T);
  for (int64_t h = 0; h < c.nv; ++h) {
    int64_t kh = h % c.nk;
    double* Sh = &S[h * c.dk * c.dv];
    for (int64_t t = 0; t < T; ++t) {
      const float* row = &qkv[t * c.C()];
      std::vector<double> q(row + kh * c.dk, row + (kh + 1) * c.dk), k(row + c.nk * c.dk + kh * c.dk, row + c.nk * c.dk + (kh + 1) * c.dk);
      double nq = 0, nk2 = 0;
      for (int64_t i = 0; i < c.dk; ++i) nq += q[i] * q[i], nk2 += k[i] * k[i];
      for (int64_t i = 0; i < c.dk; ++i) q[i] /= std::sqrt(nq + 1e-6) * std::sqrt(static_cast<double>(c.dk)), k[i] /= std::sqrt(nk2 + 1e-6);
      const float* v = row + 2 * c.nk * c.dk + h * c.dv;
      for (int64_t i = 0; i < c.dk * c.dv; ++i) Sh[i] *= std::exp(static_cast<double>(g[t * c.nv + h]));
      for (int64_t j = 0; j < c.dv; ++j) {
        double kv = 0;
        for (int64_t i = 0; i < c.dk; ++i) kv += Sh[i * c.dv + j] * k[i];
        double delta = beta[t * c.nv + h] * (v[j] - kv);
        for (int64_t i = 0; i < c.dk; ++i) Sh[i * c.dv + j] += k[i] * delta;
      }
      for (int64_t j = 0; j < c.dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < c.dk; ++i) o += Sh[i * c.dv + j] * q[i];
        out[t * c.nv * c.dv + h * c.dv + j] = o;
      }
    }
  }
  return out;
}

TEST_P(ModelOps, GdnRecurrentAndChunkedMatchTheDeltaRule) {
  GdnCase c;
  for (int64_t T : {1, 5, 64, 65, 130}) {
    auto qkv = random_values(c.C() * T, 20 + T);
    std::vector<float> g(c.nv * T), beta(c.nv * T);
    std::mt19937 rng(T);
    std::uniform_real_distribution<float> u(0, 1);
    for (auto& v : g) v = -2.0f * u(rng);   // decays in (e^-2, 1]
    for (auto& v : beta) v = u(rng);
    auto s0 = random_values(c.dk * c.dv * c.nv, 7, 0.3f);
    std::vector<double> S(s0.begin(), s0.end());
    auto want = gdn_expected(c, qkv, g, beta, S, T);
    for (bool chunked : {false, true}) {
      Tensor tq = upload(*be, qkv, {c.C(), T, 1, 1}), tg = upload(*be, g, {c.nv, T, 1, 1}),
             tb = upload(*be, beta, {c.nv, T, 1, 1}), st = upload(*be, s0, {c.dv, c.dk, c.nv, 1});
      Tensor out = be->alloc_f32(c.nv * c.dv, T);
      GdnScanArgs a{.qkv = &tq, .g = &tg, .beta = &tb, .state = &st, .out = &out, .n_k_heads = c.nk,
                    .n_v_heads = c.nv, .dk = c.dk, .dv = c.dv};
      chunked ? be->gdn_chunked(a) : be->gdn_recurrent(a);
      std::string what = std::string(chunked ? "gdn_chunked" : "gdn_recurrent") + " T=" + std::to_string(T);
      expect_close(be->read_f32(out), want, 2e-6, what + " out");
      expect_close(be->read_f32(st), S, 2e-6, what + " state");
    }
  }
}

// A BF16 state (BackendOptions::gdn_state) is the FP32 state rounded once per call: from the same
// BF16-representable start, the outputs are identical and the final BF16 state is exactly the
// FP32 run's final state rounded to BF16.
TEST_P(ModelOps, GdnBf16StateIsTheF32StateRounded) {
  GdnCase c;
  const int64_t n = c.dk * c.dv * c.nv;
  std::vector<uint16_t> s0_bits(n);
  std::vector<float> s0(n);
  const auto start = random_values(n, 8, 0.3f);
  for (int64_t i = 0; i < n; ++i) s0_bits[i] = f32_to_bf16(start[i]), s0[i] = bf16_to_f32(s0_bits[i]);
  for (int64_t T : {1, 5, 130}) {
    auto qkv = random_values(c.C() * T, 30 + T);
    std::vector<float> g(c.nv * T), beta(c.nv * T);
    std::mt19937 rng(T);
    std::uniform_real_distribution<float> u(0, 1);
    for (auto& v : g) v = -2.0f * u(rng);
    for (auto& v : beta) v = u(rng);
    for (bool chunked : {false, true}) {
      Tensor tq = upload(*be, qkv, {c.C(), T, 1, 1}), tg = upload(*be, g, {c.nv, T, 1, 1}),
             tb = upload(*be, beta, {c.nv, T, 1, 1});
      Tensor st32 = upload(*be, s0, {c.dv, c.dk, c.nv, 1}), st16 = be->alloc(DType::BF16, {c.dv, c.dk, c.nv, 1});
      be->write(st16, s0_bits.data(), s0_bits.size() * sizeof(uint16_t));
      std::vector<float> out[2];
      int i = 0;
      for (Tensor* st : {&st32, &st16}) {
        Tensor o = be->alloc_f32(c.nv * c.dv, T);
        GdnScanArgs a{.qkv = &tq, .g = &tg, .beta = &tb, .state = st, .out = &o, .n_k_heads = c.nk,
                      .n_v_heads = c.nv, .dk = c.dk, .dv = c.dv};
        chunked ? be->gdn_chunked(a) : be->gdn_recurrent(a);
        out[i++] = be->read_f32(o);
      }
      const std::string what = std::string(chunked ? "gdn_chunked" : "gdn_recurrent") + " T=" + std::to_string(T);
      EXPECT_EQ(out[0], out[1]) << what << ": outputs differ";
      const auto s32 = be->read_f32(st32);
      std::vector<uint16_t> s16(n);
      be->read(st16, s16.data(), s16.size() * sizeof(uint16_t));
      int64_t differ = 0;
      for (int64_t k = 0; k < n; ++k) differ += s16[k] != f32_to_bf16(s32[k]);
      EXPECT_EQ(differ, 0) << what << ": BF16 state values that are not the FP32 state rounded";
    }
  }
}

TEST_P(ModelOps, GdnGatesAndGatedNorm) {
  int64_t nv = 5, T = 3;
  auto alpha = random_values(nv * T, 30, 3.0f), braw = random_values(nv * T, 31);
  alpha[0] = 25.0f;  // softplus's linear branch
  auto A = make_weight("ssm_a", GgmlType::F32, {nv, 1, 1, 1}, {-0.5f, -1.0f, -2.0f, -0.1f, -4.0f});
  auto dt = make_weight("dt", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 32));
  Tensor g = be->alloc_f32(nv, T), beta = be->alloc_f32(nv, T);
  be->gdn_gates(upload(*be, alpha, {nv, T, 1, 1}), upload(*be, braw, {nv, T, 1, 1}), A->w, dt->w, g, beta);
  auto Av = A->values(), dtv = dt->values();
  std::vector<double> wg(nv * T), wb(nv * T);
  for (int64_t i = 0; i < nv * T; ++i) {
    double z = static_cast<double>(alpha[i]) + dtv[i % nv];
    wg[i] = Av[i % nv] * (z > 20 ? z : std::log1p(std::exp(z)));
    wb[i] = sigmoid(braw[i]);
  }
  expect_close(be->read_f32(g), wg, 1e-6, "gdn_gates g");
  expect_close(be->read_f32(beta), wb, 1e-6, "gdn_gates beta");

  // Groups of 7 values, and of 128 and 256 (the CUDA backend's warp-a-group kernel).
  for (int64_t dv : {7, 128, 256}) {
    auto x = random_values(dv * nv * T, 33), z = random_values(dv * nv * T, 34);
    auto w = make_weight("norm", GgmlType::F32, {dv, 1, 1, 1}, random_values(dv, 35));
    Tensor out = be->alloc_f32(dv * nv, T);
    be->gated_rms_norm(upload(*be, x, {dv * nv, T, 1, 1}), upload(*be, z, {dv * nv, T, 1, 1}), w->w, 1e-6f, out);
    auto wv = w->values();
    std::vector<double> want(x.size());
    for (int64_t h = 0; h < nv * T; ++h) {
      double ss = 0;
      for (int64_t j = 0; j < dv; ++j) ss += static_cast<double>(x[h * dv + j]) * x[h * dv + j];
      for (int64_t j = 0; j < dv; ++j)
        want[h * dv + j] = wv[j] * x[h * dv + j] / std::sqrt(ss / dv + 1e-6) * sigmoid(z[h * dv + j]);
    }
    expect_close(be->read_f32(out), want, 1e-6, "gated_rms_norm dv=" + std::to_string(dv));
  }
}

// A verify pass's gdn_core (states_after set) equals one-token gdn_core calls with the state copied
// after each token, bit for bit: outputs, final state and the states after each token but the last,
// for FP32 and BF16 states (each token starts from the state as a step would have stored it).
TEST_P(ModelOps, StatesAfterEqualOneTokenSteps) {
  const int64_t nk = 2, nv = 4, dk = 128, dv = 40, C = 2 * nk * dk + nv * dv, T = 5;
  auto ssm_a = make_weight("ssm_a", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 501, 2.0f));
  auto dt = make_weight("dt_bias", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 502));
  auto norm = make_weight("norm", GgmlType::F32, {dv, 1, 1, 1}, random_values(dv, 503));
  const auto x = random_values(C * T, 504), alpha = random_values(nv * T, 505), beta_raw = random_values(nv * T, 506, 3.0f),
             z = random_values(dv * nv * T, 507), start = random_values(dv * dk * nv, 508, 0.3f);
  const int64_t n = dv * dk * nv;
  const auto bytes_of = [&](const Tensor& t) {
    std::vector<uint8_t> b(t.n_bytes());
    be->read(t, b.data(), b.size());
    return b;
  };
  for (DType type : {DType::F32, DType::BF16}) {
    // Run 0 passes states_after, run 1 steps a token at a time; both from the same state.
    std::vector<float> outputs[2][4];
    std::vector<uint8_t> final_state[2], after[2];
    for (int run = 0; run < 2; ++run) {
      Tensor state = be->alloc(type, {dv, dk, nv, 1}), states_after = be->alloc(type, {dv, dk, nv, T - 1});
      Tensor start_f32 = upload(*be, start, {dv, dk, nv, 1});
      if (type == DType::F32) {
        be->copy(start_f32, 0, state, 0, n);
      } else {
        std::vector<uint16_t> bits(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) bits[i] = f32_to_bf16(start[i]);
        be->write(state, bits.data(), bits.size() * sizeof(uint16_t));
      }
      Tensor tx = upload(*be, x, {C, T, 1, 1}), ta = upload(*be, alpha, {nv, T, 1, 1}),
             tb = upload(*be, beta_raw, {nv, T, 1, 1}), tz = upload(*be, z, {dv * nv, T, 1, 1});
      Tensor g = be->alloc_f32(nv, T), beta = be->alloc_f32(nv, T), core = be->alloc_f32(dv * nv, T),
             out = be->alloc_f32(dv * nv, T);
      const auto args = [&](const Tensor& x_, const Tensor& a_, const Tensor& b_, const Tensor& z_, Tensor& g_,
                            Tensor& beta_, Tensor& core_, Tensor& out_) {
        return GdnCoreArgs{.qkv = &x_, .alpha = &a_, .beta_raw = &b_, .ssm_a = &ssm_a->w, .dt_bias = &dt->w, .z = &z_,
                           .norm = &norm->w, .eps = 1e-6f, .state = &state, .n_k_heads = nk, .n_v_heads = nv, .dk = dk,
                           .dv = dv, .g = &g_, .beta = &beta_, .core = &core_, .out = &out_};
      };
      if (run == 0) {
        GdnCoreArgs a = args(tx, ta, tb, tz, g, beta, core, out);
        Tensor wrong = be->alloc(type, {dv, dk, nv, T});
        a.states_after = &wrong;
        EXPECT_THROW(be->gdn_core(a), Error) << "states_after of T states";
        a.states_after = &states_after;
        be->gdn_core(a);
      } else {
        for (int64_t t = 0; t < T; ++t) {
          const auto col = [&](const Tensor& v) { return v.slice(1, t, 1); };
          Tensor g_t = col(g), beta_t = col(beta), core_t = col(core), out_t = col(out);
          be->gdn_core(args(col(tx), col(ta), col(tb), col(tz), g_t, beta_t, core_t, out_t));
          if (t + 1 < T) be->copy(state, 0, states_after, t * n, n);
        }
      }
      int o = 0;
      for (const Tensor* t : {&g, &beta, &core, &out}) outputs[run][o++] = be->read_f32(*t);
      final_state[run] = bytes_of(state);
      after[run] = bytes_of(states_after);
    }
    const std::string what = type == DType::F32 ? "F32 state" : "BF16 state";
    const char* names[] = {"g", "beta", "core", "out"};
    for (int o = 0; o < 4; ++o) EXPECT_EQ(outputs[0][o], outputs[1][o]) << names[o] << ", " << what;
    EXPECT_EQ(final_state[0], final_state[1]) << "final state, " << what;
    EXPECT_EQ(after[0], after[1]) << "states after each token, " << what;
  }
}

// The columns ops (a batched decode step: one token each of several sequences, each with its own
// conv history and recurrent state) equal the same ops a column at a time, bit for bit: every
// output, history and state. Nine columns (the CUDA kernels take eight a launch); dk = 128 as the
// model's heads, dv = 40 a partial warp; the conv at dilations 1 (GDN) and 3 (PLE's form).
TEST_P(ModelOps, ColumnsOpsEqualOneColumnAtATime) {
  const int64_t nk = 2, nv = 4, dk = 128, dv = 40, C = 2 * nk * dk + nv * dv, B = 9, K = 4;
  auto conv_w = make_weight("conv", GgmlType::F32, {K, C, 1, 1}, random_values(K * C, 400, 0.5f));
  auto ssm_a = make_weight("ssm_a", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 401, 2.0f));
  auto dt = make_weight("dt_bias", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 402));
  auto norm = make_weight("norm", GgmlType::F32, {dv, 1, 1, 1}, random_values(dv, 403));
  const auto x = random_values(C * B, 404), alpha = random_values(nv * B, 405), beta_raw = random_values(nv * B, 406, 3.0f),
             z = random_values(dv * nv * B, 407);
  for (int64_t dilation : {1, 3}) {
    const int64_t L = (K - 1) * dilation;
    // Run 0 takes the columns ops, run 1 the ops a column at a time; both from the same histories and states.
    std::vector<float> outputs[2][5], hists[2], states[2];
    for (int run = 0; run < 2; ++run) {
      std::vector<Tensor> hist, state;
      for (int64_t b = 0; b < B; ++b) {
        hist.push_back(upload(*be, random_values(C * L, 410 + static_cast<uint32_t>(b), 0.5f), {C, L, 1, 1}));
        state.push_back(upload(*be, random_values(dv * dk * nv, 430 + static_cast<uint32_t>(b), 0.3f), {dv, dk, nv, 1}));
      }
      Tensor tx = upload(*be, x, {C, B, 1, 1}), ta = upload(*be, alpha, {nv, B, 1, 1}),
             tb = upload(*be, beta_raw, {nv, B, 1, 1}), tz = upload(*be, z, {dv * nv, B, 1, 1});
      Tensor u = be->alloc_f32(C, B), g = be->alloc_f32(nv, B), beta = be->alloc_f32(nv, B),
             core = be->alloc_f32(dv * nv, B), out = be->alloc_f32(dv * nv, B);
      const auto args = [&](const Tensor& u_, const Tensor& a_, const Tensor& b_, const Tensor& z_, Tensor* st, Tensor& g_,
                            Tensor& beta_, Tensor& core_, Tensor& out_) {
        return GdnCoreArgs{.qkv = &u_, .alpha = &a_, .beta_raw = &b_, .ssm_a = &ssm_a->w, .dt_bias = &dt->w, .z = &z_,
                           .norm = &norm->w, .eps = 1e-6f, .state = st, .n_k_heads = nk, .n_v_heads = nv, .dk = dk,
                           .dv = dv, .g = &g_, .beta = &beta_, .core = &core_, .out = &out_};
      };
      if (run == 0) {
        std::vector<Tensor*> hist_p, state_p;
        for (int64_t b = 0; b < B; ++b) hist_p.push_back(&hist[b]), state_p.push_back(&state[b]);
        be->causal_conv_columns(tx, hist_p, conv_w->w, dilation, u);
        be->gdn_core_columns(args(u, ta, tb, tz, nullptr, g, beta, core, out), state_p);
        EXPECT_THROW(be->causal_conv_columns(tx, std::span(hist_p).first(B - 1), conv_w->w, dilation, u), Error);
        EXPECT_THROW(be->gdn_core_columns(args(u, ta, tb, tz, nullptr, g, beta, core, out), std::span(state_p).first(B - 1)),
                     Error);
      } else {
        for (int64_t b = 0; b < B; ++b) {
          const auto col = [&](const Tensor& t) { return t.slice(1, b, 1); };
          Tensor u_b = col(u), g_b = col(g), beta_b = col(beta), core_b = col(core), out_b = col(out);
          be->causal_conv(col(tx), hist[b], conv_w->w, dilation, u_b);
          be->gdn_core(args(u_b, col(ta), col(tb), col(tz), &state[b], g_b, beta_b, core_b, out_b));
        }
      }
      int o = 0;
      for (const Tensor* t : {&u, &g, &beta, &core, &out}) outputs[run][o++] = be->read_f32(*t);
      for (int64_t b = 0; b < B; ++b) {
        const auto h = be->read_f32(hist[b]), st = be->read_f32(state[b]);
        hists[run].insert(hists[run].end(), h.begin(), h.end());
        states[run].insert(states[run].end(), st.begin(), st.end());
      }
    }
    const char* names[] = {"conv out", "g", "beta", "core", "out"};
    for (int o = 0; o < 5; ++o) EXPECT_EQ(outputs[0][o], outputs[1][o]) << names[o] << ", dilation " << dilation;
    EXPECT_EQ(hists[0], hists[1]) << "conv histories, dilation " << dilation;
    EXPECT_EQ(states[0], states[1]) << "recurrent states, dilation " << dilation;
  }
}

TEST_P(ModelOps, QsaPoolSelectAttend) {
  int64_t d = 8, ratio = 4, n = 23, nb = n / ratio, n_rot = 4, nh_i = 3;
  float theta = 1e4f;
  auto keys = random_values(d * n, 40);
  auto kn = make_weight("k_norm", GgmlType::F32, {d, 1, 1, 1}, random_values(d, 41));
  Tensor raw = upload(*be, keys, {d, n, 1, 1}), pooled = be->alloc_f32(d, nb + 1);
  be->qsa_pool({.raw_keys = &raw, .pooled = &pooled, .k_norm = &kn->w, .block_begin = 0, .block_end = 2, .ratio = ratio,
                .n_rot = n_rot, .theta = theta, .eps = 1e-6f});
  be->qsa_pool({.raw_keys = &raw, .pooled = &pooled, .k_norm = &kn->w, .block_begin = 2, .block_end = nb, .ratio = ratio,
                .n_rot = n_rot, .theta = theta, .eps = 1e-6f});
  auto knv = kn->values();
  std::vector<double> want_pool(d * (nb + 1), 0.0);
  for (int64_t b = 0; b < nb; ++b) {
    std::vector<double> m(d, 0.0);
    for (int64_t i = 0; i < d; ++i) {
      for (int64_t j = 0; j < ratio; ++j) m[i] += keys[(b * ratio + j) * d + i];
      m[i] /= ratio;
    }
    double ss = 0;
    for (double v : m) ss += v * v;
    for (int64_t i = 0; i < d; ++i) m[i] = m[i] / std::sqrt(ss / d + 1e-6) * knv[i];
    std::vector<double> r = m;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
      double ang = b * ratio * std::pow(static_cast<double>(theta), -2.0 * i / n_rot);
      r[i] = m[i] * std::cos(ang) - m[i + n_rot / 2] * std::sin(ang);
      r[i + n_rot / 2] = m[i + n_rot / 2] * std::cos(ang) + m[i] * std::sin(ang);
    }
    std::copy(r.begin(), r.end(), want_pool.begin() + b * d);
  }
  expect_close(be->read_f32(pooled), want_pool, 1e-5, "qsa_pool");

  // Selection for rows at positions 2 (no block), 11 (3 blocks, top 2), 22 (5 blocks, top 2 + tail).
  std::vector<int64_t> pos{2, 11, 22};
  int64_t T = 3, top = 2, max_sel = top * ratio + ratio - 1;
  auto iq = random_values(d * nh_i * T, 42);
  Tensor tiq = upload(*be, iq, {d, nh_i, T, 1});
  Tensor sel = be->alloc(DType::I32, {max_sel, T, 1, 1}), n_sel = be->alloc(DType::I32, {T, 1, 1, 1});
  be->qsa_select({.iq = &tiq, .pooled = &pooled, .positions = pos, .ratio = ratio, .top_blocks = top, .sel = &sel,
                  .n_sel = &n_sel});
  auto got_sel = be->read_i32(sel), got_n = be->read_i32(n_sel);
  std::vector<std::vector<int32_t>> want_sel(T);
  for (int64_t t = 0; t < T; ++t) {
    int64_t row_nb = (pos[t] + 1) / ratio;
    std::vector<double> score(row_nb);
    for (int64_t b = 0; b < row_nb; ++b) {
      for (int64_t h = 0; h < nh_i; ++h) {
        double dotp = 0;
        for (int64_t i = 0; i < d; ++i) dotp += iq[(t * nh_i + h) * d + i] * want_pool[b * d + i];
        score[b] += std::max(0.0, dotp);
      }
    }
    std::vector<int64_t> order(row_nb);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return score[x] > score[y]; });
    for (int64_t j = 0; j < std::min(top, row_nb); ++j)
      for (int64_t i = 0; i < ratio; ++i) want_sel[t].push_back(static_cast<int32_t>(order[j] * ratio + i));
    for (int64_t i = row_nb * ratio; i <= pos[t]; ++i) want_sel[t].push_back(static_cast<int32_t>(i));
    std::sort(want_sel[t].begin(), want_sel[t].end());
    ASSERT_EQ(got_n[t], static_cast<int32_t>(want_sel[t].size())) << "row " << t;
    EXPECT_EQ(std::vector<int32_t>(got_sel.begin() + t * max_sel, got_sel.begin() + t * max_sel + got_n[t]), want_sel[t])
        << "row " << t;
  }
  EXPECT_EQ(got_n[0], 3) << "no complete block: the tail only";
  EXPECT_EQ(got_n[1], 2 * ratio) << "top two of three blocks, no tail";
  EXPECT_EQ(got_n[2], 2 * ratio + 3) << "top two blocks plus the tail";

  // Gated GQA attention over the selection: 4 heads on 2 kv heads.
  int64_t hd = 6, nh = 4, nkv = 2;
  auto q = random_values(hd * nh * T, 43), gate = random_values(hd * nh * T, 44);
  auto kc = random_values(hd * nkv * n, 45), vc = random_values(hd * nkv * n, 46);
  Tensor out = be->alloc_f32(hd * nh, T);
  Tensor tq = upload(*be, q, {hd, nh, T, 1}), tg = upload(*be, gate, {hd, nh, T, 1});
  Tensor tk = upload(*be, kc, {hd, nkv, n, 1}), tv = upload(*be, vc, {hd, nkv, n, 1});
  float scale = 1 / std::sqrt(6.0f);
  be->qsa_attend({.q = &tq, .gate = &tg, .k_cache = &tk, .v_cache = &tv, .sel = &sel, .n_sel = &n_sel, .scale = scale,
                  .out = &out});
  // Row t attends to the positions rows[t].
  const auto attention = [&](const std::vector<std::vector<int32_t>>& rows) {
    std::vector<double> want(hd * nh * T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        int64_t g = h / (nh / nkv);
        std::vector<double> s;
        for (int32_t j : rows[t]) {
          double a = 0;
          for (int64_t i = 0; i < hd; ++i) a += q[(t * nh + h) * hd + i] * static_cast<double>(kc[(j * nkv + g) * hd + i]);
          s.push_back(a * scale);
        }
        double mx = *std::max_element(s.begin(), s.end()), sum = 0;
        for (double& v : s) sum += v = std::exp(v - mx);
        for (int64_t i = 0; i < hd; ++i) {
          double o = 0;
          for (size_t j = 0; j < s.size(); ++j) o += s[j] / sum * vc[(rows[t][j] * nkv + g) * hd + i];
          want[t * nh * hd + h * hd + i] = o * sigmoid(gate[(t * nh + h) * hd + i]);
        }
      }
    return want;
  };
  expect_close(be->read_f32(out), attention(want_sel), 1e-6, "qsa_attend");
  // Every row dense, with no selection: rows at positions 7, 8, 9 attend causally.
  const int64_t n0 = 7;
  std::vector<std::vector<int32_t>> causal(T);
  for (int64_t t = 0; t < T; ++t)
    for (int32_t p = 0; p <= n0 + t; ++p) causal[t].push_back(p);
  be->qsa_attend({.q = &tq, .gate = &tg, .k_cache = &tk, .v_cache = &tv, .scale = scale, .out = &out, .dense_n0 = n0,
                  .dense_rows = T});
  expect_close(be->read_f32(out), attention(causal), 1e-6, "qsa_attend without a selection");
  EXPECT_THROW(be->qsa_attend({.q = &tq, .gate = &tg, .k_cache = &tk, .v_cache = &tv, .scale = scale, .out = &out,
                               .dense_n0 = n0, .dense_rows = T - 1}),
               Error)
      << "a row that is not dense needs a selection";
  // Dense rows (QsaAttendArgs::dense_rows) past the call's rows or past the cache are refused.
  for (auto [dense_n0, dense_rows] : {std::pair<int64_t, int64_t>{0, T + 1}, {n, 1}, {0, -1}})
    EXPECT_THROW(be->qsa_attend({.q = &tq, .gate = &tg, .k_cache = &tk, .v_cache = &tv, .sel = &sel, .n_sel = &n_sel,
                                 .scale = scale, .out = &out, .dense_n0 = dense_n0, .dense_rows = dense_rows}),
                 Error)
        << "dense rows " << dense_rows << " from " << dense_n0;

  Tensor q2 = be->alloc_f32(hd, nh, T), g2 = be->alloc_f32(hd, nh, T);
  std::vector<float> qg(2 * hd * nh * T);
  for (int64_t r = 0; r < nh * T; ++r)
    for (int64_t i = 0; i < hd; ++i) qg[r * 2 * hd + i] = q[r * hd + i], qg[r * 2 * hd + hd + i] = gate[r * hd + i];
  be->split_q_gate(upload(*be, qg, {2 * hd, nh, T, 1}), q2, g2);
  expect_close(be->read_f32(q2), std::vector<double>(q.begin(), q.end()), 0, "split_q_gate q");
  expect_close(be->read_f32(g2), std::vector<double>(gate.begin(), gate.end()), 0, "split_q_gate gate");
}

// Exact ties (relu-zero scores are common) go to the lower block index (model-spec §4.5).
TEST(QsaTopBlocks, TiesGoToTheLowerBlockIndex) {
  EXPECT_EQ(qsa_top_blocks(std::vector<double>{0, 0, 0, 0}, 2), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(qsa_top_blocks(std::vector<double>{0.5, 0, 2, 1}, 2), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(qsa_top_blocks(std::vector<double>{1, 0, 1, 0, 1}, 2), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(qsa_top_blocks(std::vector<double>{0, 2, 0, 0, 1}, 3), (std::vector<int64_t>{0, 1, 4}));
  EXPECT_EQ(qsa_top_blocks(std::vector<double>{3, 1, 2}, 5), (std::vector<int64_t>{0, 1, 2}));
  std::vector<double> many(200);
  for (int i = 0; i < 200; ++i) many[i] = (i * 37) % 200;  // distinct
  EXPECT_EQ(qsa_top_blocks(many, 3), (std::vector<int64_t>{27, 54, 81}));  // values 199, 198, 197
}

TEST_P(ModelOps, MoeRouteAndExperts) {
  int64_t E = 7, k = 3, H = 32, F = 256, T = 4;
  auto logits = random_values(E * T, 50, 2.0f);
  logits[0] = logits[1] = 10.0f;  // a tie at the top of row 0: lower id first
  Tensor ids = be->alloc(DType::I32, {k, T, 1, 1}), wts = be->alloc_f32(k, T);
  be->moe_route(upload(*be, logits, {E, T, 1, 1}), k, ids, wts);
  auto got_ids = be->read_i32(ids);
  std::vector<double> want_w(k * T);
  std::vector<int32_t> want_ids(k * T);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[t * E + a] > logits[t * E + b]; });
    double mx = logits[t * E + order[0]], sum = 0, top = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(logits[t * E + e] - mx);
    for (int64_t j = 0; j < k; ++j) top += std::exp(logits[t * E + order[j]] - mx) / sum;
    for (int64_t j = 0; j < k; ++j) {
      want_ids[t * k + j] = order[j];
      want_w[t * k + j] = std::exp(logits[t * E + order[j]] - mx) / sum / top;
    }
  }
  EXPECT_EQ(got_ids, want_ids);
  expect_close(be->read_f32(wts), want_w, 1e-6, "moe_route weights");

  // Quantized gate and down weights: within the bound of the activation rounding (op_bounds.h).
  auto x = random_values(H * T, 51);
  auto wg = make_weight("gate", GgmlType::Q8_0, {H, F, E, 1}, random_values(H * F * E, 52, 0.2f));
  auto wu = make_weight("up", GgmlType::F16, {H, F, E, 1}, random_values(H * F * E, 53, 0.2f));
  auto wd = make_weight("down", GgmlType::Q4_K, {F, H, E, 1}, random_values(F * H * E, 54, 0.2f));
  Tensor out = be->alloc_f32(H, T), tx = upload(*be, x, {H, T, 1, 1});
  be->moe_experts({.x = &tx, .gate_exps = &wg->w, .up_exps = &wu->w, .down_exps = &wd->w, .ids = &ids, .weights = &wts,
                   .out = &out});
  expect_within(be->read_f32(out), moe_experts_expected(x, got_ids, be->read_f32(wts), *wg, *wu, *wd, k), "moe_experts");
}

TEST_P(ModelOps, PleGate) {
  int64_t S = 4, H = 9, W = S * H, T = 2;
  auto key = random_values(W * T, 60), qry = random_values(W * T, 61), val = random_values(H * T, 62);
  for (int64_t d = 0; d < H; ++d) key[W + 2 * H + d] = 0;  // a zero score: gate sigmoid(0) = 0.5
  Tensor out = be->alloc_f32(W, T);
  be->ple_gate(upload(*be, key, {W, T, 1, 1}), upload(*be, qry, {W, T, 1, 1}), upload(*be, val, {H, T, 1, 1}), S, out);
  std::vector<double> want(W * T);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) {
      double sc = 0;
      for (int64_t d = 0; d < H; ++d) sc += static_cast<double>(key[t * W + s * H + d]) * qry[t * W + s * H + d];
      sc /= std::sqrt(static_cast<double>(H));
      double g = sc == 0 ? 0 : (sc > 0 ? 1 : -1) * std::sqrt(std::max(std::fabs(sc), 1e-6));
      for (int64_t d = 0; d < H; ++d) want[t * W + s * H + d] = sigmoid(g) * val[t * H + d];
    }
  expect_close(be->read_f32(out), want, 1e-6, "ple_gate");
  EXPECT_FLOAT_EQ(be->read_f32(out)[W + 2 * H], 0.5f * val[H]);
}

// PLE injection (model-spec §4.8.4) of T tokens of one sequence, in float64 from its formulas: the
// pending write, the three grouped norms, the gate, the dilated conv over [history | N] and the
// residual; history moves on to the last inputs.
struct PleInjectCase {
  int64_t S, H, T;
  bool pending;
};

TEST_P(ModelOps, PleInject) {
  constexpr int64_t K = 4, dil = 3, L = (K - 1) * dil;
  constexpr double eps = 1e-6;
  // T = 1 is CUDA's one-kernel form (H = 2560: the model's, every thread five values); T = 3 and a
  // second call on the moved history check the history; S·H not a multiple of 32 anywhere.
  for (const PleInjectCase c : {PleInjectCase{4, 2560, 1, true}, {4, 40, 1, true}, {4, 40, 1, false}, {3, 24, 3, true}}) {
    const int64_t S = c.S, H = c.H, T = c.T, W = S * H;
    const std::string what = "ple_inject S=" + std::to_string(S) + " H=" + std::to_string(H) + " T=" + std::to_string(T);
    auto R = random_values(W * T, 70, 2.0f), y = random_values(H * T, 71), iw = random_values(S * T, 72);
    auto key_proj = random_values(W * T, 73), val = random_values(H * T, 74), hist = random_values(W * L, 75);
    const auto gammas = [&](uint32_t seed) {  // around 1, as stored (1 + w)
      std::vector<float> v = random_values(W, seed, 0.3f);
      for (float& x : v) x += 1.0f;
      return v;
    };
    const std::vector<float> gk = gammas(76), gq = gammas(77), gn = gammas(78), cw = random_values(K * W, 79, 0.5f);
    auto norm_key = make_weight("norm_key", GgmlType::F32, {W, 1, 1, 1}, gk);
    auto norm_query = make_weight("norm_query", GgmlType::F32, {W, 1, 1, 1}, gq);
    auto norm_conv = make_weight("norm_conv", GgmlType::F32, {W, 1, 1, 1}, gn);
    auto conv = make_weight("conv", GgmlType::F32, {K, W, 1, 1}, cw);
    Tensor tR = upload(*be, R, {W, T, 1, 1}), ty = upload(*be, y, {H, T, 1, 1}), tiw = upload(*be, iw, {S, T, 1, 1});
    Tensor tk = upload(*be, key_proj, {W, T, 1, 1}), tv = upload(*be, val, {H, T, 1, 1});
    Tensor th = upload(*be, hist, {W, L, 1, 1}), N = be->alloc_f32(W, T);
    const PleInjectArgs args{.R = &tR, .y = c.pending ? &ty : nullptr, .inject_w = c.pending ? &tiw : nullptr,
                             .key_proj = &tk, .val = &tv, .norm_key = &norm_key->w, .norm_query = &norm_query->w,
                             .norm_conv = &norm_conv->w, .conv = &conv->w, .history = &th, .n_streams = S,
                             .dilation = dil, .eps = static_cast<float>(eps), .conv_inputs = &N};
    // float64 evaluation; seq holds [history | N] a channel's rows.
    std::vector<double> want_R(W * T), want_N(W * T), seq(W * (L + T));
    for (int64_t j = 0; j < L; ++j)
      for (int64_t ch = 0; ch < W; ++ch) seq[j * W + ch] = hist[j * W + ch];
    const auto rms = [&](const double* x) {
      double ss = 0;
      for (int64_t d = 0; d < H; ++d) ss += x[d] * x[d];
      return 1.0 / std::sqrt(ss / H + eps);
    };
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < S; ++s) {
        std::vector<double> r(H), k(H), g(H);
        for (int64_t d = 0; d < H; ++d)
          r[d] = R[t * W + s * H + d] + (c.pending ? static_cast<double>(iw[t * S + s]) * y[t * H + d] : 0.0);
        for (int64_t d = 0; d < H; ++d) k[d] = key_proj[t * W + s * H + d];
        const double rr = rms(r.data()), rk = rms(k.data());
        double dot = 0;
        for (int64_t d = 0; d < H; ++d)
          dot += k[d] * rk * gk[s * H + d] * r[d] * rr * gq[s * H + d];
        const double sc = dot / std::sqrt(static_cast<double>(H));
        const double gate = sigmoid(sc == 0 ? 0 : (sc > 0 ? 1 : -1) * std::sqrt(std::max(std::fabs(sc), 1e-6)));
        for (int64_t d = 0; d < H; ++d) g[d] = gate * val[t * H + d];
        const double rg = rms(g.data());
        for (int64_t d = 0; d < H; ++d) {
          const int64_t ch = s * H + d;
          want_N[t * W + ch] = seq[(L + t) * W + ch] = g[d] * rg * gn[ch];
        }
        for (int64_t d = 0; d < H; ++d) {
          const int64_t ch = s * H + d;
          double sum = 0;
          for (int64_t j = 0; j < K; ++j) sum += cw[ch * K + j] * seq[(L + t - (K - 1 - j) * dil) * W + ch];
          want_R[t * W + ch] = r[d] + g[d] + sum * sigmoid(sum);
        }
      }
    be->ple_inject(args);
    expect_close(be->read_f32(tR), want_R, 2e-5, what + " R");
    expect_close(be->read_f32(N), want_N, 2e-5, what + " conv inputs");
    const std::vector<float> got_hist = be->read_f32(th), got_N = be->read_f32(N);
    for (int64_t j = 0; j < L; ++j)  // the last L rows of [history | N], exactly
      for (int64_t ch = 0; ch < W; ++ch) {
        const int64_t row = T + j;
        const float want = row < L ? hist[row * W + ch] : got_N[(row - L) * W + ch];
        ASSERT_EQ(got_hist[j * W + ch], want) << what << " history row " << j << " channel " << ch;
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, ModelOps, ::testing::ValuesIn(backend_names()), backend_param_name);

}  // namespace
}  // namespace regolith::test
