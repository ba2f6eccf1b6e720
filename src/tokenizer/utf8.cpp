// Strict UTF-8 decoding (see utf8.h).

#include "tokenizer/utf8.h"

namespace regolith::utf8 {
namespace {

// Expected length from the lead byte, and the valid range of the second byte (which is where
// overlongs, surrogates and values above U+10FFFF are excluded).
struct Lead {
  uint8_t length;
  uint8_t second_lo, second_hi;
};

Lead lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Number of bytes of s that are a valid (possibly unfinished) prefix of one character.
size_t valid_prefix(std::string_view s, const Lead& lead) {
  size_t n = 1;
  if (n < s.size() && n < lead.length) {
    uint8_t b = static_cast<uint8_t>(s[n]);
    if (b < lead.second_lo || b > lead.second_hi) return n;
    ++n;
  }
  while (n < s.size() && n < lead.length) {
    uint8_t b = static_cast<uint8_t>(s[n]);
    if ((b & 0xC0) != 0x80) return n;
    ++n;
  }
  return n;
}

}  // namespace

size_t sequence_length(std::string_view s) {
  if (s.empty()) return 0;
  Lead lead = lead_info(static_cast<uint8_t>(s[0]));
  if (lead.length == 0) return 0;
  if (lead.length == 1) return 1;
  return valid_prefix(s, lead) == lead.length ? lead.length : 0;
}

char32_t decode(std::string_view s, size_t& pos) {
  size_t n = sequence_length(s.substr(pos));
  if (n == 0) {
    ++pos;
    return kReplacement;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + pos);
  pos += n;
  switch (n) {
    case 1: return p[0];
    case 2: return (char32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (char32_t(p[0] & 0x0F) << 12) | (char32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (char32_t(p[0] & 0x07) << 18) | (char32_t(p[1] & 0x3F) << 12) | (char32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
  }
}

void append(std::string& out, char32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = kReplacement;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_valid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t n = sequence_length(s.substr(pos));
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

size_t complete_prefix_length(std::string_view s) {
  // Only the last (at most 3) bytes can hold an unfinished character.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    Lead lead = lead_info(static_cast<uint8_t>(s[i]));
    if (lead.length < 2) continue;
    std::string_view tail = s.substr(i);
    if (tail.size() < lead.length && valid_prefix(tail, lead) == tail.size()) return i;
  }
  return s.size();
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t n = sequence_length(s.substr(pos));
    if (n == 0) {
      append(out, kReplacement);
      Lead lead = lead_info(static_cast<uint8_t>(s[pos]));
      pos += lead.length >= 2 ? valid_prefix(s.substr(pos), lead) : 1;
    } else {
      out.append(s.substr(pos, n));
      pos += n;
    }
  }
  return out;
}

}  // namespace regolith::utf8
