#include "server/choice_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tokenizer/tokenizer.h"

namespace regolith::server {

// Whether produced_ + bytes and an opening agree as far as the shorter goes (no string is built:
// mask() asks this of every token of the vocabulary).
bool OpeningConstraint::allows(std::string_view bytes) const {
  if (bytes.empty()) return false;
  const std::string_view done = produced_;
  for (std::string_view o : openings_) {
    if (o.size() <= done.size()) {
      if (done.starts_with(o)) return true;
      continue;
    }
    if (!o.starts_with(done)) continue;
    const std::string_view rest = o.substr(done.size());
    if (rest.starts_with(bytes) || bytes.starts_with(rest)) return true;
  }
  return false;
}

bool OpeningConstraint::active() const {
  if (openings_.empty()) return false;
  for (const std::string& o : openings_)
    if (produced_.starts_with(o)) return false;
  return true;
}

void OpeningConstraint::mask(std::span<float> logits, const Tokenizer& tokenizer) const {
  std::vector<char> allowed(logits.size(), 0);
  bool any = false;
  for (size_t id = 0; id < logits.size() && id < static_cast<size_t>(tokenizer.n_vocab()); ++id)
    any |= allowed[id] = allows(tokenizer.token_bytes(static_cast<int32_t>(id)));
  if (!any) return;  // no token continues an opening (a vocabulary without byte tokens): leave it to the model
  for (size_t id = 0; id < logits.size(); ++id)
    if (!allowed[id]) logits[id] = -std::numeric_limits<float>::infinity();
}

void OpeningConstraint::accept(std::string_view token_bytes) {
  if (active()) produced_ += token_bytes;
}

ChoiceSampler::ChoiceSampler(const SamplingOptions& options, uint64_t seed, std::span<const int32_t> prompt,
                             std::vector<std::string> forced_openings, const JsonVocabulary* json,
                             const JsonGrammar* schema)
    : options_(options),
      sampler_(SamplerParams{.temp = options.temperature,
                             .top_k = options.top_k,
                             .top_p = options.top_p,
                             .min_p = options.min_p,
                             .seed = seed}),
      opening_(std::move(forced_openings)),
      json_(json ? JsonReplyConstraint(*json, schema) : JsonReplyConstraint()) {
  if (options_.repetition_penalty != 1.0f) {
    prompt_distinct_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_distinct_.begin(), prompt_distinct_.end());
    prompt_distinct_.erase(std::unique(prompt_distinct_.begin(), prompt_distinct_.end()), prompt_distinct_.end());
  }
}

int32_t ChoiceSampler::choose(std::span<const float> logits, const Tokenizer& tokenizer) {
  work_.assign(logits.begin(), logits.end());
  const int64_t V = static_cast<int64_t>(work_.size());
  for (const auto& [id, bias] : options_.logit_bias)
    if (id >= 0 && id < V) work_[id] += bias;
  if (options_.repetition_penalty != 1.0f) {
    const float p = options_.repetition_penalty;
    auto penalize = [&](int32_t id) {
      if (id >= 0 && id < V) work_[id] = work_[id] > 0 ? work_[id] / p : work_[id] * p;
    };
    for (int32_t id : prompt_distinct_) penalize(id);
    for (const auto& [id, n] : counts_)
      if (!std::binary_search(prompt_distinct_.begin(), prompt_distinct_.end(), id)) penalize(id);
  }
  if (options_.presence_penalty != 0 || options_.frequency_penalty != 0)
    for (const auto& [id, n] : counts_)
      if (id >= 0 && id < V) work_[id] -= options_.frequency_penalty * n + options_.presence_penalty;
  if (opening_.active()) opening_.mask(work_, tokenizer);
  if (json_.active()) json_.mask(work_);
  return sampler_.sample(work_);
}

void ChoiceSampler::accept(int32_t token, const Tokenizer& tokenizer) {
  ++counts_[token];
  if (opening_.active()) opening_.accept(tokenizer.token_bytes(token));
  if (json_.active()) json_.accept(token, tokenizer.token_bytes(token));
}

void fill_logprobs(std::span<const float> logits, int32_t chosen, int k, GeneratedToken& out) {
  double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  double log_z = mx + std::log(sum);
  out.logprob = static_cast<float>(logits[chosen] - log_z);
  out.top.clear();
  if (k <= 0) return;
  for (int32_t id : best_ids(logits, k)) out.top.push_back({id, static_cast<float>(logits[id] - log_z)});
}

}  // namespace regolith::server
