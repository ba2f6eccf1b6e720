// Python string methods (see pystring.h). Case mapping and character classes come from ICU,
// which is close to, but not always exactly, Python's own Unicode database.

#include "tokenizer/jinja/pystring.h"

#include <unicode/uchar.h>
#include <unicode/locid.h>
#include <unicode/unistr.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace regolith::jinja::py {

std::u32string to_u32(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) out += utf8::decode(s, pos);
  return out;
}

std::string from_u32(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8::append(out, c);
  return out;
}

size_t length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string strip(std::string_view s, const std::string* chars, int mode) {
  std::u32string u = to_u32(s);
  std::u32string set = chars ? to_u32(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t b = 0, e = u.size();
  if (mode != 2)
    while (b < e && strippable(u[b])) ++b;
  if (mode != 1)
    while (e > b && strippable(u[e - 1])) --e;
  return from_u32(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t at = s.find(*sep, pos);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, at - pos));
      pos = at + sep->size();
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  std::u32string u = to_u32(s);
  size_t i = 0;
  while (true) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = u.size();
      while (e > i && is_space(u[e - 1])) --e;
      out.push_back(from_u32(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    size_t start = i;
    while (i < u.size() && !is_space(u[i])) ++i;
    out.push_back(from_u32(std::u32string_view(u).substr(start, i - start)));
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit) {
      size_t at = end >= sep->size() ? s.rfind(*sep, end - sep->size()) : std::string_view::npos;
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      end = at;
    }
    out.emplace_back(s.substr(0, end));
  } else {
    std::u32string u = to_u32(s);
    size_t i = u.size();
    while (true) {
      while (i > 0 && is_space(u[i - 1])) --i;
      if (i == 0) break;
      if (static_cast<int64_t>(out.size()) == maxsplit) {
        size_t b = 0;
        while (b < i && is_space(u[b])) ++b;
        out.push_back(from_u32(std::u32string_view(u).substr(b, i - b)));
        break;
      }
      size_t end = i;
      while (i > 0 && !is_space(u[i - 1])) --i;
      out.push_back(from_u32(std::u32string_view(u).substr(i, end - i)));
    }
  }
  return {out.rbegin(), out.rend()};
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string u = to_u32(s);
  std::vector<std::string> out;
  size_t start = 0, i = 0;
  auto is_break = [](char32_t c) {
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
  };
  while (i < u.size()) {
    if (!is_break(u[i])) {
      ++i;
      continue;
    }
    size_t eol = i;
    i += (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ? 2 : 1;
    out.push_back(from_u32(std::u32string_view(u).substr(start, (keepends ? i : eol) - start)));
    start = i;
  }
  if (start < u.size()) out.push_back(from_u32(std::u32string_view(u).substr(start)));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` between characters and at both ends
    std::u32string u = to_u32(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) out += with, ++done;
      if (i < u.size()) utf8::append(out, u[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, pos);
    if (at == std::string_view::npos) break;
    out.append(s.substr(pos, at - pos));
    out.append(with);
    pos = at + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

namespace {

std::string icu_case(std::string_view s, bool to_upper) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  if (to_upper)
    u.toUpper(icu::Locale::getRoot());
  else
    u.toLower(icu::Locale::getRoot());
  std::string out;
  u.toUTF8String(out);
  return out;
}

bool is_cased(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED); }

}  // namespace

std::string upper(std::string_view s) { return icu_case(s, true); }
std::string lower(std::string_view s) { return icu_case(s, false); }

std::string title(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (char32_t c : to_u32(s)) {
    utf8::append(out, previous_cased ? u_tolower(c) : u_totitle(c));
    previous_cased = is_cased(c);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::u32string u = to_u32(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) utf8::append(out, i == 0 ? u_totitle(u[i]) : u_tolower(u[i]));
  return out;
}

bool is_class(std::string_view s, std::string_view method) {
  std::u32string u = to_u32(s);
  if (u.empty()) return false;
  if (method == "isupper" || method == "islower") {
    bool any_cased = false;
    for (char32_t c : u) {
      if (method == "isupper" ? u_islower(c) : u_isupper(c) || u_istitle(c)) return false;
      any_cased = any_cased || u_isupper(c) || u_islower(c) || u_istitle(c);
    }
    return any_cased;
  }
  for (char32_t c : u) {
    bool ok = method == "isdigit"   ? u_isdigit(c)
              : method == "isalpha" ? u_isalpha(c)
              : method == "isalnum" ? (u_isalpha(c) || u_isdigit(c))
              : method == "isspace" ? is_space(c)
                                    : false;
    if (!ok) return false;
  }
  return true;
}

}  // namespace regolith::jinja::py
