// Picks the next token of one choice: logit bias, penalties (OpenAI presence/frequency over the
// generated tokens; transformers' repetition penalty over prompt and generated tokens), an optional
// forced opening (the reply must begin with one of a few texts) or a JSON mode (json_schema.h's
// JsonReplyConstraint), then regolith's Sampler. Also computes the log-probabilities reported to
// clients, from the model's untouched distribution.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sample/sampler.h"
#include "server/json_schema.h"
#include "server/task.h"

namespace regolith {
class Tokenizer;
}

namespace regolith::server {

// Masks every token that would leave all of the allowed openings, until one is complete.
class OpeningConstraint {
 public:
  explicit OpeningConstraint(std::vector<std::string> openings) : openings_(std::move(openings)) {}
  bool active() const;
  void mask(std::span<float> logits, const Tokenizer& tokenizer) const;
  void accept(std::string_view token_bytes);

 private:
  bool allows(std::string_view bytes) const;
  std::vector<std::string> openings_;
  std::string produced_;
};

class ChoiceSampler {
 public:
  // json: the vocabulary's JSON tries when the reply must be JSON (a value of `schema` when one is
  // given, else an object), null otherwise.
  ChoiceSampler(const SamplingOptions& options, uint64_t seed, std::span<const int32_t> prompt,
                std::vector<std::string> forced_openings, const JsonVocabulary* json = nullptr,
                const JsonGrammar* schema = nullptr);

  int32_t choose(std::span<const float> logits, const Tokenizer& tokenizer);
  void accept(int32_t token, const Tokenizer& tokenizer);  // the chosen token, for penalties and the constraint

 private:
  SamplingOptions options_;
  Sampler sampler_;
  std::vector<int32_t> prompt_distinct_;         // sorted
  std::unordered_map<int32_t, int32_t> counts_;  // generated token -> occurrences
  OpeningConstraint opening_;
  JsonReplyConstraint json_;
  std::vector<float> work_;
};

// Log-softmax of `logits` at `chosen`, and the `k` most likely tokens (ties: lower id first).
void fill_logprobs(std::span<const float> logits, int32_t chosen, int k, GeneratedToken& out);

}  // namespace regolith::server
