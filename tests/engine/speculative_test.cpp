// Speculative decoding on random models with an MTP block (`regolith mkmodel --mtp`): verified
// tokens give the logits of one-token steps, taking some back continues as if they had never been
// evaluated, the MTP head's cells agree however they are grouped and its input is the projection
// of model-spec §4.10, and a speculator's output is plain decoding's whatever its drafts.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "engine_test_util.h"
#include "gguf/gguf.h"
#include "quant/rows.h"
#include "runtime/session.h"
#include "sample/sampler.h"
#include "spec/speculative.h"

namespace regolith::test {
namespace {

template <typename F>
void expect_error(F&& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// Parameter: backend (the model is the f32 tiny preset with an MTP block).
class Speculative : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    try {
      engine_ = Engine::open(engine_model("tiny-mtp.gguf"), GetParam());
    } catch (const Error& e) {
      if (GetParam() != "cuda") throw;
      GTEST_SKIP() << e.what();  // built with CUDA, run without a device (CI)
    }
    V_ = engine_->n_vocab();
  }
  // 30 tokens: past the tiny preset's QSA budget (16 + 4 − 1 positions), so the verified tokens
  // below select blocks and complete one (positions 30..34 cross 32).
  std::vector<int32_t> prompt(int64_t n = 30) {
    std::mt19937 rng(3);
    std::vector<int32_t> out(n);
    for (auto& t : out) t = static_cast<int32_t>(rng() % V_);
    return out;
  }
  // Plain decoding: n tokens chosen one step at a time after the prompt.
  std::vector<int32_t> plain(const std::vector<int32_t>& p, int64_t n, const SamplerParams& sp) {
    Session s(engine_);
    Sampler sampler(sp);
    std::vector<float> logits = s.eval(p, {.all_logits = false});
    std::vector<int32_t> out;
    while (static_cast<int64_t>(out.size()) < n) {
      out.push_back(sampler.sample(logits));
      logits = s.eval(std::span(&out.back(), 1));
    }
    return out;
  }
  // The same with a speculator on `drafter` (made for the session).
  std::vector<int32_t> speculative(const std::vector<int32_t>& p, int64_t n, const SamplerParams& sp,
                                   const std::function<Drafter(Session&)>& make_drafter, int64_t max_drafts,
                                   SpeculativeStats* stats = nullptr, DraftCount count = DraftCount::Adaptive) {
    Session s(engine_);
    Speculator spec(s, make_drafter(s), max_drafts, count);
    Sampler sampler(sp);
    const ChooseToken choose = [&](std::span<const float> l) { return sampler.sample(l); };
    std::vector<float> logits = s.eval(p, {.all_logits = false});
    std::vector<int32_t> out{choose(logits)};
    while (static_cast<int64_t>(out.size()) < n) {
      std::vector<int32_t> more = spec.round(out.back(), choose, n - static_cast<int64_t>(out.size()));
      out.insert(out.end(), more.begin(), more.end());
    }
    if (stats) *stats = spec.stats();
    return out;
  }
  std::vector<float> row(const std::vector<float>& all, int64_t i) const {
    return {all.begin() + i * V_, all.begin() + (i + 1) * V_};
  }

