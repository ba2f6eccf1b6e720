// Shared by the JSON-mode tests: the tiny model's tokenizer, and replies sampled from random logits
// through a TokenConstraint whose mask is checked at every step against stepping the reader
// through each token's bytes (end-of-generation tokens allowed exactly when the text is complete).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "server/json_constraint.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {

inline const Tokenizer& tiny_json_tokenizer() {
  static GgufFile file = GgufFile::open(std::string(REGOLITH_SERVER_TEST_DIR) + "/tiny.gguf");
  static Tokenizer tok = Tokenizer::from_gguf(file);
  return tok;
}

// Samples `replies` replies of at most `steps` tokens each from `start`; calls on_end with the text
// of each reply that chose an end-of-generation token; returns how many did.
template <class State>
int sample_masked_replies(const Tokenizer& tok, const JsonVocabulary& vocab, const State& start, int replies, int steps,
                          std::mt19937& rng, const std::function<void(const std::string&)>& on_end) {
  std::normal_distribution<float> noise(0.0f, 2.0f);
  int ended = 0;
  for (int reply = 0; reply < replies; ++reply) {
    TokenConstraint<State> constraint(vocab, start);
    State state = start;
    std::string text;
    for (int step = 0; step < steps; ++step) {
      std::vector<float> logits(static_cast<size_t>(tok.n_vocab()) + 7);  // padding rows past the vocabulary
      for (float& l : logits) l = noise(rng);
      constraint.mask(logits);
      int32_t best = -1;
      for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
        bool want = false;
        if (id < tok.n_vocab() && tok.is_end_of_generation(id)) {
          want = state.complete();
        } else if (id < tok.n_vocab() && (tok.token_type(id) == TokenType::normal || tok.token_type(id) == TokenType::byte) &&
                   !tok.token_bytes(id).empty()) {
          State s = state;
          want = true;
          for (char ch : tok.token_bytes(id)) want = want && s.step(static_cast<uint8_t>(ch));
        }
        EXPECT_EQ(logits[static_cast<size_t>(id)] != -std::numeric_limits<float>::infinity(), want)
            << "token " << id << " after: " << text;
        if (want != (logits[static_cast<size_t>(id)] != -std::numeric_limits<float>::infinity())) return ended;
        if (want && (best < 0 || logits[static_cast<size_t>(id)] > logits[static_cast<size_t>(best)])) best = id;
      }
      EXPECT_GE(best, 0) << "no token continues: " << text;
      if (best < 0) return ended;
      if (tok.is_end_of_generation(best)) {
        ++ended;
        on_end(text);
        break;
      }
      constraint.accept(best, tok.token_bytes(best));
      for (char ch : tok.token_bytes(best)) state.step(static_cast<uint8_t>(ch));
      text += tok.token_bytes(best);
    }
  }
  return ended;
}

}  // namespace regolith::server
