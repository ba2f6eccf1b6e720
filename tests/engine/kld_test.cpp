// `regolith kld`'s measurement: the KL / statistics math on hand-made cases, a model against
// itself (exactly 0, 100% top-1), and Q8_0 / Q4_0 quantizations of the tiny model (KL > 0, larger
// for Q4_0), plus the errors.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine_test_util.h"
#include "quant/model_quantize.h"
#include "runtime/kl_divergence.h"

using namespace regolith;
using regolith::test::engine_model;

namespace {

std::vector<int32_t> test_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((7 + 31 * i) % vocab));
  return t;
}

}  // namespace

TEST(KlMath, TwoTokenDistributions) {
  // P = (1/2, 1/2), Q = (1/4, 3/4) (model logits shifted by 5: softmax ignores shifts).
  const std::vector<float> base = {0.0f, 0.0f}, model = {std::log(0.25f) + 5, std::log(0.75f) + 5};
  const LogitRowComparison c = compare_logit_rows(base, model, 1);
  EXPECT_NEAR(c.kl, 0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75), 1e-7);  // 0.5·ln(4/3)
  EXPECT_EQ(c.top_base, 0);  // a tie: the lower id
  EXPECT_EQ(c.top_model, 1);
  EXPECT_NEAR(c.logp_base, std::log(0.5), 1e-12);
  EXPECT_NEAR(c.logp_model, std::log(0.75), 1e-7);
}

TEST(KlMath, IdenticalRowsAreExactlyZeroEvenForLargeLogits) {
  const std::vector<float> row = {1000.0f, 1001.5f, 999.0f, -3.0f};
  const LogitRowComparison c = compare_logit_rows(row, row, -1);
  EXPECT_EQ(c.kl, 0.0);
  EXPECT_EQ(c.top_base, 1);
  EXPECT_EQ(c.top_model, 1);
  EXPECT_THROW(compare_logit_rows(row, {row.begin(), row.end() - 1}, -1), Error);
  EXPECT_THROW(compare_logit_rows(row, row, 4), Error);
}

TEST(KlMath, Statistics) {
  KldAccumulator acc;
  // KL 1, 2, 3, 4; argmaxes agree at two positions; next tokens at the first two with log-probs.
  acc.add({.kl = 3, .top_base = 1, .top_model = 1, .logp_base = -1, .logp_model = -2}, true);
  acc.add({.kl = 1, .top_base = 0, .top_model = 2, .logp_base = -2, .logp_model = -3}, true);
  acc.add({.kl = 4, .top_base = 5, .top_model = 5}, false);
  acc.add({.kl = 2, .top_base = 1, .top_model = 0}, false);
  const KldStats s = acc.stats();
  EXPECT_EQ(s.n_positions, 4);
  EXPECT_EQ(s.n_next, 2);
  EXPECT_DOUBLE_EQ(s.kl_mean, 2.5);
  EXPECT_DOUBLE_EQ(s.kl_stderr, std::sqrt(5.0 / 3.0) / 2.0);  // sample sd sqrt(5/3), n = 4
  EXPECT_DOUBLE_EQ(s.kl_median, 2.5);
  EXPECT_NEAR(s.kl_p99, 3.97, 1e-12);  // 0.99·3 = 2.97: between the sorted values 3 and 4
  EXPECT_DOUBLE_EQ(s.kl_max, 4);
  EXPECT_DOUBLE_EQ(s.top1, 0.5);
  EXPECT_DOUBLE_EQ(s.ppl_base, std::exp(1.5));
  EXPECT_DOUBLE_EQ(s.ppl_model, std::exp(2.5));
}

class Kld : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("regolith_kld_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    base_ = Engine::open(engine_model("tiny.gguf"));
  }
  static void TearDownTestSuite() {
    base_.reset();
    std::filesystem::remove_all(dir_);
  }
  static std::shared_ptr<Engine> quantized(GgmlType type) {
    QuantizeModelOptions o;
    o.input = engine_model("tiny.gguf");
    o.output = (dir_ / (std::string(type_name(type)) + ".gguf")).string();
    o.recipe = single_type_recipe(type);
    FILE* log = std::tmpfile();
    quantize_model(o, log);
    std::fclose(log);
    return Engine::open(o.output);
  }

  static inline std::filesystem::path dir_;
  static inline std::shared_ptr<Engine> base_;
};

TEST_F(Kld, ModelAgainstItselfIsExactlyZero) {
  auto same = Engine::open(engine_model("tiny.gguf"));
  const KldStats s = kl_divergence(base_, {same}, test_tokens(48, base_->n_vocab()), 16).at(0).stats();
  EXPECT_EQ(s.n_positions, 48);
  EXPECT_EQ(s.n_next, 47);
  EXPECT_EQ(s.kl_mean, 0.0);
  EXPECT_EQ(s.kl_max, 0.0);
  EXPECT_EQ(s.top1, 1.0);
  EXPECT_EQ(s.ppl_base, s.ppl_model);
  EXPECT_GT(s.ppl_base, 1.0);
}

TEST_F(Kld, Q4_0LosesMoreThanQ8_0) {
  const std::vector<int32_t> tokens = test_tokens(48, base_->n_vocab());
  const std::vector<KldAccumulator> acc = kl_divergence(base_, {quantized(GgmlType::Q8_0), quantized(GgmlType::Q4_0)}, tokens, 16);
  const KldStats q8 = acc.at(0).stats(), q4 = acc.at(1).stats();
  EXPECT_EQ(acc.at(0).kl_values().size(), tokens.size());
  std::printf("tiny: KL Q8_0 %.3g ± %.2g (top-1 %.1f%%), Q4_0 %.3g ± %.2g (top-1 %.1f%%)\n", q8.kl_mean, q8.kl_stderr,
              100 * q8.top1, q4.kl_mean, q4.kl_stderr, 100 * q4.top1);
  EXPECT_GT(q8.kl_mean, 0.0);
  EXPECT_GT(q4.kl_mean, q8.kl_mean);
  EXPECT_GE(q8.kl_max, q8.kl_p99);
  EXPECT_GE(q8.kl_p99, q8.kl_median);
}

TEST_F(Kld, Errors) {
  const std::vector<int32_t> tokens = test_tokens(8, 256);
  EXPECT_THROW(kl_divergence(base_, {base_}, {}, 16), Error);
  EXPECT_THROW(kl_divergence(base_, {base_}, tokens, 0), Error);
  EXPECT_THROW(kl_divergence(base_, {}, tokens, 16), Error);
  try {
    kl_divergence(base_, {base_, Engine::open(engine_model("tiny-a.f32.gguf"))}, tokens, 16);
    ADD_FAILURE() << "no error for different vocabularies";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocabularies differ"), std::string::npos) << e.what();
  }
}
