// The syntax tree of a parsed template: expressions and statements, each with its source line
// for error messages.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace regolith::jinja {

// The variable through which a rendered block body ({% set x | f %}, {% filter f %}) reaches
// its filter chain; no template can name it.
inline constexpr const char* kBlockValueName = "\x01block";

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,    // value
    name,       // name
    list,       // args
    tuple,      // args
    dict,       // args: key, value, key, value, ...
    attribute,  // args[0].name
    item,       // args[0][args[1]]
    slice,      // args[0][args[1]:args[2]:args[3]] (null parts absent)
    call,       // args[0](args[1..], kwargs)
    filter,     // args[0] | name(args[1..], kwargs)
    test,       // args[0] is [not] name(args[1..], kwargs)
    unary,      // name ("-", "+", "not") args[0]
    binary,     // args[0] name args[1]: + - * / // % ** ~ and or
    compare,    // args[0] ops[0] args[1] ops[1] args[2] ... (chained)
    condition,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    text,        // text
    output,      // {{ expr }}
    if_,         // conditions[i] -> bodies[i]; else_body
    for_,        // for targets in expr [if filter]: body; else_body
    set,         // targets = expr (or target.attribute = expr when attribute is set)
    set_block,   // {% set targets[0] %}body{% endset %}, then filter (a chain on a placeholder)
    macro,       // name(params) body
    filter,      // {% filter f %}body{% endfilter %}
    with,        // {% with a = x, b = y %}body
    break_,
    continue_,
    generation,  // transformers' {% generation %}: body rendered as is
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter_expr;
  std::vector<std::string> targets;
  std::string attribute;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters / with assignments
};

}  // namespace regolith::jinja
