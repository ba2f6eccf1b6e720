// Parity with transformers (tests/data/fixtures, made by tools/reference/make_fixtures.py): for
// every fixture and prompt, logits whole / chunked / token by token and greedy continuations of the
// engine on the converted F32 GGUF against the reference, plus the QSA selection masks.
#include <cstdio>
#include <filesystem>
#include <map>
#include <tuple>

#include "core/error.h"
#include "engine_test_util.h"
#include "gguf/safetensors.h"
#include "runtime/session.h"
#include "sample/sampler.h"

namespace regolith::test {
namespace {

std::vector<std::string> fixture_names() {
  std::vector<std::string> out;
  std::filesystem::path dir(REGOLITH_FIXTURES);
  if (std::filesystem::exists(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (std::filesystem::exists(e.path() / "reference.safetensors")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

class Reference {
 public:
  explicit Reference(const std::string& fixture)
      : file_(SafetensorsFile::open(std::string(REGOLITH_FIXTURES) + "/" + fixture + "/reference.safetensors")) {
    for (const StTensor& t : file_.tensors()) index_[t.name] = &t;
  }
  bool has(const std::string& name) const { return index_.count(name) != 0; }
  const StTensor& get(const std::string& name) const {
    auto it = index_.find(name);
    if (it == index_.end()) throw std::runtime_error("reference has no " + name);
    return *it->second;
  }
  std::vector<std::string> prompts() const {
    std::vector<std::string> out;
    for (int k = 0;; ++k) {
      std::string name = cat("p", k);
      if (!has(name + ".tokens")) return out;
      out.push_back(name);
    }
  }
  std::vector<int32_t> ints(const std::string& name) const {
    std::vector<int32_t> out;
    for (int64_t v : get(name).to_i64()) out.push_back(static_cast<int32_t>(v));
    return out;
  }
  std::vector<float> floats(const std::string& name) const { return get(name).to_f32(); }

 private:
  SafetensorsFile file_;
  std::map<std::string, const StTensor*> index_;
};

// Parameters: fixture, backend.
class Parity : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    std::tie(fixture_, backend_) = GetParam();
    try {
      engine_ = Engine::open(engine_model(fixture_ + ".f32.gguf"), backend_);
    } catch (const Error& e) {
      if (backend_ != "cuda") throw;
      GTEST_SKIP() << e.what();  // built with CUDA, run without a device (CI)
    }
    ref_ = std::make_unique<Reference>(fixture_);
    V_ = engine_->n_vocab();
  }
  void report(const std::string& prompt, const std::string& mode, const LogitsDiff& d) {
    std::printf("[parity] %s %s %s %-10s max|d| %.3e  rel %.3e  argmax mismatches %lld\n", backend_.c_str(), fixture_.c_str(),
                prompt.c_str(), mode.c_str(), d.max_abs, d.max_rel, (long long)d.argmax_mismatches);
    expect_within_tolerance(d, backend_ + " " + fixture_ + " " + prompt + " " + mode);
  }
  std::vector<float> eval(const std::vector<int32_t>& tokens, int64_t chunk) {
    Session s(engine_);
    return s.eval(tokens, {.chunk = chunk});
  }

  std::string fixture_, backend_;
  std::shared_ptr<Engine> engine_;
  std::unique_ptr<Reference> ref_;
  int64_t V_ = 0;
};

TEST_P(Parity, WholePrompt) {
  for (const std::string& p : ref_->prompts()) {
    auto tokens = ref_->ints(p + ".tokens");
    report(p, "whole", compare_logits(eval(tokens, 0), ref_->floats(p + ".logits"), V_));
  }
}

TEST_P(Parity, ChunkedLikeReference) {
  for (const std::string& p : ref_->prompts())
    for (int chunk : {5, 8}) {
      std::string name = p + ".logits_chunk" + std::to_string(chunk);
      if (!ref_->has(name)) continue;
      report(p, "chunk" + std::to_string(chunk), compare_logits(eval(ref_->ints(p + ".tokens"), chunk), ref_->floats(name), V_));
    }
}

// Chunk sizes aligned and not aligned to the compression ratios (4 and 8 in the fixtures).
TEST_P(Parity, ChunkedOtherSizes) {
  for (const std::string& p : ref_->prompts()) {
    auto tokens = ref_->ints(p + ".tokens");
    auto want = ref_->floats(p + ".logits");
    for (int chunk : {2, 3, 4, 7, 13, 16})
      report(p, "chunk" + std::to_string(chunk), compare_logits(eval(tokens, chunk), want, V_));
  }
}

TEST_P(Parity, TokenByToken) {
  for (const std::string& p : ref_->prompts())
    report(p, "decode", compare_logits(eval(ref_->ints(p + ".tokens"), 1), ref_->floats(p + ".logits_decode"), V_));
}

TEST_P(Parity, GreedyContinuation) {
  for (const std::string& p : ref_->prompts()) {
    auto tokens = ref_->ints(p + ".tokens");
    auto want = ref_->ints(p + ".greedy");
    auto want_logits = ref_->floats(p + ".greedy_logits");
    Session s(engine_);
    std::vector<float> logits = s.eval(tokens, {.all_logits = false});
    std::vector<int32_t> got;
    std::vector<float> got_logits;
    for (size_t i = 0; i < want.size(); ++i) {
      got_logits.insert(got_logits.end(), logits.begin(), logits.end());
      int32_t next = argmax(logits);
      got.push_back(next);
      logits = s.eval(std::vector<int32_t>{next}, {.all_logits = false});
    }
    EXPECT_EQ(got, want) << backend_ << " " << fixture_ << " " << p;
    report(p, "greedy", compare_logits(got_logits, want_logits, V_));
  }
}

// The same continuation decoded as `regolith run` does (Session::queue_step: each step issued
// before its token is known; on a GPU it reads the token and its n-gram rows from mapped host
// memory): the same ids, and logits bit for bit those of steps evaluated one by one.
TEST_P(Parity, QueuedGreedyContinuation) {
  for (const std::string& p : ref_->prompts()) {
    auto tokens = ref_->ints(p + ".tokens");
    auto want = ref_->ints(p + ".greedy");
    Session serial(engine_), queued(engine_);
    std::vector<float> logits = serial.eval(tokens, {.all_logits = false});
    std::vector<float> serial_logits, queued_logits;
    std::vector<int32_t> serial_ids;
    for (size_t i = 0; i < want.size(); ++i) {
      serial_logits.insert(serial_logits.end(), logits.begin(), logits.end());
      serial_ids.push_back(argmax(logits));
      logits = serial.eval(std::vector<int32_t>{serial_ids.back()}, {.all_logits = false});
    }
    std::vector<float> prompt_logits = queued.eval(tokens, {.all_logits = false});
    std::span<const float> step = prompt_logits;
    std::vector<int32_t> got;
    queued.queue_step();
    for (size_t i = 0; i < want.size(); ++i) {
      queued_logits.insert(queued_logits.end(), step.begin(), step.end());
      got.push_back(argmax(step));
      queued.give_token(got.back());
      if (i + 1 < want.size()) queued.queue_step();
      step = queued.step_logits();
    }
    EXPECT_EQ(got, want) << backend_ << " " << fixture_ << " " << p;
    EXPECT_EQ(got, serial_ids) << backend_ << " " << fixture_ << " " << p;
    EXPECT_TRUE(queued_logits == serial_logits) << backend_ << " " << fixture_ << " " << p << ": logits differ";
    EXPECT_EQ(queued.tokens(), serial.tokens());
    report(p, "queued", compare_logits(queued_logits, ref_->floats(p + ".greedy_logits"), V_));
  }
}

// Every prompt's greedy continuation decoded side by side, one batched step for all of them a token
// (eval_batch, as the server decodes several replies): each sequence at its own position, the
// same ids as the reference and logits within its tolerance. One prompt runs twice (two sessions).
TEST_P(Parity, BatchedGreedyContinuation) {
  std::vector<std::string> prompts = ref_->prompts();
  prompts.push_back(prompts.front());
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<Session*> batch;
  std::vector<std::vector<float>> logits;
  for (const std::string& p : prompts) {
    sessions.push_back(std::make_unique<Session>(engine_));
    batch.push_back(sessions.back().get());
    logits.push_back(sessions.back()->eval(ref_->ints(p + ".tokens"), {.all_logits = false}));
  }
  const size_t steps = ref_->ints(prompts.front() + ".greedy").size();
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<std::vector<float>> got_logits(prompts.size());
  for (size_t step = 0; step < steps; ++step) {
    std::vector<int32_t> next;
    for (size_t i = 0; i < prompts.size(); ++i) {
      got_logits[i].insert(got_logits[i].end(), logits[i].begin(), logits[i].end());
      got[i].push_back(argmax(logits[i]));
      next.push_back(got[i].back());
    }
    const std::vector<float> all = eval_batch(batch, next);
    for (size_t i = 0; i < prompts.size(); ++i)
      logits[i].assign(all.begin() + static_cast<std::ptrdiff_t>(i * V_), all.begin() + static_cast<std::ptrdiff_t>((i + 1) * V_));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string& p = prompts[i];
    auto want = ref_->ints(p + ".greedy");
    ASSERT_EQ(want.size(), steps) << p;
    EXPECT_EQ(got[i], want) << backend_ << " " << fixture_ << " " << p << " (batch row " << i << ")";
    report(p, "batched", compare_logits(got_logits[i], ref_->floats(p + ".greedy_logits"), V_));
  }
}

// The indexer's selection, row by row, against the reference's attention masks. A layer with no
// selection traced took every row as dense (its whole causal prefix, the model's rule for short
// caches): then the reference's masks must be causal.
TEST_P(Parity, QsaSelection) {
  const auto& hp = engine_->model().hparams();
  for (const std::string& p : ref_->prompts()) {
    auto tokens = ref_->ints(p + ".tokens");
    int64_t T = static_cast<int64_t>(tokens.size());
    std::map<int64_t, std::vector<int32_t>> sel, n_sel;
    Session s(engine_);
    s.set_trace([&](std::string_view name, int64_t il, const Tensor& t) {
      if (name == "qsa.sel") sel[il] = engine_->backend().read_i32(t);
      if (name == "qsa.n_sel") n_sel[il] = engine_->backend().read_i32(t);
    });
    s.eval(tokens);
    for (int64_t il = 0; il < hp.n_layer; ++il) {
      if (hp.is_recurrent[il]) continue;
      auto mask = ref_->get(p + ".qsa_sel.L" + std::to_string(il)).to_i64();
      ASSERT_EQ(static_cast<int64_t>(mask.size()), T * T);
      const bool dense = !sel.count(il);
      int64_t max_sel = dense ? 0 : static_cast<int64_t>(sel[il].size()) / T;
      int64_t rows_differ = 0;
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int64_t> ours(T, 0);
        if (dense)
          std::fill(ours.begin(), ours.begin() + t + 1, 1);
        else
          for (int64_t j = 0; j < n_sel[il][t]; ++j) ours[sel[il][t * max_sel + j]] = 1;
        if (!std::equal(ours.begin(), ours.end(), mask.begin() + t * T)) {
          ++rows_differ;
          std::string a, b;
          for (int64_t j = 0; j < T; ++j) {
            if (ours[j]) a += std::to_string(j) + ",";
            if (mask[t * T + j]) b += std::to_string(j) + ",";
          }
          ADD_FAILURE() << backend_ << " " << fixture_ << " " << p << " layer " << il << " row " << t << "\n ours " << a << "\n  ref " << b;
        }
      }
      EXPECT_EQ(rows_differ, 0) << backend_ << " " << fixture_ << " " << p << " layer " << il;
    }
  }
}

// The GGUF in the checkpoint's own type (bf16 for tiny-a: the reference ran on exactly those values).
TEST_P(Parity, CheckpointTypeWholeAndDecode) {
  engine_ = Engine::open(engine_model(fixture_ + ".native.gguf"), backend_);
  for (const std::string& p : ref_->prompts()) {
    auto tokens = ref_->ints(p + ".tokens");
    report(p, "native", compare_logits(eval(tokens, 0), ref_->floats(p + ".logits"), V_));
    report(p, "native-dec", compare_logits(eval(tokens, 1), ref_->floats(p + ".logits_decode"), V_));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity, ::testing::Combine(::testing::ValuesIn(fixture_names()), ::testing::ValuesIn(engine_backends())),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace regolith::test