  std::shared_ptr<Engine> engine_;
  int64_t V_ = 0;
};

// verify() gives the logits of one-token steps; keeping all of them continues the timeline.
TEST_P(Speculative, VerifiedTokensGiveTheStepsLogits) {
  auto p = prompt();
  std::vector<int32_t> next = {5, 17, 300, 2, 99, 41, 8};
  Session steps(engine_), verified(engine_);
  steps.eval(p);
  std::vector<float> want;
  for (int32_t t : next) {
    std::vector<float> l = steps.eval(std::span(&t, 1));
    want.insert(want.end(), l.begin(), l.end());
  }
  verified.eval(p);
  std::vector<float> got = verified.verify(std::span(next).first(6));
  verified.keep_verified(6);
  std::vector<float> last = verified.eval(std::span(next).subspan(6));
  got.insert(got.end(), last.begin(), last.end());
  expect_within_tolerance(compare_logits(got, want, V_), GetParam() + " verified");
  EXPECT_EQ(verified.tokens(), steps.tokens());
}

// Taking verified tokens back continues exactly like a session that never evaluated them: GDN and
// PLE states, the n-gram context, QSA pooled blocks and positions.
TEST_P(Speculative, TakenBackTokensLeaveNoTrace) {
  auto p = prompt();
  const std::vector<int32_t> next = {5, 17, 300, 2, 99, 41};
  Session uninterrupted(engine_);
  uninterrupted.eval(p);
  const std::vector<float> want = uninterrupted.eval(next, {.chunk = 1});
  for (int64_t keep : {1, 2, 4}) {
    Session s(engine_);
    s.eval(p);
    std::vector<int32_t> tried(next.begin(), next.begin() + keep);
    for (int32_t wrong : {7, 8, 9, 10}) tried.push_back(wrong);
    s.verify(tried);
    s.keep_verified(keep);
    EXPECT_EQ(s.n_past(), static_cast<int64_t>(p.size()) + keep);
    std::vector<float> got = s.eval(std::span(next).subspan(static_cast<size_t>(keep)), {.chunk = 1});
    std::vector<float> tail(want.begin() + keep * V_, want.end());
    expect_within_tolerance(compare_logits(got, tail, V_), GetParam() + " keep " + std::to_string(keep));
    EXPECT_EQ(s.tokens(), uninterrupted.tokens());
  }
}

// The MTP cells of a prompt run in one pass or one at a time give the same draft logits: each cell
// rotates at its own position and attends to the cells before it.
TEST_P(Speculative, MtpCellsAtOnceEqualOneAtATime) {
  const Qwen4ExpModel& model = engine_->model();
  Backend& be = engine_->backend();
  auto p = prompt(12);
  const int32_t after = 77;
  std::vector<int32_t> next(p.begin() + 1, p.end());
  next.push_back(after);
  Qwen4ExpState whole = model.new_state(be), single = model.new_state(be);
  Tensor wide;
  model.forward(be, whole, p, LogitRows::Last, {}, &wide);
  const std::vector<float> want = be.read_f32(model.mtp_forward(be, whole, wide, next, true));
  std::vector<float> got;
  for (size_t i = 0; i < p.size(); ++i) {
    model.forward(be, single, std::span(&p[i], 1), LogitRows::Last, {}, &wide);
    got = be.read_f32(model.mtp_forward(be, single, wide, std::span(&next[i], 1), true));
  }
  expect_within_tolerance(compare_logits(got, want, V_), GetParam() + " cells");
  EXPECT_EQ(whole.mtp_n_past, 12);
  EXPECT_EQ(single.mtp_n_past, 12);
}

// Drafts chosen on the backend (argmax) and read there by the next cell (mtp_forward_by) give the
// chain the host's choice gives: the same drafts, and bit for bit the same last draft logits.
TEST_P(Speculative, DraftsChosenOnTheBackendEqualTheHostsChoice) {
  const Qwen4ExpModel& model = engine_->model();
  Backend& be = engine_->backend();
  auto p = prompt(12);
  std::vector<int32_t> next(p.begin() + 1, p.end());
  next.push_back(77);
  Qwen4ExpState on_host = model.new_state(be), on_backend = model.new_state(be);
  Tensor wide_host, wide_backend;
  model.forward(be, on_host, p, LogitRows::Last, {}, &wide_host);
  model.forward(be, on_backend, p, LogitRows::Last, {}, &wide_backend);
  Tensor host_logits = model.mtp_forward(be, on_host, wide_host, next, true, &wide_host);
  Tensor backend_logits = model.mtp_forward(be, on_backend, wide_backend, next, true, &wide_backend);
  const int64_t n = 3;
  Tensor ids = be.alloc(DType::I32, {n, 1, 1, 1});
  std::vector<int32_t> host_drafts;
  for (int64_t k = 0;; ++k) {
    const std::vector<float> row = be.read_f32(host_logits);
    host_drafts.push_back(static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()));
    Tensor id = ids.slice(0, k, 1);
    be.argmax(backend_logits, id);
    if (k + 1 == n) break;
    host_logits = model.mtp_forward(be, on_host, wide_host, std::span(&host_drafts.back(), 1), true, &wide_host);
    backend_logits = model.mtp_forward_by(be, on_backend, wide_backend, id, &wide_backend);
  }
  EXPECT_EQ(be.read_i32(ids), host_drafts) << GetParam();
  EXPECT_EQ(be.read_f32(backend_logits), be.read_f32(host_logits)) << GetParam();
  Tensor two = be.alloc(DType::I32, {2, 1, 1, 1});
  expect_error([&] { model.mtp_forward_by(be, on_backend, wide_backend, two); }, "not one I32 id");
}

