// JSON mode: the byte recognizer against nlohmann's parser (whole documents accepted by one are
// accepted by the other; walks never reach a dead end), and the token mask against a brute-force
// mask on the tiny model's vocabulary.
#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "core/error.h"
#include "server/json_constraint.h"
#include "token_mask_check.h"

namespace regolith::server {
namespace {

// Feeds every byte; the number of bytes read before the first refusal (size: all of them).
size_t accepted_bytes(JsonRecognizer& r, std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i)
    if (!r.step(static_cast<uint8_t>(text[i]))) return i;
  return text.size();
}

bool recognizes(std::string_view text) {
  JsonRecognizer r;
  return accepted_bytes(r, text) == text.size() && r.complete();
}

// Whether every run of whitespace outside strings is nothing, one space, or a newline and up to 32
// spaces or tabs: the layouts the recognizer writes.
bool bounded_whitespace(const std::string& text) {
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (c != ' ' && c != '\n' && c != '\t' && c != '\r') continue;
    size_t j = i;
    while (j < text.size() && std::string_view(" \n\t\r").find(text[j]) != std::string_view::npos) ++j;
    const std::string run = text.substr(i, j - i);
    const bool ok = run == " " || (run[0] == '\n' && run.size() <= 33 && run.find_first_of("\n\r", 1) == std::string::npos);
    if (!ok) return false;
    i = j - 1;
  }
  return true;
}

// What the recognizer must accept: one JSON object (nlohmann: strict RFC 8259, UTF-8 checked) in
// a bounded layout and nothing after it, not even whitespace (the reply ends with the object).
// Empty when nlohmann cannot tell: a number beyond a double's range is valid JSON that it refuses
// to convert.
std::optional<bool> nlohmann_object(const std::string& text) {
  try {
    return nlohmann::json::parse(text).is_object() && text.back() == '}' && bounded_whitespace(text);
  } catch (const nlohmann::json::parse_error&) {
    return false;
  } catch (const nlohmann::json::out_of_range&) {
    return std::nullopt;
  }
}

TEST(JsonRecognizer, AcceptsObjectsAndRefusesTheRestAtTheFirstBadByte) {
  for (const char* ok : {"{}", " {\"a\": 1}", "{\"a\":[1,-2.5e+3,0,0.0,1E9,true,false,null,{}],\"b\":{\"c\":\"\"}}",
                         "{\"\\u00e9\\n\\\"\\\\\\/\\b\\f\\r\\t\":\"\\uD83D\\uDE00\"}", "{\"k\":\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"}",
                         "{\n\t\"a\" : [ ] }", "{\n                                \"a\":1}"})
    EXPECT_TRUE(recognizes(ok)) << ok;
  struct Bad {
    const char* text;
    size_t refused_at;
  };
  for (const Bad& b : std::initializer_list<Bad>{
           {"[1]", 0}, {"\"s\"", 0}, {"{} ", 2}, {"{}{}", 2}, {"{a:1}", 1}, {"{\"a\":01}", 6}, {"{\"a\":1,}", 7},
           {"{\"a\":[1,]}", 8}, {"{\"a\":tru}", 8}, {"{\"a\":-}", 6}, {"{\"a\":1.}", 7}, {"{\"a\":1e}", 7},
           {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\\uDC00\"}", 9}, {"{\"a\":\"\\uD800x\"}", 12}, {"{\"a\":\"\\uD800\\u0041\"}", 14},
           {"{\"a\":\"\x01\"}", 6}, {"{\"a\":\"\xC0\xAF\"}", 6}, {"{\"a\":\"\xE0\x80\x80\"}", 7},
           {"{\"a\":\"\xED\xA0\x80\"}", 7}, {"{\"a\":\"\xF4\x90\x80\x80\"}", 7}, {"{\"a\":\"\x80\"}", 6}, {"{\"a\":1]", 6},
           {"{\"a\" 1}", 5}, {"{\r\"a\":1}", 1}, {"{  \"a\":1}", 2}, {"{\n\n\"a\":1}", 2}, {"{\"a\":\t1}", 5},
           {"{\n                                 \"a\":1}", 34}}) {
    JsonRecognizer r;
    EXPECT_EQ(accepted_bytes(r, b.text), b.refused_at) << b.text;
    EXPECT_EQ(nlohmann_object(b.text), false) << b.text;
  }
  const std::string deep = "{\"a\":" + std::string(63, '[');
  JsonRecognizer r;
  EXPECT_EQ(accepted_bytes(r, deep + "["), deep.size());  // nesting is capped at 64
}

