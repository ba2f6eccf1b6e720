// Jinja parser: tokens -> statement tree, with Jinja2's operator precedence. Tags that chat
// templates do not need (extends, include, import, block, call, ...) are rejected with an
// error naming the tag and line rather than misrendered.
#pragma once

#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace regolith::jinja {

Body parse_template(const std::vector<Token>& tokens);

}  // namespace regolith::jinja
