#include "convert/synthetic_vocab.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"

namespace regolith {
namespace {

// llama.cpp's token types (llama.h, enum llama_token_type).
constexpr int32_t kNormal = 1, kControl = 3, kUnused = 5;

// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes map to
// themselves, the rest to U+0100 upwards in byte order.
std::string byte_token(int b) {
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  int cp = b;
  if (!printable) {
    int shift = 0;
    for (int c = 0; c < b; ++c)
      if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) ++shift;
    cp = 256 + shift;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

void write_synthetic_vocab(GgufWriter& w, const SyntheticVocabOptions& o) {
  // The specials sit at eos_id, eos_id + 1, eos_id + 2 (those that fit); every other id takes
  // the next byte token, then merged pairs, then unused padding.
  const char* specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  int64_t n_special = std::min<int64_t>(3, o.n_vocab - o.eos_id);
  // A tiny vocabulary may lack room for all 256 bytes: drop first the 13 bytes that never
  // occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF), highest first.
  int64_t room = o.n_vocab - n_special;
  int64_t n_dropped = std::max<int64_t>(0, 256 - room);
  if (o.eos_id < 0 || n_special < 1 || n_dropped > 13)
    fail("synthetic vocabulary: ", o.n_vocab, " tokens with EOS at ", o.eos_id,
         " leaves no room for the byte tokens");
  std::vector<int> never_utf8 = {0xFF, 0xFE, 0xFD, 0xFC, 0xFB, 0xFA, 0xF9, 0xF8, 0xF7, 0xF6, 0xF5, 0xC1, 0xC0};
  never_utf8.resize(static_cast<size_t>(n_dropped));
  std::vector<std::string> plain;
  for (int b = 0; b < 256; ++b)
    if (std::find(never_utf8.begin(), never_utf8.end(), b) == never_utf8.end()) plain.push_back(byte_token(b));
  const std::string space = byte_token(' ');
  std::vector<std::pair<std::string, std::string>> pairs;  // a space before each letter, then letter pairs
  for (char c = 'a'; c <= 'z'; ++c) pairs.push_back({space, std::string(1, c)});
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) pairs.push_back({std::string(1, a), std::string(1, b)});
  std::vector<std::string> merges;
  for (const auto& [a, b] : pairs) {
    if (static_cast<int64_t>(plain.size()) >= o.n_vocab - n_special) break;
    plain.push_back(a + b);
    merges.push_back(a + " " + b);
  }
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  size_t next_plain = 0;
  for (int64_t id = 0; id < o.n_vocab; ++id) {
    if (id >= o.eos_id && id < o.eos_id + n_special) {
      tokens.push_back(specials[id - o.eos_id]);
      types.push_back(kControl);
    } else if (next_plain < plain.size()) {
      tokens.push_back(plain[next_plain++]);
      types.push_back(kNormal);
    } else {
      tokens.push_back(cat("[PAD", id, "]"));
      types.push_back(kUnused);
    }
  }
  w.set("tokenizer.ggml.model", std::string("gpt2"));
  w.set("tokenizer.ggml.pre", std::string("qwen35"));
  w.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, tokens));
  w.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, types));
  w.set("tokenizer.ggml.merges", GgufValue::array(GgufType::STRING, merges));
  w.set("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(o.eos_id));
  w.set("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(o.eos_id));
  w.set("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(o.eos_id));
  w.set("tokenizer.ggml.add_bos_token", false);
}

}  // namespace regolith
