// BPE merge order and tokenizer loading on tiny hand-made vocabularies.

#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "test_support.h"
#include "tokenizer/byte_level.h"

namespace regolith::test {
namespace {

int32_t add_token(TinyVocab& v, const std::string& text, TokenType type = TokenType::normal) {
  v.tokens.push_back(text);
  v.types.push_back(static_cast<int32_t>(type));
  return static_cast<int32_t>(v.tokens.size() - 1);
}

TEST(Bpe, LowestRankMergesFirstThenLeftmost) {
  TinyVocab v = byte_vocab();
  int32_t ab = add_token(v, "ab"), bc = add_token(v, "bc"), abc = add_token(v, "abc");
  v.merges = {"b c", "a b", "ab c"};
  Tokenizer tok = make_tokenizer(v);
  // "abc": (b,c) ranks before (a,b), so a + bc; "abc" is never reached.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{'a', bc}));
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{ab}));
  (void)abc;
}

TEST(Bpe, RepeatedPairsMergeLeftToRight) {
  TinyVocab v = byte_vocab();
  int32_t aa = add_token(v, "aa");
  v.merges = {"a a"};
  Tokenizer tok = make_tokenizer(v);
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{aa, 'a'}));
  EXPECT_EQ(tok.encode("aaaa"), (std::vector<int32_t>{aa, aa}));
}

TEST(Bpe, LongPiecesTakeTheHeapPathWithTheSameResult) {
  TinyVocab v = byte_vocab();
  int32_t aa = add_token(v, "aa"), aaaa = add_token(v, "aaaa");
  v.merges = {"a a", "aa aa"};
  Tokenizer tok = make_tokenizer(v);
  for (size_t n : {5u, 47u, 48u, 49u, 101u, 1000u}) {
    std::vector<int32_t> expected(n / 4, aaaa);
    if (n % 4 >= 2) expected.push_back(aa);
    if (n % 2) expected.push_back('a');
    EXPECT_EQ(tok.encode(std::string(n, 'a')), expected) << n;
  }
}

TEST(Bpe, AddedTokensSplitLeftmostLongest) {
  TinyVocab v = byte_vocab();
  int32_t s = add_token(v, "<s>", TokenType::control);
  int32_t ss = add_token(v, "<s>>", TokenType::control);
  int32_t think = add_token(v, "<t>", TokenType::user_defined);
  Tokenizer tok = make_tokenizer(v);
  EXPECT_EQ(tok.encode("<s>><s><t>"), (std::vector<int32_t>{ss, s, think}));
  EXPECT_EQ(tok.encode("<s>", {.parse_special = false}), (std::vector<int32_t>{'<', 's', '>'}));
  EXPECT_EQ(tok.encode("x<t>", {.parse_special = false}), (std::vector<int32_t>{'x', think}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{s, 'a', think}, true), "a<t>");
}

TEST(Bpe, ByteLevelTokensDecodeToBytes) {
  TinyVocab v = byte_vocab();
  int32_t the = add_token(v, byte_level::encode(" the"));
  v.merges = {byte_level::encode(" ") + " t", "h e", byte_level::encode(" t") + " he"};
  add_token(v, byte_level::encode(" t"));
  add_token(v, "he");
  Tokenizer tok = make_tokenizer(v);
  EXPECT_EQ(tok.encode(" the"), (std::vector<int32_t>{the}));
  EXPECT_EQ(tok.decode(std::vector<int32_t>{the, '\n'}), " the\n");
}

TEST(Bpe, BadMetadataGivesClearErrors) {
  TinyVocab v = byte_vocab();
  v.merges = {"a zz"};
  EXPECT_THROW(
      {
        try {
          make_tokenizer(v);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("merge 0 'a zz'"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  TinyVocab w = byte_vocab();
  w.pre = "llama3";
  EXPECT_THROW(make_tokenizer(w), Error);
  TinyVocab x = byte_vocab();
  x.tokens.erase(x.tokens.begin() + 'q');
  x.types.pop_back();
  EXPECT_THROW(make_tokenizer(x), Error);
}

}  // namespace
}  // namespace regolith::test

namespace regolith::test {
namespace {

TEST(Bpe, ArbitraryBytesRoundTrip) {
  // ASCII and stray high bytes (invalid UTF-8): nothing is lost or reordered.
  TinyVocab v = byte_vocab();
  v.tokens.push_back("ab");
  v.types.push_back(static_cast<int32_t>(TokenType::normal));
  v.merges = {"a b"};
  Tokenizer tok = make_tokenizer(v);
  std::mt19937 rng(3);
  for (int i = 0; i < 500; ++i) {
    std::string text;
    int n = rng() % 64;
    for (int k = 0; k < n; ++k) {
      unsigned r = rng() % 10;
      text += r < 6 ? "ab \n"[rng() % 4] : static_cast<char>(r < 8 ? 0x80 + rng() % 0x40 : 0xF8 + rng() % 8);
    }
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  }
}

}  // namespace
}  // namespace regolith::test
