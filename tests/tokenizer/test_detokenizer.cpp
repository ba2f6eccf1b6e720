// Streaming detokenization: characters split across tokens are held until complete.

#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/utf8.h"

namespace regolith::test {
namespace {

TEST(StreamingDetokenizer, HoldsSplitCharacters) {
  TinyVocab v = byte_vocab();
  v.tokens.push_back("<|end|>");
  v.types.push_back(static_cast<int32_t>(TokenType::control));
  v.tokens.push_back("<0x41>");
  v.types.push_back(static_cast<int32_t>(TokenType::byte));
  Tokenizer tok = make_tokenizer(v);
  const int32_t end = 256, byte_a = 257;
  StreamingDetokenizer d(tok);
  EXPECT_EQ(d.push('h'), "h");
  EXPECT_EQ(d.push(0xF0), "");  // 🎉 = F0 9F 8E 89, one byte per token
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x8E), "");
  EXPECT_EQ(d.pending_bytes(), 3u);
  EXPECT_EQ(d.push(0x89), "\xF0\x9F\x8E\x89");
  EXPECT_EQ(d.push(end), "<|end|>");
  EXPECT_EQ(d.push(byte_a), "A");  // byte-fallback token
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");  // the stream ended inside a character

  StreamingDetokenizer hidden(tok, /*skip_special=*/true);
  EXPECT_EQ(hidden.push(end), "");
  EXPECT_EQ(hidden.push('x'), "x");
}

TEST(StreamingDetokenizer, InvalidBytesBecomeReplacementCharacters) {
  Tokenizer tok = make_tokenizer(byte_vocab());
  StreamingDetokenizer d(tok);
  EXPECT_EQ(d.push(0x80), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push('a'), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(d.finish(), "");
}

TEST(StreamingDetokenizer, EveryPieceIsValidUtf8) {
  Tokenizer tok = make_tokenizer(byte_vocab());
  std::string text = "mixed: \xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE0\xA4\xA8";
  StreamingDetokenizer d(tok);
  std::string out;
  for (int32_t id : tok.encode(text)) {
    std::string piece = d.push(id);
    EXPECT_TRUE(utf8::is_valid(piece));
    out += piece;
  }
  out += d.finish();
  EXPECT_EQ(out, text);
}

}  // namespace
}  // namespace regolith::test