// Random walks over bytes: at every state some byte goes on (no dead end), and once the walk steers
// to an end the document is an object for nlohmann. Each document, and each one-byte change of it,
// is accepted by the recognizer exactly when nlohmann accepts it.
TEST(JsonRecognizer, RandomWalksEndInObjectsAndAgreeWithNlohmann) {
  const std::string alphabet = "{}[],:\"\\ \n0123456789-+.eEtrufalsenDdCcAaBbFx/\x7f\xc3\xa9\xe2\x82\xac\xed\x9f\xbf\xf0\x9f\x98\x80\xf4\x8f\xe0\xa0\x01";
  const std::string closing = std::string("\"}]0:ruealsDC\\u{") + "\x80\x90\xa0";
  std::mt19937 rng(7);
  int mismatches = 0, completed = 0, compared = 0;
  for (int walk = 0; walk < 3000; ++walk) {
    JsonRecognizer r;
    std::string doc;
    const size_t wander = rng() % 120;
    for (int guard = 0; !r.complete() && guard < 2000; ++guard) {
      bool moved = false;
      if (doc.size() < wander) {
        for (int tries = 0; tries < 64 && !moved; ++tries) {
          char c = alphabet[rng() % alphabet.size()];
          if ((c == '{' || c == '[') && rng() % 3) continue;  // keep the nesting shallow
          if ((moved = r.step(static_cast<uint8_t>(c)))) doc += c;
        }
      }
      for (size_t i = 0; i < closing.size() && !moved; ++i)
        if ((moved = r.step(static_cast<uint8_t>(closing[i])))) doc += closing[i];
      ASSERT_TRUE(moved) << "dead end after: " << doc;
    }
    ASSERT_TRUE(r.complete()) << doc;
    ++completed;
    EXPECT_NE(nlohmann_object(doc), false) << doc;
    for (int m = 0; m < 4; ++m) {
      std::string changed = doc;
      const size_t at = rng() % changed.size();
      const char c = alphabet[rng() % alphabet.size()];
      if (rng() % 2) {
        changed[at] = c;
      } else {
        changed.insert(at, 1, c);
      }
      const std::optional<bool> want = nlohmann_object(changed);
      if (!want) continue;
      compared += 1;
      mismatches += recognizes(changed) != *want;
      if (recognizes(changed) != *want)
        ADD_FAILURE() << "recognizer " << recognizes(changed) << ", nlohmann " << *want << " on "
                      << nlohmann::json(changed).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
    }
  }
  EXPECT_EQ(completed, 3000);
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(compared, 10000);  // of 12,000 changed documents
}

// The tries' mask equals a token-by-token check of the recognizer at every step of sampled
// replies, some token always remains, and a reply that ends is one JSON object.
TEST(JsonConstraint, MaskEqualsTheTokenByTokenCheckAndRepliesParse) {
  const Tokenizer& tok = tiny_json_tokenizer();
  JsonVocabulary vocab(tok);
  std::mt19937 rng(11);
  const int ended = sample_masked_replies(tok, vocab, JsonRecognizer(), 40, 300, rng, [](const std::string& text) {
    EXPECT_NE(nlohmann_object(text), false) << text;
  });
  std::printf("[json] %d of 40 sampled replies ended\n", ended);
  EXPECT_GT(ended, 0);
  JsonConstraint c(vocab, JsonRecognizer());
  const int32_t brace = tok.find_token("}");
  if (brace >= 0) {
    EXPECT_THROW(c.accept(brace, tok.token_bytes(brace)), Error);
  }
}

}  // namespace
}  // namespace regolith::server
