// Self-consistency of the engine on random models (`regolith mkmodel`, F32 and Q8_0): whole,
// chunked and token-by-token evaluation agree; a restored checkpoint continues exactly like a
// session that never left; EOS inside a prompt and prompts past the QSA budget included.
#include <random>

#include "engine_test_util.h"
#include "core/error.h"
#include "runtime/session.h"

namespace regolith::test {
namespace {

std::vector<int32_t> random_prompt(int64_t n, int64_t n_vocab, int32_t eos, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out(n);
  for (auto& t : out) t = static_cast<int32_t>(rng() % n_vocab);
  if (n > 10) out[7] = out[n / 2] = eos;  // n-gram cuts inside the prompt
  return out;
}

class Consistency : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { engine_ = Engine::open(engine_model(GetParam()), "ref"); }
  std::vector<int32_t> prompt(int64_t n, uint32_t seed = 1) {
    const auto& hp = engine_->model().hparams();
    return random_prompt(n, hp.n_vocab, static_cast<int32_t>(hp.ple_eos_token_id), seed);
  }
  std::vector<float> eval(const std::vector<int32_t>& tokens, int64_t chunk) {
    Session s(engine_);
    return s.eval(tokens, {.chunk = chunk});
  }
  std::shared_ptr<Engine> engine_;
};

// 75 tokens: past the tiny preset's QSA budget (16 + 4 − 1 positions), not a multiple of the ratio.
TEST_P(Consistency, ChunkedAndDecodeEqualWhole) {
  auto tokens = prompt(75);
  auto whole = eval(tokens, 0);
  for (int64_t chunk : {1, 2, 3, 4, 5, 16, 64, 70}) {
    LogitsDiff d = compare_logits(eval(tokens, chunk), whole, engine_->n_vocab());
    std::printf("[consistency] %s chunk %-3lld rel %.3e\n", GetParam().c_str(), (long long)chunk, d.max_rel);
    expect_within_tolerance(d, GetParam() + " chunk " + std::to_string(chunk));
  }
}

// Chunk 0 plans with the memory at hand: a limit that holds 16 tokens' activations gives forward
// calls of 16, 16 and 8 tokens, and the logits of chunks of 16 chosen by hand; without a limit the
// host's memory holds all 40 tokens of the tiny model at once.
TEST_P(Consistency, ChunkZeroFitsTheMemory) {
  auto tokens = prompt(40);
  std::vector<int64_t> calls;
  auto count_calls = [&](std::string_view name, int64_t, const Tensor& t) {
    if (name == "embd") calls.push_back(t.ne(1));
  };
  Session s(engine_);
  s.set_trace(count_calls);
  const uint64_t limit = 4 * engine_->model().forward_bytes(16, LogitRows::All);
  auto got = s.eval(tokens, {.chunk = 0, .memory_limit = limit});
  EXPECT_EQ(calls, (std::vector<int64_t>{16, 16, 8}));
  EXPECT_EQ(got, eval(tokens, 16));

  calls.clear();
  Session whole(engine_);
  whole.set_trace(count_calls);
  whole.eval(tokens);
  EXPECT_EQ(calls, (std::vector<int64_t>{40}));
}

TEST_P(Consistency, LastLogitsOnlyEqualsLastRow) {
  auto tokens = prompt(23);
  auto whole = eval(tokens, 0);
  Session s(engine_);
  auto last = s.eval(tokens, {.chunk = 6, .all_logits = false});
  int64_t V = engine_->n_vocab();
  ASSERT_EQ(static_cast<int64_t>(last.size()), V);
  std::vector<float> want(whole.end() - V, whole.end());
  expect_within_tolerance(compare_logits(last, want, V), "last row");
}

// Steps evaluated without their logits (bench's queued decode) advance the session exactly as
// steps that read them do: the next token's logits are the same bits.
TEST_P(Consistency, StepsWithoutLogitsAdvanceTheSameWay) {
  auto tokens = prompt(12);
  Session read(engine_), unread(engine_);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    std::span<const int32_t> step(&tokens[i], 1);
    EXPECT_EQ(static_cast<int64_t>(read.eval(step).size()), engine_->n_vocab());
    EXPECT_TRUE(unread.eval(step, {.read_logits = false}).empty());
  }
  EXPECT_EQ(unread.tokens(), read.tokens());
  std::span<const int32_t> last(&tokens.back(), 1);
  EXPECT_EQ(unread.eval(last), read.eval(last));
}

