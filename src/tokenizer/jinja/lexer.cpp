// Jinja lexer (see lexer.h). Mirrors jinja2/lexer.py's rules, including the cases where a
// `{%-`/`-%}` sign, lstrip_blocks and trim_blocks interact.

#include "tokenizer/jinja/lexer.h"

#include <cctype>
#include <cstring>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace regolith::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : src_(normalize_newlines(source)), opt_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_text(src_.substr(pos_));
        break;
      }
      std::string text = src_.substr(pos_, tag - pos_);
      char kind = src_[tag + 1];
      char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t line_start = text.rfind('\n');
        line_start = line_start == std::string::npos ? 0 : line_start + 1;
        if (line_start > 0 || line_starting_) {
          bool blank = true;
          for (size_t i = line_start; i < text.size(); ++i) blank = blank && is_space(text[i]);
          if (blank) text.resize(line_start);
        }
      }
      advance_lines(pos_, tag);
      emit_text(text);
      pos_ = tag + 2 + (sign ? 1 : 0);
      if (kind == '#')
        skip_comment();
      else if (kind == '%' && try_raw())
        continue;
      else
        lex_tag(kind == '{');
    }
    tokens_.push_back({Token::Kind::end, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& what) const { fail("chat template line ", line_, ": ", what); }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  void advance_lines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }

  void emit_text(const std::string& text) {
    if (!text.empty()) tokens_.push_back({Token::Kind::text, text, line_});
  }

  // After a tag's closing marker at `after`: apply `-` (strip all whitespace) or trim_blocks
  // (drop one newline), and remember whether the next text starts a line.
  void close_tag(size_t after, char sign, bool is_block) {
    size_t p = after;
    if (sign == '-') {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (sign != '+' && is_block && opt_.trim_blocks && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    line_starting_ = p > 0 && src_[p - 1] == '\n';
    advance_lines(pos_, p);
    pos_ = p;
  }

  void skip_comment() {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) error("missing end of comment tag '#}'");
    char sign = end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    close_tag(end + 2, sign, true);
  }

  // {% raw %}...{% endraw %}: the content is text, verbatim.
  bool try_raw() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    char open_sign = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) open_sign = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    size_t content = p + 2;
    if (open_sign == '-')
      while (content < src_.size() && is_space(src_[content])) ++content;
    for (size_t t = find_tag(content); t != std::string::npos; t = find_tag(t + 1)) {
      if (src_[t + 1] != '%') continue;
      size_t q = t + 2;
      char end_sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char close_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) close_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string text = src_.substr(content, t - content);
      if (end_sign == '-')
        while (!text.empty() && is_space(text.back())) text.pop_back();
      emit_text(text);
      close_tag(q + 2, close_sign, true);
      return true;
    }
    error("missing {% endraw %}");
  }

  void lex_tag(bool is_variable) {
    tokens_.push_back({is_variable ? Token::Kind::var_begin : Token::Kind::block_begin, "", line_});
    int depth = 0;  // brackets open: a `}}` inside a dict literal does not close the tag
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) line_ += src_[pos_++] == '\n';
      if (pos_ >= src_.size()) error(is_variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (depth == 0) {
        const char* close = is_variable ? "}}" : "%}";
        char sign = src_[pos_] == '-' || src_[pos_] == '+' ? src_[pos_] : 0;
        size_t at = pos_ + (sign ? 1 : 0);
        if (src_.compare(at, 2, close) == 0 && !(is_variable && sign == '+')) {
          tokens_.push_back({is_variable ? Token::Kind::var_end : Token::Kind::block_end, "", line_});
          close_tag(at + 2, sign, !is_variable);
          return;
        }
      }
      lex_token(depth);
    }
  }

  void lex_token(int& depth) {
    char c = src_[pos_];
    if (c == '\'' || c == '"') return lex_string(c);
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number();
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t start = pos_;
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      tokens_.push_back({Token::Kind::name, src_.substr(start, pos_ - start), line_});
      return;
    }
    static const char* const two_char[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : two_char)
      if (src_.compare(pos_, 2, op) == 0) {
        tokens_.push_back({Token::Kind::op, op, line_});
        pos_ += 2;
        return;
      }
    if (std::strchr("+-*/%~<>=.,:|()[]{}", c) && c != 0) {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if (c == ')' || c == ']' || c == '}') {
        if (depth == 0) error(std::string("unexpected '") + c + "'");
        --depth;
      }
      tokens_.push_back({Token::Kind::op, std::string(1, c), line_});
      ++pos_;
      return;
    }
    error(std::string("unexpected character '") + c + "'");
  }

  // Python's "unicode-escape" decoding of the literal, which Jinja2 applies.
  void lex_string(char quote) {
    int start_line = line_;
    std::string value;
    ++pos_;
    while (true) {
      if (pos_ >= src_.size()) error("unterminated string literal");
      char c = src_[pos_++];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\') {
        value += c;
        continue;
      }
      if (pos_ >= src_.size()) error("unterminated string literal");
      char e = src_[pos_++];
      auto hex = [&](int digits) {
        if (pos_ + digits > src_.size()) error("truncated \\x/\\u escape in string literal");
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
          char h = src_[pos_++];
          if (!std::isxdigit(static_cast<unsigned char>(h))) error("bad hex digit in string escape");
          v = v * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
        }
        return v;
      };
      switch (e) {
        case '\n': ++line_; break;  // line continuation
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case 'a': value += '\a'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'n': value += '\n'; break;
        case 'r': value += '\r'; break;
        case 't': value += '\t'; break;
        case 'v': value += '\v'; break;
        case 'x': utf8::append(value, hex(2)); break;
        case 'u': utf8::append(value, hex(4)); break;
        case 'U': utf8::append(value, hex(8)); break;
        case 'N': error("\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = e - '0';
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++i)
              v = v * 8 + (src_[pos_++] - '0');
            utf8::append(value, v);
          } else {
            value += '\\';  // unknown escapes stay as written
            value += e;
          }
      }
    }
    tokens_.push_back({Token::Kind::string, value, start_line});
  }

  void lex_number() {
    size_t start = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t q = pos_ + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        pos_ = q;
        digits();
      }
    }
    std::string text;
    for (size_t i = start; i < pos_; ++i)
      if (src_[i] != '_') text += src_[i];
    tokens_.push_back({is_float ? Token::Kind::floating : Token::Kind::integer, text, line_});
  }

  std::string src_;
  LexerOptions opt_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize_template(std::string_view source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace regolith::jinja
