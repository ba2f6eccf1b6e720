// Pre-tokenizer splits on hand-picked inputs; the Qwen3 corpus test covers them at scale.

#include <gtest/gtest.h>

#include "tokenizer/pretokenizer.h"

namespace regolith {
namespace {

std::vector<std::string> pieces(PreType type, std::string_view text) {
  std::vector<std::string> out;
  PreTokenizer(type).split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, Qwen2Basics) {
  EXPECT_EQ(pieces(PreType::qwen2, "Hello world!"), (V{"Hello", " world", "!"}));
  EXPECT_EQ(pieces(PreType::qwen2, "It's HE'S"), (V{"It", "'s", " HE", "'S"}));
  EXPECT_EQ(pieces(PreType::qwen2, "12345"), (V{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(pieces(PreType::qwen2, "a  \n\n  b"), (V{"a", "  \n\n", " ", " b"}));
  EXPECT_EQ(pieces(PreType::qwen2, "x   "), (V{"x", "   "}));
  EXPECT_EQ(pieces(PreType::qwen2, "foo()\n"), (V{"foo", "()\n"}));
}

TEST(PreTokenizer, WhitespaceIsTheUnicodeWhiteSpaceProperty) {
  // U+0085 is White_Space; U+180E is not (PCRE2's own \s would take it).
  EXPECT_EQ(pieces(PreType::qwen2, "a\xC2\x85" "b"), (V{"a", "\xC2\x85" "b"}));
  EXPECT_EQ(pieces(PreType::qwen2, "a \xE1\xA0\x8E"), (V{"a", " \xE1\xA0\x8E"}));
}

TEST(PreTokenizer, Qwen35JoinsMarksToLetters) {
  // Devanagari "नमस्ते": the vowel signs and virama are \p{M}.
  std::string word = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";
  EXPECT_EQ(pieces(PreType::qwen35, word), (V{word}));
  EXPECT_GT(pieces(PreType::qwen2, word).size(), 1u);
}

TEST(PreTokenizer, InvalidUtf8BecomesItsOwnPiece) {
  EXPECT_EQ(pieces(PreType::qwen2, "ab\xFF" "cd"), (V{"ab", "\xFF", "cd"}));
}

TEST(PreTokenizer, KnownRegexesAreFoundByName) {
  ASSERT_NE(find_pre_type_by_name("qwen35"), nullptr);
  EXPECT_EQ(find_pre_type_by_name("llama3"), nullptr);
  EXPECT_EQ(find_pre_type_by_hf_regex(pre_type_info(PreType::qwen2).hf_regex)->type, PreType::qwen2);
}

}  // namespace
}  // namespace regolith
