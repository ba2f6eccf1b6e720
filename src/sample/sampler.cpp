#include "sample/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace regolith {

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) fail("argmax of no logits");
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temp <= 0) return argmax(logits);
  int64_t n = static_cast<int64_t>(logits.size());
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  int64_t keep = n;
  if (params_.top_k > 0) keep = std::min<int64_t>(keep, params_.top_k);
  // Untempered probabilities of the survivors, for top-p and min-p.
  double mx = logits[ids[0]];
  std::vector<double> p(keep);
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += p[i] = std::exp(logits[ids[i]] - mx);
  for (double& v : p) v /= sum;
  if (params_.top_p < 1) {
    double cum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += p[i];
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0) {
    double bound = params_.min_p * p[0];
    int64_t i = 1;
    while (i < keep && p[i] >= bound) ++i;
    keep = i;
  }
  // Temperature, then a draw from the renormalised survivors.
  std::vector<double> w(keep);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += w[i] = std::exp((logits[ids[i]] - mx) / params_.temp);
  double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  for (int64_t i = 0; i < keep; ++i) {
    if (u < w[i]) return ids[i];
    u -= w[i];
  }
  return ids[keep - 1];
}

}  // namespace regolith