// The MTP block's input (traced as mtp.input) is, for each stream s,
// eh_proj · [enorm(embedding of the next token) | hnorm(R)_s], hnorm one RMS over all W values,
// computed here in double from the file's own tensors.
TEST_P(Speculative, MtpInputIsTheSpecsProjection) {
  const Qwen4ExpModel& model = engine_->model();
  const Qwen4ExpHparams& hp = model.hparams();
  Backend& be = engine_->backend();
  const int64_t H = hp.n_embd, S = hp.hc_count, W = H * S;
  auto f32_tensor = [&](const std::string& name) {
    const GgufTensor* t = model.file().find_tensor(name);
    if (!t || t->type != GgmlType::F32) throw std::runtime_error("no f32 tensor " + name);
    std::vector<float> v(static_cast<size_t>(t->n_elements()));
    std::memcpy(v.data(), t->data, v.size() * sizeof(float));
    return v;
  };
  const std::string b = "blk." + std::to_string(hp.n_layer) + ".nextn.";
  const std::vector<float> eh = f32_tensor(b + "eh_proj.weight"), enorm = f32_tensor(b + "enorm.weight"),
                           hnorm = f32_tensor(b + "hnorm.weight"), embd = f32_tensor("token_embd.weight");
  auto p = prompt(5);
  const int32_t after = 123;
  Qwen4ExpState st = model.new_state(be);
  Tensor wide;
  model.forward(be, st, p, LogitRows::Last, {}, &wide);
  const std::vector<float> R = be.read_f32(wide);
  std::vector<float> traced;
  model.mtp_forward(be, st, wide.slice(1, 4, 1), std::span(&after, 1), false, nullptr,
                    [&](std::string_view name, int64_t, const Tensor& t) {
                      if (name == "mtp.input") traced = be.read_f32(t);
                    });
  ASSERT_EQ(static_cast<int64_t>(traced.size()), W);
  const double eps = hp.rms_eps;
  auto rms_scale = [&](const float* x, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    return 1 / std::sqrt(ss / n + eps);
  };
  const float* e = embd.data() + static_cast<int64_t>(after) * H;
  const float* r = R.data() + 4 * W;
  const double es = rms_scale(e, H), rs = rms_scale(r, W);
  double worst = 0, scale = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t o = 0; o < H; ++o) {
      const float* row = eh.data() + o * 2 * H;
      double v = 0;
      for (int64_t j = 0; j < H; ++j) v += row[j] * (e[j] * es * enorm[j]);
      for (int64_t j = 0; j < H; ++j) v += row[H + j] * (r[s * H + j] * rs * hnorm[s * H + j]);
      worst = std::max(worst, std::fabs(v - traced[s * H + o]));
      scale = std::max(scale, std::fabs(v));
    }
  EXPECT_LE(worst, 1e-5 * scale) << GetParam();
}

// Whatever the drafts — the true continuation, half of it wrong, the MTP head's, prompt lookup —
// a speculator emits plain decoding's tokens, greedy and sampled under one seed.
TEST_P(Speculative, OutputIsPlainDecodings) {
  auto p = prompt();
  const int64_t n = 24;
  for (const SamplerParams& sp : {SamplerParams{.temp = 0}, SamplerParams{.temp = 1.0f, .seed = 7},
                                  SamplerParams{.temp = 0.7f, .top_k = 20, .top_p = 0.9f, .min_p = 0.02f, .seed = 3}}) {
    const std::vector<int32_t> want = plain(p, n, sp);
    const std::string what = GetParam() + " temp " + std::to_string(sp.temp);
    // The true continuation after `next`: its position in `want` is the session's length.
    auto oracle = [&](bool half_wrong) {
      return [&, half_wrong](Session& s) -> Drafter {
        return [&, half_wrong](int32_t, int64_t k) {
          const auto at = static_cast<size_t>(s.n_past() + 1 - static_cast<int64_t>(p.size()));
          std::vector<int32_t> d(want.begin() + static_cast<std::ptrdiff_t>(std::min(at, want.size())),
                                 want.begin() + static_cast<std::ptrdiff_t>(std::min(at + k, want.size())));
          if (half_wrong && d.size() > 1) d[d.size() / 2] = (d[d.size() / 2] + 1) % 512;
          return d;
        };
      };
    };
    SpeculativeStats stats;
    EXPECT_EQ(speculative(p, n, sp, oracle(false), 4, &stats), want) << what << " oracle";
    EXPECT_EQ(stats.accepted, stats.drafted) << what;
    EXPECT_GT(stats.accepted, n / 2) << what;
    EXPECT_EQ(speculative(p, n, sp, oracle(true), 4, &stats), want) << what << " half wrong";
    EXPECT_LT(stats.accepted, stats.drafted) << what;
    EXPECT_EQ(speculative(p, n, sp, mtp_drafter, 3, &stats), want) << what << " mtp";
    EXPECT_LE(stats.drafted, 3 * stats.rounds) << what;
    EXPECT_GT(stats.drafted, 0) << what;
    EXPECT_EQ(speculative(p, n, sp, [](Session& s) { return lookup_drafter(s); }, 3), want) << what << " lookup";
  }
}

