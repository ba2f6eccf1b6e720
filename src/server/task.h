// The typed messages between HTTP workers and the scheduler thread: a GenerationTask (token ids
// and sampling settings, already validated) goes in, ResultEvents (tokens with their text, finish
// reasons, usage) come back. No JSON crosses this boundary.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace regolith::server {

class JsonGrammar;
class JsonVocabulary;

struct SamplingOptions {
  float temperature = 1.0f;  // <= 0: greedy
  float top_p = 1.0f;
  int32_t top_k = 0;         // <= 0: off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;    // OpenAI: over generated tokens, once per distinct token
  float frequency_penalty = 0.0f;   // OpenAI: over generated tokens, per occurrence
  float repetition_penalty = 1.0f;  // transformers: over prompt and generated tokens, divides positive logits
  std::optional<uint64_t> seed;     // choice i draws with seed + i; absent: a random seed
  std::vector<std::pair<int32_t, float>> logit_bias;
};

struct GenerationTask {
  std::vector<int32_t> prompt;
  int n_choices = 1;
  int first_choice = 0;       // index of this task's first choice in the response
  int64_t max_tokens = 0;     // already clamped so prompt + max_tokens fits the context
  SamplingOptions sampling;
  std::vector<std::string> stop;  // stop strings (not part of the returned text)
  bool ignore_eos = false;
  int top_logprobs = -1;      // -1: no logprobs; else the chosen token's and this many alternatives
  // When not empty, the reply must begin with one of these texts (a forced tool call); the model
  // picks among them token by token.
  std::vector<std::string> forced_openings;
  bool json_object = false;   // the reply is one JSON object (response_format json_object)
  std::shared_ptr<const JsonGrammar> json_schema;  // or a value of this schema (json_schema)
  std::shared_ptr<const JsonVocabulary> json_vocabulary;  // the tries both modes mask with
  bool use_cache = true;      // restore from and store into the prefix cache
};

enum class FinishReason { stop, length, cancelled, error };

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
};

struct GeneratedToken {
  int32_t token = 0;
  std::string text;  // text that became final with this token (empty while held back)
  float logprob = 0;
  std::vector<TokenLogprob> top;  // when asked for
};

struct RequestUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;     // restored from the prefix cache
  int64_t prefilled_tokens = 0;  // run through the model
  int64_t completion_tokens = 0;
  double queue_ms = 0, prefill_ms = 0, decode_ms = 0;
};

struct ResultEvent {
  enum class Kind { token, finished, done, error };
  Kind kind = Kind::token;
  int choice = 0;               // token, finished: the response's choice index
  GeneratedToken token{};       // token
  std::string text{};           // finished: text still held back, now final
  FinishReason finish = FinishReason::stop;
  RequestUsage usage{};         // done: one per task, after all its choices finished
  std::string error{};          // error
};

}  // namespace regolith::server
