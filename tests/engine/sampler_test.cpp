// The sampler: greedy at temperature 0, filters that leave exactly the expected candidates, and
// seeded reproducibility.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

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

// The filters' definition, spelled out: every id sorted best first (stably, so ties go to the
// lower id), top-k, then top-p and min-p on probabilities normalised over the survivors of top-k,
// then a draw in that order. The sampler orders only the candidates it needs.
int32_t sample_by_full_sort(const SamplerParams& p, std::mt19937_64& rng, std::span<const float> logits) {
  const auto n = static_cast<int64_t>(logits.size());
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = p.top_k > 0 ? std::min<int64_t>(n, p.top_k) : n;
  const double mx = logits[ids[0]];
  std::vector<double> prob(keep);
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += prob[i] = std::exp(logits[ids[i]] - mx);
  for (double& v : prob) v /= sum;
  if (p.top_p < 1) {
    double cum = 0;
    for (int64_t i = 0; i < keep; ++i)
      if ((cum += prob[i]) >= p.top_p) {
        keep = i + 1;
        break;
      }
  }
  if (p.min_p > 0) {
    int64_t i = 1;
    while (i < keep && prob[i] >= p.min_p * prob[0]) ++i;
    keep = i;
  }
  std::vector<double> w(keep);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += w[i] = std::exp((logits[ids[i]] - mx) / p.temp);
  double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * total;
  for (int64_t i = 0; i < keep; ++i) {
    if (u < w[i]) return ids[i];
    u -= w[i];
  }
  return ids[keep - 1];
}

// With any filter on, the same seed draws the same tokens as the full sort: vocabularies of 3,000
// logits on a coarse grid (many ties), peaked or flat, top-p reaching past the first candidates.
TEST(Sampler, FiltersDrawAsTheFullSortDoes) {
  std::mt19937 gen(5);
  const std::vector<SamplerParams> settings{
      {.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 1},
      {.temp = 1.0f, .top_k = 7, .top_p = 1.0f, .min_p = 0.0f, .seed = 2},
      {.temp = 1.3f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 3},
      {.temp = 0.7f, .top_k = 0, .top_p = 1.0f, .min_p = 0.01f, .seed = 4},
      {.temp = 1.0f, .top_k = 0, .top_p = 0.999f, .min_p = 0.0f, .seed = 5},
      {.temp = 1.0f, .top_k = 2500, .top_p = 0.99f, .min_p = 0.0f, .seed = 6}};
  for (float spread : {0.5f, 4.0f}) {
    std::vector<float> logits(3000);
    std::normal_distribution<float> nd(0.0f, spread);
    for (float& l : logits) l = std::round(nd(gen) * 8.0f) / 8.0f;
    for (const SamplerParams& p : settings) {
      Sampler s(p);
      std::mt19937_64 rng(p.seed);
      for (int i = 0; i < 200; ++i)
        ASSERT_EQ(s.sample(logits), sample_by_full_sort(p, rng, logits))
            << "spread " << spread << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " draw " << i;
    }
  }
}

TEST(Sampler, ArgmaxIsTheFirstBest) {
  std::vector<float> logits(1001, -1.0f);
  logits[999] = logits[17] = logits[500] = 3.5f;
  EXPECT_EQ(argmax(logits), 17);
  logits[1000] = 4.0f;  // past the last full run of eight
  EXPECT_EQ(argmax(logits), 1000);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  SamplerParams p{.temp = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 42};
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

}  // namespace
}  // namespace regolith
