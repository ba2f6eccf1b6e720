// Quantization quality (`regolith kld`): a model's next-token distributions against a base model's
// on the same tokens — per position KL(P_base || P_model) from FP64 log-softmax, top-1 agreement,
// and both models' perplexity on the input's own next tokens; the measurement llama.cpp's
// `llama-perplexity --kl-divergence` makes. Streams chunk by chunk: only one chunk's logits of the
// base and of one model are held, plus one KL value per position and model for the percentiles.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "runtime/session.h"

namespace regolith {

// One position. P = softmax(base), Q = softmax(model).
struct LogitRowComparison {
  double kl = 0;                         // Σ_i p_i·(log p_i − log q_i)
  int32_t top_base = 0, top_model = 0;   // argmax (the lower id on ties)
  double logp_base = 0, logp_model = 0;  // log-probability of `next` (0 when next < 0)
};
LogitRowComparison compare_logit_rows(std::span<const float> base, std::span<const float> model, int32_t next);

struct KldStats {
  int64_t n_positions = 0;  // positions compared
  int64_t n_next = 0;       // positions with a next token (perplexity)
  double kl_mean = 0, kl_stderr = 0;  // stderr: sample standard deviation / sqrt(n) (0 for n < 2)
  double kl_median = 0, kl_p99 = 0, kl_max = 0;  // percentiles interpolate linearly between sorted values
  double top1 = 0;                    // fraction of positions where both argmaxes agree
  double ppl_base = 0, ppl_model = 0; // exp(mean negative log-likelihood of the next token)
};

class KldAccumulator {
 public:
  void add(const LogitRowComparison& c, bool has_next);
  KldStats stats() const;
  const std::vector<double>& kl_values() const { return kl_; }  // per position, in input order

 private:
  std::vector<double> kl_;
  int64_t same_top1_ = 0, n_next_ = 0;
  double nll_base_ = 0, nll_model_ = 0;
};

// Evaluates `base` and each of `models` on the same consecutive chunks of `tokens` (a fresh
// session per chunk, every position's logits; the base once per chunk) and compares every
// position; position i's next token is tokens[i + 1]. Throws on an empty input or model list,
// chunk < 1 or different vocabularies. `on_chunk` gets the tokens done so far after each chunk.
std::vector<KldAccumulator> kl_divergence(const std::shared_ptr<Engine>& base,
                                         const std::vector<std::shared_ptr<Engine>>& models, std::span<const int32_t> tokens,
                                         int64_t chunk, const std::function<void(int64_t done)>& on_chunk = {});

}  // namespace regolith
