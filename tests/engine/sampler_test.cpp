// The sampler: greedy at temperature 0, filters that leave exactly the expected candidates, and
// seeded reproducibility.
#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "sample/sampler.h"

namespace regolith {
namespace {

TEST(Sampler, GreedyAtZeroTemperatureTakesLowestIdOnTies) {
  std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s({.temp = 0});
  EXPECT_EQ(s.sample(logits), 1);
}

std::map<int32_t, int> histogram(const SamplerParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.sample(logits)];
  return h;
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  std::vector<float> logits{1.0f, 3.0f, 2.0f, 2.5f, 0.0f};
  auto h = histogram({.temp = 1.0f, .top_k = 2, .top_p = 1.0f, .min_p = 0.0f, .seed = 7}, logits, 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(1) && h.count(3));
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // probabilities ~ 0.665, 0.245, 0.090: top-p 0.8 keeps the first two.
  std::vector<float> logits{2.0f, 1.0f, 0.0f};
  auto h = histogram({.temp = 1.0f, .top_k = 0, .top_p = 0.8f, .min_p = 0.0f, .seed = 3}, logits, 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_FALSE(h.count(2));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  std::vector<float> logits{2.0f, 1.0f, 0.0f};  // p1/p0 = 0.37, p2/p0 = 0.135
  auto h = histogram({.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.2f, .seed = 5}, logits, 2000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_FALSE(h.count(2));
}

TEST(Sampler, FrequenciesFollowTheTemperedDistribution) {
  std::vector<float> logits{0.0f, std::log(3.0f)};  // 1:3 at temperature 1
  auto h = histogram({.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 11}, logits, 20000);
  EXPECT_NEAR(h[1] / 20000.0, 0.75, 0.02);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  SamplerParams p{.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 42};
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

}  // namespace
}  // namespace regolith
