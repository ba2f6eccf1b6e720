#include "sample/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/error.h"

namespace regolith {
namespace {

// The largest logit: eight running maxima (vector lanes), then theirs.
float max_logit(std::span<const float> logits) {
  std::array<float, 8> m;
  m.fill(logits[0]);
  size_t i = 0;
  for (; i + 8 <= logits.size(); i += 8)
    for (size_t j = 0; j < 8; ++j) m[j] = std::max(m[j], logits[i + j]);
  for (; i < logits.size(); ++i) m[0] = std::max(m[0], logits[i]);
  return *std::max_element(m.begin(), m.end());
}

// Candidates best first: higher logit, then lower id (the order a stable sort of the ids gives).
struct BestFirst {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); }
};

}  // namespace

std::vector<int32_t> best_ids(std::span<const float> logits, int64_t k) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  k = std::clamp<int64_t>(k, 0, static_cast<int64_t>(ids.size()));
  if (k == static_cast<int64_t>(ids.size()))
    std::sort(ids.begin(), ids.end(), BestFirst{logits});
  else
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), BestFirst{logits});
  ids.resize(static_cast<size_t>(k));
  return ids;
}

int32_t argmax(std::span<const float> logits) {
  if (logits.empty()) fail("argmax of no logits");
  auto best = std::find(logits.begin(), logits.end(), max_logit(logits));
  if (best == logits.end()) best = std::max_element(logits.begin(), logits.end());  // NaNs
  return static_cast<int32_t>(best - logits.begin());
}

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {}

// Only the candidates the filters can keep are ordered: the top k, or, with top-p or min-p alone,
// a best-first prefix grown until the filters end inside it; with no filter at all the draw walks
// the ids in order. The probabilities the filters read are normalised over the top k (or over
// the whole vocabulary without top-k), as when every candidate was sorted.
int32_t Sampler::sample(std::span<const float> logits) {
  if (params_.temp <= 0) return argmax(logits);
  if (logits.empty()) fail("sampling of no logits");
  const auto n = static_cast<int64_t>(logits.size());
  const double mx = max_logit(logits);
  const bool top_k = params_.top_k > 0 && params_.top_k < n, top_p = params_.top_p < 1, min_p = params_.min_p > 0;
  const auto tempered = [&](int32_t id) { return std::exp((logits[id] - mx) / params_.temp); };
  if (!top_k && !top_p && !min_p) {
    weights_.resize(static_cast<size_t>(n));
    double total = 0;
    // Single-precision exponentials (less than half the double ones' time), summed in double.
    const float inv_temp = 1.0f / params_.temp, top = static_cast<float>(mx);
    for (int32_t id = 0; id < n; ++id) total += weights_[id] = std::exp((logits[id] - top) * inv_temp);
    double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
    for (int32_t id = 0; id < n; ++id) {
      if (u < weights_[id]) return id;
      u -= weights_[id];
    }
    return static_cast<int32_t>(n - 1);
  }
  // Untempered probabilities of the top-k survivors (or of all), for top-p and min-p.
  double sum = 0;
  std::vector<int32_t> ids;
  if (top_k) {
    ids = best_ids(logits, params_.top_k);
    for (int32_t id : ids) sum += std::exp(logits[id] - mx);
  } else {
    for (float l : logits) sum += std::exp(l - mx);
  }
  int64_t keep = 0;
  for (int64_t m = top_k ? params_.top_k : std::min<int64_t>(n, 1024);; m = m < n / 16 ? 16 * m : n) {
    if (!top_k) ids = best_ids(logits, m);
    // Filters in order; a prefix shorter than both cut-offs grows unless it holds every id.
    keep = m;
    bool cut = false;
    if (top_p) {
      double cum = 0;
      for (int64_t i = 0; i < m && !cut; ++i)
        if ((cum += std::exp(logits[ids[i]] - mx) / sum) >= params_.top_p) keep = i + 1, cut = true;
    }
    if (min_p) {
      const double bound = params_.min_p * (std::exp(logits[ids[0]] - mx) / sum);
      int64_t i = 1;
      while (i < keep && std::exp(logits[ids[i]] - mx) / sum >= bound) ++i;
      cut = cut || i < keep;
      keep = i;
    }
    if (cut || top_k || m == n) break;
  }
  // Temperature, then a draw from the renormalised survivors, best first.
  std::vector<double> w(keep);
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += w[i] = tempered(ids[i]);
  double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  for (int64_t i = 0; i < keep; ++i) {
    if (u < w[i]) return ids[i];
    u -= w[i];
  }
  return ids[keep - 1];
}

}  // namespace regolith
