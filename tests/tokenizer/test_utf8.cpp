#include <gtest/gtest.h>

#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"
#include "tokenizer/utf8.h"

namespace regolith {
namespace {

TEST(Utf8, SequenceLengthRejectsOverlongsSurrogatesAndTruncation) {
  EXPECT_EQ(utf8::sequence_length("a"), 1u);
  EXPECT_EQ(utf8::sequence_length("\xC3\xA9"), 2u);
  EXPECT_EQ(utf8::sequence_length("\xE4\xBD\xA0"), 3u);
  EXPECT_EQ(utf8::sequence_length("\xF0\x9F\x8E\x89"), 4u);
  EXPECT_EQ(utf8::sequence_length("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(utf8::sequence_length("\xE0\x80\xAF"), 0u);      // overlong
  EXPECT_EQ(utf8::sequence_length("\xED\xA0\x80"), 0u);      // surrogate U+D800
  EXPECT_EQ(utf8::sequence_length("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8::sequence_length("\xE4\xBD"), 0u);          // truncated
  EXPECT_EQ(utf8::sequence_length("\x80"), 0u);
}

TEST(Utf8, CompletePrefixHoldsBackOnlyUnfinishedCharacters) {
  EXPECT_EQ(utf8::complete_prefix_length("ab\xE4\xBD"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xE4\xBD\xA0"), 5u);
  EXPECT_EQ(utf8::complete_prefix_length("\xF0\x9F\x8E"), 0u);
  EXPECT_EQ(utf8::complete_prefix_length("a\x80"), 2u);      // invalid: nothing to wait for
  EXPECT_EQ(utf8::complete_prefix_length("a\xE4" "b"), 3u);  // broken, not unfinished
  EXPECT_EQ(utf8::complete_prefix_length(""), 0u);
}

TEST(Utf8, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(utf8::sanitize("a\xE4\xBD" "b"), "a\xEF\xBF\xBD" "b");  // one U+FFFD for E4 BD
  EXPECT_EQ(utf8::sanitize("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8::sanitize("ok \xF0\x9F\x8E\x89"), "ok \xF0\x9F\x8E\x89");
}

TEST(ByteLevel, AlphabetRoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::string text = byte_level::encode(all);
  EXPECT_EQ(byte_level::decode(text).value(), all);
  EXPECT_EQ(byte_level::byte_to_text(' '), "\xC4\xA0");  // 'Ġ'
  EXPECT_EQ(byte_level::byte_to_text('\n'), "\xC4\x8A");  // 'Ċ'
  EXPECT_EQ(byte_level::byte_to_text('A'), "A");
  EXPECT_FALSE(byte_level::decode("\xE4\xBD\xA0").has_value());  // '你' is not in the alphabet
}

TEST(Nfc, ComposesAndKeepsInvalidBytes) {
  EXPECT_EQ(nfc_normalize("e\xCC\x81"), "\xC3\xA9");             // e + U+0301 -> é
  EXPECT_EQ(nfc_normalize("\xE2\x84\xAB"), "\xC3\x85");          // Angstrom sign -> Å
  EXPECT_EQ(nfc_normalize("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");  // jamo -> 가
  EXPECT_EQ(nfc_normalize("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc_normalize("e\xCC\x81\xFF" "e\xCC\x81"), "\xC3\xA9\xFF\xC3\xA9");
}

}  // namespace
}  // namespace regolith
