// Token sampling from one row of logits: top-k, top-p and min-p filters (on the untempered
// distribution, in that order, as llama.cpp's default chain), then temperature and a seeded draw.
// Temperature <= 0 is greedy (argmax, lowest id on ties). Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace regolith {

struct SamplerParams {
  float temp = 0.8f;    // <= 0: greedy
  int32_t top_k = 40;   // <= 0: off
  float top_p = 0.95f;  // >= 1: off
  float min_p = 0.05f;  // <= 0: off
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  int32_t sample(std::span<const float> logits);

 private:
  SamplerParams params_;
  std::mt19937_64 rng_;
  std::vector<double> weights_;  // a draw's weights over the whole vocabulary
};

int32_t argmax(std::span<const float> logits);
// The k best ids (at most all), best first: higher logit, then lower id.
std::vector<int32_t> best_ids(std::span<const float> logits, int64_t k);

}  // namespace regolith
