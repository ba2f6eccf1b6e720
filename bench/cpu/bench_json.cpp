#include "bench_json.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "server/json_constraint.h"
#include "server/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace regolith::bench {
namespace {

using server::JsonGrammar;
using server::JsonGrammarState;
using server::JsonRecognizer;
using server::JsonVocabulary;
using server::TokenConstraint;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One mask after `prefix`: ms per call (median of 5 timings of 10 calls) and the tokens it allows.
template <class State>
void time_mask(const char* what, const JsonVocabulary& vocabulary, int32_t n_vocab, State state, std::string_view prefix) {
  for (char c : prefix)
    if (!state.step(static_cast<uint8_t>(c))) fail("bench json: '", prefix, "' is not a valid start");
  TokenConstraint<State> constraint(vocabulary, state);
  std::vector<float> logits(static_cast<size_t>(n_vocab));
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) {
      std::fill(logits.begin(), logits.end(), 0.0f);
      constraint.mask(logits);
    }
    runs.push_back(ms_since(t0) / 10);
  }
  std::sort(runs.begin(), runs.end());
  const auto allowed = std::count(logits.begin(), logits.end(), 0.0f);
  std::printf("%-44s %8.3f %9lld\n", what, runs[2], static_cast<long long>(allowed));
}

}  // namespace

void bench_json(const std::string& model_path) {
  GgufFile file = GgufFile::open(model_path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(file);
  auto t0 = std::chrono::steady_clock::now();
  const JsonVocabulary vocabulary(tokenizer);
  std::printf("# JSON masks on %d tokens (tries made in %.1f ms), ms per mask\n%-44s %8s %9s\n", tokenizer.n_vocab(),
              ms_since(t0), "point of the reply", "ms", "allowed");
  const int32_t V = tokenizer.n_vocab();
  time_mask("json_object: before the object", vocabulary, V, JsonRecognizer(), "");
  time_mask("json_object: inside a string", vocabulary, V, JsonRecognizer(), "{\"a\": [{\"b\": \"xy");
  time_mask("json_object: after a string", vocabulary, V, JsonRecognizer(), "{\"a\": [{\"b\": \"xy\"");
  time_mask("json_object: inside a number", vocabulary, V, JsonRecognizer(), "{\"a\": 12");
  const auto schema = JsonGrammar::compile(nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
          "n": {"type": "number"}}, "required": ["name", "tags"]})"));
  time_mask("json_schema: before the object", vocabulary, V, JsonGrammarState(*schema), "");
  time_mask("json_schema: inside a string", vocabulary, V, JsonGrammarState(*schema), "{\"name\": \"xy");
  time_mask("json_schema: after a string", vocabulary, V, JsonGrammarState(*schema), "{\"name\": \"xy\"");
  time_mask("json_schema: inside a number", vocabulary, V, JsonGrammarState(*schema), "{\"name\": \"\", \"tags\": [], \"n\": 1");
}

}  // namespace regolith::bench
