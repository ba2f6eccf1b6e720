#include "server/json_constraint.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/error.h"
#include "server/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {
namespace {

bool is_space(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
bool is_digit(uint8_t b) { return b >= '0' && b <= '9'; }

int hex_value(uint8_t b) {
  if (is_digit(b)) return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

constexpr std::string_view kLiterals[] = {"true", "false", "null"};

}  // namespace

bool JsonRecognizer::step(uint8_t byte) {
  JsonRecognizer next = *this;
  if (!is_space(byte)) next.spaces_ = 0;
  if (!next.step_in(byte)) return false;
  *this = next;
  return true;
}

bool JsonRecognizer::open_container(bool object) {
  if (depth_ == kMaxDepth) return false;
  if (object) objects_ |= uint64_t{1} << depth_;
  else objects_ &= ~(uint64_t{1} << depth_);
  ++depth_;
  mode_ = object ? Mode::object_first : Mode::array_first;
  return true;
}

bool JsonRecognizer::close_container(bool object) {
  if (depth_ == 0 || ((objects_ >> (depth_ - 1)) & 1) != static_cast<uint64_t>(object)) return false;
  --depth_;
  end_value();
  return true;
}

// Whitespace between tokens, as the schema grammar allows it: nothing, one space, or a newline and
// up to kMaxIndent spaces or tabs (a reply cannot pad itself without end).
bool JsonRecognizer::space(uint8_t b) {
  if (spaces_ == 0) {
    if (b != ' ' && b != '\n') return false;
    spaces_ = b == ' ' ? 1 : 2;
    return true;
  }
  if (spaces_ < 2 || spaces_ >= 2 + kMaxIndent || (b != ' ' && b != '\t')) return false;
  ++spaces_;
  return true;
}

void JsonRecognizer::end_value() { mode_ = depth_ == 0 ? Mode::done : Mode::after; }

bool JsonRecognizer::start_value(uint8_t byte) {
  switch (byte) {
    case '{': return open_container(true);
    case '[': return open_container(false);
    case '"': mode_ = Mode::string, key_string_ = false, string_ = {}; return true;
    case '-': mode_ = Mode::minus; return true;
    case '0': mode_ = Mode::zero; return true;
    case 't': mode_ = Mode::literal, literal_ = 0, literal_at_ = 1; return true;
    case 'f': mode_ = Mode::literal, literal_ = 1, literal_at_ = 1; return true;
    case 'n': mode_ = Mode::literal, literal_ = 2, literal_at_ = 1; return true;
    default:
      if (byte >= '1' && byte <= '9') return mode_ = Mode::integer, true;
      return false;
  }
}

JsonStringReader::Step JsonStringReader::step(uint8_t byte) {
  if (mode_ == Mode::chars && utf8_left_ == 0 && byte == '"') return Step::closed;
  JsonStringReader next = *this;
  if (!next.step_in(byte)) return Step::refused;
  *this = next;
  return Step::more;
}

bool JsonStringReader::step_in(uint8_t b) {
  switch (mode_) {
    case Mode::chars:
      if (utf8_left_ > 0) {
        if (b < utf8_lo_ || b > utf8_hi_) return false;
        --utf8_left_;
        utf8_lo_ = 0x80, utf8_hi_ = 0xBF;
        return true;
      }
      if (b == '\\') return mode_ = Mode::escape, true;
      if (b < 0x20) return false;
      if (b < 0x80) return true;
      if (b >= 0xC2 && b <= 0xDF) utf8_left_ = 1;
      else if (b == 0xE0) utf8_left_ = 2, utf8_lo_ = 0xA0;
      else if (b >= 0xE1 && b <= 0xEF) utf8_left_ = 2, utf8_hi_ = b == 0xED ? 0x9F : 0xBF;
      else if (b == 0xF0) utf8_left_ = 3, utf8_lo_ = 0x90;
      else if (b >= 0xF1 && b <= 0xF3) utf8_left_ = 3;
      else if (b == 0xF4) utf8_left_ = 3, utf8_hi_ = 0x8F;
      else return false;
      return true;
    case Mode::escape:
      if (b == 'u') return mode_ = Mode::hex, hex_left_ = 4, code_ = 0, true;
      if (std::string_view("\"\\/bfnrt").find(static_cast<char>(b)) == std::string_view::npos) return false;
      mode_ = Mode::chars;
      return true;
    case Mode::hex: {
      const int v = hex_value(b);
      if (v < 0) return false;
      code_ = static_cast<uint16_t>(code_ << 4 | v);
      --hex_left_;
      // The first two digits tell a surrogate half: a lone low half, or anything but a low half
      // after a high one, is refused as soon as it shows.
      if (hex_left_ == 3 && need_low_ && code_ != 0xD) return false;
      if (hex_left_ == 2 && need_low_ != (code_ >= 0xDC && code_ <= 0xDF)) return false;
      if (hex_left_ == 0) {
        const bool high = (code_ >> 8) >= 0xD8 && (code_ >> 8) <= 0xDB;
        mode_ = high && !need_low_ ? Mode::low_backslash : Mode::chars;
        need_low_ = false;
      }
      return true;
    }
    case Mode::low_backslash:
      return b == '\\' && (mode_ = Mode::low_u, true);
    case Mode::low_u:
      if (b != 'u') return false;
      mode_ = Mode::hex, hex_left_ = 4, code_ = 0, need_low_ = true;
      return true;
  }
  return false;
}

bool JsonRecognizer::step_in(uint8_t b) {
  switch (mode_) {
    case Mode::start:
      if (is_space(b)) return space(b);
      return b == '{' && open_container(true);
    case Mode::value:
      if (is_space(b)) return space(b);
      return start_value(b);
    case Mode::array_first:
      if (is_space(b)) return space(b);
      if (b == ']') return close_container(false);
      return start_value(b);
    case Mode::object_first:
      if (is_space(b)) return space(b);
      if (b == '}') return close_container(true);
      [[fallthrough]];
    case Mode::key:
      if (is_space(b)) return space(b);
      if (b != '"') return false;
      mode_ = Mode::string, key_string_ = true, string_ = {};
      return true;
    case Mode::colon:
      if (is_space(b)) return space(b);
      return b == ':' && (mode_ = Mode::value, true);
    case Mode::after:
      if (is_space(b)) return space(b);
      if (b == ',') {
        mode_ = (objects_ >> (depth_ - 1)) & 1 ? Mode::key : Mode::value;
        return true;
      }
      if (b == '}' || b == ']') return close_container(b == '}');
      return false;
    case Mode::string:
      switch (string_.step(b)) {
        case JsonStringReader::Step::refused: return false;
        case JsonStringReader::Step::more: return true;
        case JsonStringReader::Step::closed:
          if (key_string_) mode_ = Mode::colon;
          else end_value();
          return true;
      }
      return false;
    case Mode::minus:
      if (b == '0') return mode_ = Mode::zero, true;
      return b >= '1' && b <= '9' && (mode_ = Mode::integer, true);
    case Mode::zero:
    case Mode::integer:
    case Mode::fraction:
      if (is_digit(b) && mode_ != Mode::zero) return true;
      if (b == '.' && mode_ != Mode::fraction) return mode_ = Mode::dot, true;
      if (b == 'e' || b == 'E') return mode_ = Mode::exp_mark, true;
      end_value();  // the number ended before this byte
      return step_in(b);
    case Mode::dot:
      return is_digit(b) && (mode_ = Mode::fraction, true);
    case Mode::exp_mark:
      if (b == '+' || b == '-') return mode_ = Mode::exp_sign, true;
      [[fallthrough]];
    case Mode::exp_sign:
      return is_digit(b) && (mode_ = Mode::exponent, true);
    case Mode::exponent:
      if (is_digit(b)) return true;
      end_value();
      return step_in(b);
    case Mode::literal: {
      const std::string_view word = kLiterals[literal_];
      if (b != static_cast<uint8_t>(word[literal_at_])) return false;
      if (++literal_at_ == word.size()) end_value();
      return true;
    }
    case Mode::done:
      return false;
  }
  return false;
}

void JsonVocabulary::Trie::insert(std::string_view bytes, int32_t id, std::vector<std::vector<int32_t>>& ends) {
  uint32_t n = 0;
  for (char ch : bytes) {
    const auto b = static_cast<uint8_t>(ch);
    uint32_t c = nodes[n].first_child, last = 0;
    while (c != 0 && nodes[c].byte != b) last = c, c = nodes[c].next_sibling;
    if (c == 0) {
      c = static_cast<uint32_t>(nodes.size());
      nodes.push_back(Node{.byte = b});
      if (last != 0) nodes[last].next_sibling = c;
      else nodes[n].first_child = c;
    }
    n = c;
  }
  if (ends.size() < nodes.size()) ends.resize(nodes.size());
  ends[n].push_back(id);
}

JsonVocabulary::JsonVocabulary(const Tokenizer& tokenizer) : n_vocab_(tokenizer.n_vocab()) {
  // Content: from a plain string state the bytes go on and end in one.
  JsonRecognizer plain;
  for (uint8_t b : std::string_view("{\"")) plain.step(b);
  std::vector<std::vector<int32_t>> content_ends, other_ends;
  for (int32_t id = 0; id < n_vocab_; ++id) {
    if (tokenizer.is_end_of_generation(id)) {
      end_ids_.push_back(id);
      continue;
    }
    const TokenType type = tokenizer.token_type(id);
    if (type != TokenType::normal && type != TokenType::byte) continue;
    const std::string_view bytes = tokenizer.token_bytes(id);
    if (bytes.empty()) continue;
    JsonRecognizer s = plain;
    bool content = true;
    for (char ch : bytes) content = content && s.step(static_cast<uint8_t>(ch));
    if (content && s.in_plain_string()) {
      content_.insert(bytes, id, content_ends);
      content_ids_.push_back(id);
    } else {
      other_.insert(bytes, id, other_ends);
    }
  }
  for (auto [trie, ends] : {std::pair{&content_, &content_ends}, std::pair{&other_, &other_ends}}) {
    ends->resize(trie->nodes.size());
    for (size_t n = 0; n < trie->nodes.size(); ++n) {
      trie->nodes[n].tokens_begin = static_cast<uint32_t>(trie->token_ids.size());
      trie->token_ids.insert(trie->token_ids.end(), (*ends)[n].begin(), (*ends)[n].end());
      trie->nodes[n].tokens_end = static_cast<uint32_t>(trie->token_ids.size());
    }
  }
}

std::shared_ptr<const JsonVocabulary> JsonVocabulary::Lazy::get() const {
  std::call_once(once_, [this] { vocabulary_ = std::make_shared<const JsonVocabulary>(tokenizer_); });
  return vocabulary_;
}

template <class State>
void TokenConstraint<State>::walk(const JsonVocabulary::Trie& trie, std::vector<char>& allowed) const {
  struct Item {
    uint32_t node;
    State state;
  };
  std::vector<Item> stack{{0, state_}};
  while (!stack.empty()) {
    const Item item = stack.back();
    stack.pop_back();
    for (uint32_t c = trie.nodes[item.node].first_child; c != 0; c = trie.nodes[c].next_sibling) {
      const JsonVocabulary::Node& n = trie.nodes[c];
      State s = item.state;
      if (!s.step(n.byte)) continue;
      for (uint32_t k = n.tokens_begin; k < n.tokens_end; ++k) allowed[static_cast<size_t>(trie.token_ids[k])] = 1;
      if (n.first_child != 0) stack.push_back({c, s});
    }
  }
}

template <class State>
void TokenConstraint<State>::mask(std::span<float> logits) const {
  std::vector<char> allowed(std::max(logits.size(), static_cast<size_t>(vocab_->n_vocab_)), 0);
  if (state_.complete())
    for (int32_t id : vocab_->end_ids_) allowed[static_cast<size_t>(id)] = 1;
  if (state_.in_plain_string())
    for (int32_t id : vocab_->content_ids_) allowed[static_cast<size_t>(id)] = 1;
  else
    walk(vocab_->content_, allowed);
  walk(vocab_->other_, allowed);
  if (std::find(allowed.begin(), allowed.end(), 1) == allowed.end())
    fail("JSON mode: no token of this vocabulary continues the reply");
  for (size_t id = 0; id < logits.size(); ++id)
    if (!allowed[id]) logits[id] = -std::numeric_limits<float>::infinity();
}

template <class State>
void TokenConstraint<State>::accept(int32_t token, std::string_view bytes) {
  if (state_.complete() && std::find(vocab_->end_ids_.begin(), vocab_->end_ids_.end(), token) != vocab_->end_ids_.end())
    return;
  State s = state_;
  for (char ch : bytes)
    if (!s.step(static_cast<uint8_t>(ch))) fail("JSON mode: token ", token, " does not continue the JSON text");
  state_ = std::move(s);
}

template class TokenConstraint<JsonRecognizer>;
template class TokenConstraint<JsonGrammarState>;

}  // namespace regolith::server
