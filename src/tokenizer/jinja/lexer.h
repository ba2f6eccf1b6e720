// Jinja lexer with the whitespace rules transformers enables (trim_blocks, lstrip_blocks) and
// Jinja2's defaults (newlines normalised to "\n", one trailing newline dropped, `-`/`+`
// whitespace control). Template text comes out already stripped, so the parser and the
// interpreter never think about whitespace.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace regolith::jinja {

struct Token {
  enum class Kind {
    text,         // template data
    var_begin,    // {{
    var_end,      // }}
    block_begin,  // {%
    block_end,    // %}
    name,
    string,       // value already unescaped
    integer,
    floating,
    op,           // operator or punctuation: + - * / // % ** ~ == != < > <= >= = . , : | ( ) [ ] { }
    end,          // end of template
  };
  Kind kind;
  std::string value;
  int line;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws Error("chat template line N: ...") on malformed input.
std::vector<Token> tokenize_template(std::string_view source, const LexerOptions& options = {});

}  // namespace regolith::jinja