// The logits of each token, evaluated one at a time.
std::vector<std::vector<float>> one_by_one(Session& s, std::span<const int32_t> tokens) {
  std::vector<std::vector<float>> out;
  for (const int32_t& t : tokens) out.push_back(s.eval(std::span<const int32_t>(&t, 1)));
  return out;
}

// Queued steps (Session::queue_step) in the order `regolith run` uses them equal steps evaluated
// one by one; misuse is refused with a clear error and leaves the session usable.
TEST_P(Consistency, QueuedStepsEqualSerialSteps) {
  auto tokens = prompt(12);
  Session serial(engine_), queued(engine_);
  const std::vector<std::vector<float>> want = one_by_one(serial, tokens);
  queued.queue_step();
  queued.give_token(tokens[0]);
  for (size_t i = 1; i < tokens.size(); ++i) {
    queued.queue_step();
    std::span<const float> got = queued.step_logits();
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want[i - 1].begin(), want[i - 1].end())) << "step " << i - 1;
    queued.give_token(tokens[i]);
  }
  std::span<const float> last = queued.step_logits();
  EXPECT_TRUE(std::equal(last.begin(), last.end(), want.back().begin(), want.back().end()));
  EXPECT_EQ(queued.tokens(), serial.tokens());
  EXPECT_EQ(queued.n_past(), serial.n_past());
}

// A mailbox in host memory: what a host backend's receive copies at once.
class VectorMailbox final : public HostMailbox {
 public:
  explicit VectorMailbox(size_t n) : bytes_(n) {}
  std::span<uint8_t> bytes() override { return bytes_; }
  void release() override { ++released_; }
  int released_ = 0;

 private:
  std::vector<uint8_t> bytes_;
};

// The model's queued forward reads its token and n-gram rows from the mailbox and matches forward
// of the same token bit for bit (n-gram cuts by EOS included). A host backend copies the mailbox
// when the receive is issued, so here the token is given first.
TEST_P(Consistency, QueuedForwardReadsItsMailbox) {
  const Qwen4ExpModel& model = engine_->model();
  Backend& be = engine_->backend();
  auto tokens = prompt(16);
  Qwen4ExpState direct = model.new_state(be), queued = model.new_state(be);
  VectorMailbox inputs(model.queued_inputs_bytes());
  for (size_t i = 0; i < tokens.size(); ++i) {
    model.give_queued_token(queued, inputs, tokens[i]);
    EXPECT_EQ(inputs.released_, static_cast<int>(i + 1));
    std::vector<float> got = be.read_f32(model.forward_queued(be, queued, inputs));
    std::vector<float> want = be.read_f32(model.forward(be, direct, std::span(&tokens[i], 1), LogitRows::Last));
    EXPECT_TRUE(got == want) << "token " << i;
    EXPECT_EQ(queued.ple_context, direct.ple_context);
  }
  EXPECT_THROW(model.give_queued_token(queued, inputs, -1), Error);
  EXPECT_EQ(inputs.released_, static_cast<int>(tokens.size()));
  VectorMailbox small(4);
  EXPECT_THROW(model.forward_queued(be, queued, small), Error);
}

TEST_P(Consistency, QueuedStepsRefuseMisuse) {
  Session s(engine_);
  auto tokens = prompt(4);
  EXPECT_THROW(s.give_token(tokens[0]), Error);  // nothing queued
  EXPECT_THROW(s.step_logits(), Error);
  s.queue_step();
  EXPECT_THROW(s.queue_step(), Error);  // the queued step has no token
  EXPECT_THROW(s.step_logits(), Error);
  EXPECT_THROW(s.eval(tokens), Error);
  EXPECT_THROW(s.snapshot(), Error);
  EXPECT_THROW(s.give_token(static_cast<int32_t>(engine_->n_vocab())), Error);  // unknown id: the step still waits
  EXPECT_THROW(s.give_token(-1), Error);
  s.give_token(tokens[0]);
  s.queue_step();
  s.give_token(tokens[1]);
  EXPECT_THROW(s.queue_step(), Error);  // two in flight
  EXPECT_EQ(static_cast<int64_t>(s.step_logits().size()), engine_->n_vocab());
  s.queue_step();  // left without its token: restore drops it
  Session fresh(engine_);
  s.restore(fresh.snapshot());
  EXPECT_EQ(s.eval(tokens), fresh.eval(tokens));
}

