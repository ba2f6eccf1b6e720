#include "runtime/kl_divergence.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace regolith {
namespace {

// log Σ exp(x_i), in FP64.
double log_sum_exp(std::span<const float> x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(v - mx);
  return mx + std::log(sum);
}

int32_t argmax(std::span<const float> x) {
  return static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());  // the first maximum
}

// Linear interpolation between the sorted values around fraction·(n − 1).
double percentile(const std::vector<double>& sorted, double fraction) {
  const double p = fraction * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(p);
  const double next = sorted[std::min(i + 1, sorted.size() - 1)];
  return sorted[i] + (p - static_cast<double>(i)) * (next - sorted[i]);
}

}  // namespace

LogitRowComparison compare_logit_rows(std::span<const float> base, std::span<const float> model, int32_t next) {
  if (base.size() != model.size() || base.empty()) fail("compare_logit_rows: rows of ", base.size(), " and ", model.size());
  const double lse_p = log_sum_exp(base), lse_q = log_sum_exp(model);
  LogitRowComparison c;
  for (size_t i = 0; i < base.size(); ++i) {
    const double logp = base[i] - lse_p, logq = model[i] - lse_q;
    c.kl += std::exp(logp) * (logp - logq);
  }
  c.top_base = argmax(base);
  c.top_model = argmax(model);
  if (next >= 0) {
    if (static_cast<size_t>(next) >= base.size()) fail("compare_logit_rows: token ", next, " outside the vocabulary");
    c.logp_base = base[next] - lse_p;
    c.logp_model = model[next] - lse_q;
  }
  return c;
}

void KldAccumulator::add(const LogitRowComparison& c, bool has_next) {
  kl_.push_back(c.kl);
  same_top1_ += c.top_base == c.top_model;
  if (has_next) {
    ++n_next_;
    nll_base_ -= c.logp_base;
    nll_model_ -= c.logp_model;
  }
}

KldStats KldAccumulator::stats() const {
  KldStats s;
  s.n_positions = static_cast<int64_t>(kl_.size());
  s.n_next = n_next_;
  if (kl_.empty()) return s;
  const double n = static_cast<double>(kl_.size());
  for (double v : kl_) s.kl_mean += v;
  s.kl_mean /= n;
  if (kl_.size() > 1) {
    double ss = 0;
    for (double v : kl_) ss += (v - s.kl_mean) * (v - s.kl_mean);
    s.kl_stderr = std::sqrt(ss / (n - 1) / n);
  }
  std::vector<double> sorted = kl_;
  std::sort(sorted.begin(), sorted.end());
  s.kl_median = percentile(sorted, 0.5);
  s.kl_p99 = percentile(sorted, 0.99);
  s.kl_max = sorted.back();
  s.top1 = static_cast<double>(same_top1_) / n;
  if (n_next_ > 0) {
    s.ppl_base = std::exp(nll_base_ / static_cast<double>(n_next_));
    s.ppl_model = std::exp(nll_model_ / static_cast<double>(n_next_));
  }
  return s;
}

std::vector<KldAccumulator> kl_divergence(const std::shared_ptr<Engine>& base,
                                         const std::vector<std::shared_ptr<Engine>>& models, std::span<const int32_t> tokens,
                                         int64_t chunk, const std::function<void(int64_t done)>& on_chunk) {
  if (tokens.empty()) fail("kld: no input tokens");
  if (models.empty()) fail("kld: no model to compare with the base");
  if (chunk < 1) fail("kld: the chunk size must be at least 1 (got ", chunk, ")");
  const int64_t V = base->n_vocab(), n = static_cast<int64_t>(tokens.size());
  for (const auto& m : models)
    if (m->n_vocab() != V) fail("kld: the vocabularies differ (base ", V, " tokens, model ", m->n_vocab(), " tokens)");
  std::vector<KldAccumulator> acc(models.size());
  for (int64_t i0 = 0; i0 < n; i0 += chunk) {
    auto part = tokens.subspan(i0, std::min(chunk, n - i0));
    const std::vector<float> lb = Session(base).eval(part);
    for (size_t k = 0; k < models.size(); ++k) {
      const std::vector<float> lm = Session(models[k]).eval(part);
      for (size_t j = 0; j < part.size(); ++j) {
        const int64_t i = i0 + static_cast<int64_t>(j);
        const int32_t next = i + 1 < n ? tokens[i + 1] : -1;
        const std::span<const float> rb(lb.data() + j * V, V), rm(lm.data() + j * V, V);
        acc[k].add(compare_logit_rows(rb, rm, next), next >= 0);
      }
    }
    if (on_chunk) on_chunk(i0 + static_cast<int64_t>(part.size()));
  }
  return acc;
}

}  // namespace regolith