// Drafts that are never right: a fixed count drafts every round, the adaptive count stops after
// kPauseAfter rounds that keep nothing and tries one draft every kProbeEvery rounds; the output is
// plain decoding's either way.
TEST_P(Speculative, NeverRightDraftsPauseDrafting) {
  auto p = prompt(10);
  const int64_t n = 40;
  const SamplerParams greedy{.temp = 0};
  const std::vector<int32_t> want = plain(p, n, greedy);
  const auto wrong = [&](Session& s) -> Drafter {
    return [&](int32_t, int64_t k) {
      const auto at = static_cast<size_t>(s.n_past() + 1 - static_cast<int64_t>(p.size()));
      std::vector<int32_t> d;
      for (int64_t i = 0; i < k; ++i) d.push_back((want[std::min(at + i, want.size() - 1)] + 1) % 512);
      return d;
    };
  };
  SpeculativeStats fixed, adaptive;
  EXPECT_EQ(speculative(p, n, greedy, wrong, 4, &fixed, DraftCount::Fixed), want);
  EXPECT_EQ(speculative(p, n, greedy, wrong, 4, &adaptive, DraftCount::Adaptive), want);
  EXPECT_EQ(fixed.accepted, 0);
  EXPECT_EQ(adaptive.accepted, 0);
  EXPECT_EQ(fixed.rounds, n - 1);
  EXPECT_GE(fixed.drafted, 4 * (n - 5));
  // 4, then 1 until the pause, then a probe of 1 after every kProbeEvery plain rounds.
  const int64_t before_pause = 4 + (Speculator::kPauseAfter - 1);
  EXPECT_LE(adaptive.drafted, before_pause + n / Speculator::kProbeEvery);
  EXPECT_GE(adaptive.drafted, before_pause + 2);
}

// A walk ends where the consumer says (a reply that ended at a token), even on a right draft; the
// session keeps `next` and the drafts before that token.
TEST_P(Speculative, AWalkEndsWhereTheConsumerSays) {
  auto p = prompt(10);
  const std::vector<int32_t> want = plain(p, 6, SamplerParams{.temp = 0});
  Session s(engine_);
  Speculator spec(s, [&](int32_t, int64_t k) { return std::vector<int32_t>(want.begin() + 1, want.begin() + 1 + k); }, 4);
  s.eval(p);
  int choices = 0;
  const ChooseToken choose = [&](std::span<const float> l) { return ++choices, argmax(l); };
  const std::vector<int32_t> out = spec.round(want[0], choose, 10, [&] { return choices < 2; });
  EXPECT_EQ(out, std::vector<int32_t>(want.begin() + 1, want.begin() + 3));
  EXPECT_EQ(s.n_past(), static_cast<int64_t>(p.size()) + 2);
  EXPECT_EQ(spec.stats().accepted, 1);
}

// Prompt lookup drafts what followed the latest earlier copy of the longest matching last tokens.
TEST_P(Speculative, LookupDraftsWhatFollowedTheLastTokens) {
  Session s(engine_);
  s.eval(std::vector<int32_t>{1, 2, 3, 4, 5, 9, 2, 3, 6, 7, 8, 2});
  Drafter lookup = lookup_drafter(s, 3);
  EXPECT_EQ(lookup(3, 3), (std::vector<int32_t>{6, 7, 8}));        // "2 3" ends at 2 and at 7: the later
  EXPECT_EQ(lookup(3, 20), (std::vector<int32_t>{6, 7, 8, 2, 3}));  // up to the end of the timeline
  EXPECT_EQ(lookup(4, 2), (std::vector<int32_t>{5, 9}));           // "2 4" never: "4" alone
  EXPECT_EQ(lookup(42, 4), (std::vector<int32_t>{}));              // never seen
  EXPECT_EQ(s.n_past(), 12);                                       // drafting evaluates nothing
}