// A decode step of several sessions at once (eval_batch) advances each as eval() of its token
// would: three sessions at different positions (one past the QSA budget, one at its first token),
// five batched steps, then one more step each alone; the reference backend's products do not depend
// on how many tokens they run over, so the logits are equal bit for bit.
TEST_P(Consistency, BatchedStepsEqualSeparateSteps) {
  const std::vector<std::vector<int32_t>> prompts{prompt(75, 1), prompt(20, 2), {}};
  const std::vector<int32_t> steps = prompt(16, 3), last{5, 6, 7};
  std::vector<std::unique_ptr<Session>> batched, separate;
  std::vector<Session*> batch;
  for (const auto& p : prompts) {
    batched.push_back(std::make_unique<Session>(engine_));
    separate.push_back(std::make_unique<Session>(engine_));
    if (!p.empty()) batched.back()->eval(p), separate.back()->eval(p);
    batch.push_back(batched.back().get());
  }
  const size_t V = static_cast<size_t>(engine_->n_vocab());
  for (size_t step = 0; step < 5; ++step) {
    std::vector<int32_t> tokens;
    for (size_t i = 0; i < batch.size(); ++i) tokens.push_back(steps[step * batch.size() + i]);
    const std::vector<float> got = eval_batch(batch, tokens);
    ASSERT_EQ(got.size(), batch.size() * V);
    for (size_t i = 0; i < batch.size(); ++i) {
      const std::vector<float> want = separate[i]->eval(std::span(&tokens[i], 1));
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + static_cast<std::ptrdiff_t>(i * V)))
          << "step " << step << " session " << i;
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(batched[i]->tokens(), separate[i]->tokens());
    EXPECT_EQ(batched[i]->eval(std::span(&last[i], 1)), separate[i]->eval(std::span(&last[i], 1)));
  }
}

TEST_P(Consistency, BatchedStepsRefuseMisuse) {
  Session a(engine_), b(engine_);
  std::vector<Session*> twice{&a, &a}, both{&a, &b};
  const std::vector<int32_t> two{1, 2}, one{1}, bad{1, static_cast<int32_t>(engine_->n_vocab())};
  EXPECT_THROW(eval_batch(twice, two), Error);
  EXPECT_THROW(eval_batch(both, one), Error);
  EXPECT_THROW(eval_batch(both, bad), Error);
  EXPECT_THROW(eval_batch(std::span<Session* const>(), std::span<const int32_t>()), Error);
  auto other = Engine::open(engine_model(GetParam()), "ref");
  Session c(other);
  std::vector<Session*> mixed{&a, &c};
  EXPECT_THROW(eval_batch(mixed, two), Error);
  b.queue_step();  // waits for its token
  EXPECT_THROW(eval_batch(both, two), Error);
  b.give_token(3);
  b.step_logits();
  EXPECT_EQ(a.n_past(), 0);  // nothing refused moved a session
  EXPECT_EQ(eval_batch(both, two).size(), 2 * static_cast<size_t>(engine_->n_vocab()));
  EXPECT_EQ(a.n_past(), 1);
  EXPECT_EQ(b.n_past(), 2);
}

// Given steps whose logits nobody read (a server sequence that ended or was cancelled) are left
// behind by eval: the timeline goes on from them, and later queued steps return their own logits.
TEST_P(Consistency, EvalAfterUnreadStepsContinuesTheTimeline) {
  auto tokens = prompt(5);
  Session serial(engine_), s(engine_);
  const std::vector<std::vector<float>> want = one_by_one(serial, tokens);
  s.queue_step();
  s.give_token(tokens[0]);
  s.queue_step();
  s.give_token(tokens[1]);
  EXPECT_TRUE(s.has_unread_step());
  EXPECT_EQ(s.eval(std::span<const int32_t>(&tokens[2], 1)), want[2]);
  EXPECT_EQ(s.eval(std::span<const int32_t>(&tokens[3], 1)), want[3]);
  EXPECT_FALSE(s.has_unread_step());
  s.queue_step();
  s.give_token(tokens[4]);
  std::span<const float> got = s.step_logits();
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want[4].begin(), want[4].end()));
  EXPECT_EQ(s.tokens(), serial.tokens());
}

