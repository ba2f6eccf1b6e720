// The byte <-> code point table of GPT-2's bytes_to_unicode(): printable Latin-1 bytes
// ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes, in increasing order,
// take the code points 256, 257, ...

#include "tokenizer/byte_level.h"

#include "tokenizer/utf8.h"

namespace regolith::byte_level {
namespace {

bool stands_for_itself(unsigned b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<char32_t, 256> code_point{};
  std::array<std::string, 256> text;
  std::array<int16_t, 324> byte_of{};  // code point -> byte, -1 when not in the alphabet

  Tables() {
    byte_of.fill(-1);
    char32_t next = 256;
    for (unsigned b = 0; b < 256; ++b) {
      code_point[b] = stands_for_itself(b) ? char32_t(b) : next++;
      utf8::append(text[b], code_point[b]);
      byte_of[code_point[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_code_point(uint8_t b) { return tables().code_point[b]; }

const std::string& byte_to_text(uint8_t b) { return tables().text[b]; }

std::optional<std::string> decode(std::string_view text) {
  const Tables& t = tables();
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    size_t start = pos;
    char32_t cp = utf8::decode(text, pos);
    if (cp == utf8::kReplacement && pos == start + 1) return std::nullopt;
    if (cp >= t.byte_of.size() || t.byte_of[cp] < 0) return std::nullopt;
    out += static_cast<char>(t.byte_of[cp]);
  }
  return out;
}

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += byte_to_text(static_cast<uint8_t>(c));
  return out;
}

}  // namespace regolith::byte_level