// Batched steps (eval_batch) keep a drafting session's MTP cache: after 40 of them (past
// Session::kMaxMtpWaiting, so cells run on the way) its drafts are those of a session that took the
// same tokens one eval at a time.
TEST_P(Speculative, BatchedStepsKeepTheMtpCache) {
  auto p = prompt(8);
  Session batched(engine_), other(engine_), single(engine_);
  batched.enable_mtp();
  single.enable_mtp();
  batched.eval(p);
  other.eval(p);
  single.eval(p);
  std::mt19937 rng(9);
  Session* both[] = {&batched, &other};
  for (int i = 0; i < 40; ++i) {
    const int32_t t[2] = {static_cast<int32_t>(rng() % V_), static_cast<int32_t>(rng() % V_)};
    eval_batch(both, t);
    single.eval(std::span(t, 1));
  }
  EXPECT_EQ(batched.tokens(), single.tokens());
  EXPECT_EQ(batched.draft_mtp(5, 3), single.draft_mtp(5, 3)) << GetParam();
}

// Misuse is refused with a clear error and leaves the session usable.
TEST_P(Speculative, MisuseIsRefused) {
  auto p = prompt(8);
  Session s(engine_);
  expect_error([&] { s.draft_mtp(1, 2); }, "not enabled");
  s.enable_mtp();
  expect_error([&] { s.draft_mtp(1, 2); }, "no token evaluated yet");
  s.eval(p);
  expect_error([&] { s.enable_mtp(); }, "before the first token");
  expect_error([&] { s.queue_step(); }, "draft_mtp and verify");
  expect_error([&] { s.keep_verified(0); }, "no tokens were verified");
  s.verify(std::vector<int32_t>{1, 2});
  expect_error([&] { s.verify(std::vector<int32_t>{3}); }, "neither kept nor taken back");
  expect_error([&] { s.draft_mtp(3, 1); }, "neither kept nor taken back");
  expect_error([&] { s.keep_verified(3); }, "3 of 2 verified tokens");
  expect_error([&] { s.keep_verified(0); }, "the first is always kept");
  s.keep_verified(1);
  EXPECT_EQ(s.draft_mtp(2, 2).size(), 2u);
  EXPECT_EQ(s.n_past(), 9);

  auto plain_engine = Engine::open(engine_model("tiny.gguf"), "ref");
  Session no_mtp(plain_engine);
  expect_error([&] { no_mtp.enable_mtp(); }, "has no MTP block");
}

// The MTP projection is bound as two halves of nextn.eh_proj's rows (the embedding's columns,
// then the residual's): in a Q8_0 file each half row holds exactly the values of its columns.
TEST(MtpWeights, SplitProjectionHalvesAreTheFilesColumns) {
  auto model = Qwen4ExpModel::load(engine_model("tiny-mtp-q8_0.gguf"));
  ASSERT_TRUE(model->has_mtp());
  const MtpWeights& m = *model->weights().mtp;
  const int64_t H = model->hparams().n_embd;
  const GgufTensor* eh = model->file().find_tensor("blk." + std::to_string(model->hparams().n_layer) + ".nextn.eh_proj.weight");
  ASSERT_NE(eh, nullptr);
  ASSERT_EQ(eh->type, GgmlType::Q8_0);
  EXPECT_EQ(m.proj_embd.type, GgmlType::Q8_0);
  const uint64_t row = row_bytes(eh->type, 2 * H);
  std::vector<float> whole(2 * H), embd(H), stream(H);
  for (int64_t r = 0; r < H; ++r) {
    dequantize_row(eh->type, eh->data + r * row, 2 * H, whole.data());
    dequantize_row(m.proj_embd.type, m.proj_embd.data + r * m.proj_embd.row_bytes, H, embd.data());
    dequantize_row(m.proj_stream.type, m.proj_stream.data + r * m.proj_stream.row_bytes, H, stream.data());
    ASSERT_TRUE(std::equal(embd.begin(), embd.end(), whole.begin())) << "row " << r;
    ASSERT_TRUE(std::equal(stream.begin(), stream.end(), whole.begin() + H)) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Speculative, ::testing::ValuesIn(engine_backends()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return "on_" + info.param; });

}  // namespace
}  // namespace regolith::test