TEST_P(Consistency, RestoreThenContinueEqualsUninterrupted) {
  auto a = prompt(30, 2), b = prompt(25, 3), detour = prompt(40, 4);
  Session straight(engine_);
  straight.eval(a);
  auto want = straight.eval(b, {.chunk = 7});

  Session s(engine_);
  s.eval(a);
  SessionSnapshot snap = s.snapshot();
  s.eval(detour, {.chunk = 9});  // moves every piece of state: caches, GDN, PLE history
  s.restore(snap);
  EXPECT_EQ(s.n_past(), 30);
  EXPECT_EQ(s.tokens(), a);
  auto got = s.eval(b, {.chunk = 7});
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want) << "restored session must continue bit for bit";

  s.restore(snap);  // a snapshot serves more than one restore
  EXPECT_EQ(s.eval(b, {.chunk = 7}), want);
}

// A BF16 GDN state (BackendOptions::gdn_state): the state is rounded at the end of each forward
// call, so the first call's logits equal the FP32 state's exactly; a restored checkpoint continues
// bit for bit; later logits move. Measured on the ref backend: max |Δlogit| / max|logit| 2.0e-3
// (F32 weights) and 4.0e-2 (Q8_0, at one position; most positions about 1e-3), no argmax change.
// The bound, 0.1, is not the F32 tolerance: this option trades precision for memory.
TEST_P(Consistency, Bf16GdnStateStaysNearTheF32State) {
  auto bf16 = std::make_shared<Engine>(Qwen4ExpModel::load(engine_model(GetParam())), make_backend("ref"), DType::BF16);
  Session s(bf16);
  auto a = prompt(30, 5), b = prompt(12, 6);
  std::vector<float> got = s.eval(a, {.chunk = 8});
  SessionSnapshot snap = s.snapshot();
  std::vector<float> tail = s.eval(b, {.chunk = 1});
  got.insert(got.end(), tail.begin(), tail.end());
  s.restore(snap);
  EXPECT_EQ(s.eval(b, {.chunk = 1}), tail) << "restored BF16 session must continue bit for bit";

  Session f32(engine_);
  std::vector<float> want = f32.eval(a, {.chunk = 8}), want_tail = f32.eval(b, {.chunk = 1});
  want.insert(want.end(), want_tail.begin(), want_tail.end());
  const int64_t V = engine_->n_vocab(), first_call = 8 * V;
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + first_call, want.begin())) << "first call's logits differ";
  LogitsDiff d = compare_logits(got, want, V);
  std::printf("[consistency] %s bf16 GDN state: rel %.3e, argmax mismatches %lld\n", GetParam().c_str(), d.max_rel,
              (long long)d.argmax_mismatches);
  EXPECT_GT(d.max_rel, 0.0) << "the BF16 state changed nothing: is it rounded at all?";
  EXPECT_LE(d.max_rel, 0.1);
  EXPECT_EQ(d.argmax_mismatches, 0);
  EXPECT_THROW(Engine(Qwen4ExpModel::load(engine_model(GetParam())), make_backend("ref"), DType::I32), Error);
}

TEST_P(Consistency, ResetStartsOver) {
  auto tokens = prompt(12);
  Session s(engine_);
  auto first = s.eval(tokens);
  s.reset();
  EXPECT_EQ(s.eval(tokens), first);
}

TEST_P(Consistency, RejectsTokensOutsideTheVocabulary) {
  Session s(engine_);
  std::vector<int32_t> bad{1, static_cast<int32_t>(engine_->n_vocab())};
  try {
    s.eval(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(RandomModels, Consistency, ::testing::Values("tiny.gguf", "tiny-q8_0.gguf"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tiny.gguf" ? std::string("f32") : std::string("q8_0");
                         });

}  // namespace
}  // namespace regolith::test
