// JSON mode (`response_format: {"type": "json_object"}`): the reply must be one JSON object (RFC
// 8259, strings valid UTF-8; whitespace between tokens at most one space, or a newline and up to 32
// spaces or tabs) and nothing after it. A byte-level recognizer tracks the reply; before
// each token, every token whose bytes cannot continue it is masked, and the end-of-generation
// tokens are allowed only once the object is complete. The recognizer never accepts a prefix that
// cannot be completed (a lone UTF-16 surrogate is refused at its second hex digit, a UTF-8
// sequence byte by byte), so the mask always leaves a token that leads on.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace regolith {
class Tokenizer;
}

namespace regolith::server {

// The inside of a JSON string after its opening quote, byte by byte, up to the closing quote:
// UTF-8 checked as it comes (RFC 3629's ranges, so no overlong form or encoded surrogate), \u
// surrogates only in pairs, controls refused.
class JsonStringReader {
 public:
  enum class Step : uint8_t { refused, more, closed };
  Step step(uint8_t byte);  // the state is unchanged when refused
  // Nothing pending: any whole characters but '"', '\\' and controls continue the string.
  bool plain() const { return mode_ == Mode::chars && utf8_left_ == 0; }
  bool operator==(const JsonStringReader&) const = default;

 private:
  enum class Mode : uint8_t { chars, escape, hex, low_backslash, low_u };
  bool step_in(uint8_t byte);
  Mode mode_ = Mode::chars;
  bool need_low_ = false;  // the \u escape being read must be a low surrogate
  uint8_t utf8_left_ = 0;  // continuation bytes still due
  uint8_t utf8_lo_ = 0x80, utf8_hi_ = 0xBF;  // the range of the next one
  uint8_t hex_left_ = 0;
  uint16_t code_ = 0;  // the \u escape's digits so far
};

class JsonRecognizer {
 public:
  // Reads one more byte; false (and the state unchanged) when no JSON object text goes on so.
  bool step(uint8_t byte);
  bool complete() const { return mode_ == Mode::done; }
  bool in_plain_string() const { return mode_ == Mode::string && string_.plain(); }

 private:
  enum class Mode : uint8_t {
    start,         // before the object: whitespace, '{'
    value,         // a value is due (after ':' or an array's ',')
    array_first,   // after '[': a value or ']'
    object_first,  // after '{': a key or '}'
    key,           // after an object's ',': a key
    colon,         // after a key
    after,         // after a value: ',' or the closer
    string,
    minus, zero, integer, dot, fraction, exp_mark, exp_sign, exponent,  // a number
    literal,       // true / false / null: literal_ and literal_at_
    done,
  };
  bool step_in(uint8_t byte);
  bool open_container(bool object);
  bool close_container(bool object);
  void end_value();
  bool start_value(uint8_t byte);
  bool space(uint8_t byte);

  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxIndent = 32;
  uint64_t objects_ = 0;  // bit d: the container at depth d is an object (else an array)
  uint8_t depth_ = 0;
  Mode mode_ = Mode::start;
  bool key_string_ = false;  // the string being read is an object key
  uint8_t literal_ = 0, literal_at_ = 0;
  uint8_t spaces_ = 0;  // the whitespace run so far: 0 none, 1 a space, 2 + n a newline and n indents
  JsonStringReader string_;
};

// A vocabulary's tokens as two byte tries: whole-character string content (no '"', '\\' or
// controls), which a plain string state accepts in bulk, and every other token, walked with the
// recognizer. Control and user-defined tokens (chat markup, <think>) never appear in JSON text.
class JsonVocabulary {
 public:
  explicit JsonVocabulary(const Tokenizer& tokenizer);
  // Made once, by the first caller (any thread): the server's first JSON request builds the tries
  // on its own HTTP worker (0.2–0.3 s for a 150–250K vocabulary), not on the scheduler thread,
  // so running streams do not wait for them.
  class Lazy {
   public:
    explicit Lazy(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
    std::shared_ptr<const JsonVocabulary> get() const;

   private:
    const Tokenizer& tokenizer_;
    mutable std::once_flag once_;
    mutable std::shared_ptr<const JsonVocabulary> vocabulary_;
  };

 private:
  template <class State>
  friend class TokenConstraint;
  struct Node {
    uint32_t first_child = 0, next_sibling = 0;  // 0: none (the root is node 0)
    uint32_t tokens_begin = 0, tokens_end = 0;   // ids ending here, in token_ids
    uint8_t byte = 0;
  };
  struct Trie {
    std::vector<Node> nodes{Node{}};
    std::vector<int32_t> token_ids;
    void insert(std::string_view bytes, int32_t id, std::vector<std::vector<int32_t>>& ends);
  };
  Trie content_, other_;
  std::vector<int32_t> content_ids_, end_ids_;
  int32_t n_vocab_ = 0;
};

// Masks the tokens that cannot continue a reply read by State (JsonRecognizer, or
// JsonGrammarState for a schema: json_schema.h), which has step(byte), complete() and
// in_plain_string().
template <class State>
class TokenConstraint {
 public:
  TokenConstraint(const JsonVocabulary& vocabulary, State start) : vocab_(&vocabulary), state_(std::move(start)) {}
  // Sets every logit whose token cannot come next to -inf.
  void mask(std::span<float> logits) const;
  void accept(int32_t token, std::string_view bytes);
  bool complete() const { return state_.complete(); }

 private:
  void walk(const JsonVocabulary::Trie& trie, std::vector<char>& allowed) const;
  const JsonVocabulary* vocab_;
  State state_;
};

using JsonConstraint = TokenConstraint<JsonRecognizer>;

}  // namespace regolith::server
