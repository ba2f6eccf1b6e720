// Recursive-descent Jinja parser. Precedence, loosest first (as jinja2/parser.py):
// conditional (x if c else y) > or > and > not > comparison (chained, in, not in) > + - >
// ~ > * / // % > ** > unary - + > postfix (.attr [item] (call)) and filters / tests.

#include "tokenizer/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <utility>

#include "core/error.h"

namespace regolith::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  Body parse_all() {
    Body body = parse_body({});
    if (peek().kind != Token::Kind::end) error("unexpected '{% " + end_tag_ + " %}'");
    return body;
  }

 private:
  using K = Token::Kind;

  [[noreturn]] void error(const std::string& what) const { fail("chat template line ", peek().line, ": ", what); }
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (i_ < t_.size() - 1) ++i_;
    return t;
  }
  bool at_op(const char* op, size_t ahead = 0) const { return peek(ahead).kind == K::op && peek(ahead).value == op; }
  bool at_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == K::name && peek(ahead).value == name;
  }
  bool accept_op(const char* op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) error(std::string("expected '") + op + "', got '" + describe(peek()) + "'");
  }
  void expect(K kind, const char* what) {
    if (peek().kind != kind) error(std::string("expected ") + what + ", got '" + describe(peek()) + "'");
    next();
  }
  std::string expect_name() {
    if (peek().kind != K::name) error("expected a name, got '" + describe(peek()) + "'");
    return next().value;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case K::end: return "end of template";
      case K::block_end: return "%}";
      case K::var_end: return "}}";
      default: return t.value;
    }
  }
  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements until one of `ends` (a block tag name) is reached; the block_begin of that tag
  // is consumed and its name left in end_tag_.
  Body parse_body(std::initializer_list<const char*> ends) {
    Body body;
    while (true) {
      const Token& t = peek();
      if (t.kind == K::end) {
        // The last name is the closing tag ({% endfor %}); the others are optional branches.
        if (ends.size() != 0) error(std::string("unexpected end of template, expected '{% ") + *(ends.end() - 1) + " %}'");
        return body;
      }
      if (t.kind == K::text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::text;
        s->line = t.line;
        s->text = next().value;
        body.push_back(std::move(s));
      } else if (t.kind == K::var_begin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::output;
        s->line = t.line;
        s->expr = parse_expression();
        expect(K::var_end, "'}}'");
        body.push_back(std::move(s));
      } else if (t.kind == K::block_begin) {
        if (peek(1).kind == K::name)
          for (const char* end : ends)
            if (peek(1).value == end) {
              next();
              end_tag_ = next().value;
              return body;
            }
        next();
        body.push_back(parse_statement());
      } else {
        error("unexpected '" + describe(t) + "'");
      }
    }
  }

  StmtPtr parse_statement() {
    int line = peek().line;
    std::string tag = expect_name();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (tag == "if") {
      s->kind = Stmt::Kind::if_;
      s->conditions.push_back(parse_expression());
      expect(K::block_end, "'%}'");
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}));
        if (end_tag_ == "elif") {
          s->conditions.push_back(parse_expression());
          expect(K::block_end, "'%}'");
        } else if (end_tag_ == "else") {
          expect(K::block_end, "'%}'");
          s->else_body = parse_body({"endif"});
          break;
        } else {
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::for_;
      s->targets = parse_targets();
      if (!accept_name("in")) error("expected 'in' in for loop");
      s->expr = parse_expression(/*allow_condition=*/false);
      if (accept_name("if")) s->filter_expr = parse_expression(false);
      if (at_name("recursive")) error("recursive for loops are not supported");
      expect(K::block_end, "'%}'");
      ++loop_depth_;
      s->body = parse_body({"else", "endfor"});
      --loop_depth_;
      if (end_tag_ == "else") {
        expect(K::block_end, "'%}'");
        s->else_body = parse_body({"endfor"});
      }
    } else if (tag == "set") {
      if (peek().kind == K::name && at_op(".", 1)) {
        s->kind = Stmt::Kind::set;
        s->targets = {next().value};
        next();
        s->attribute = expect_name();
        expect_op("=");
        s->expr = parse_tuple_or_expression();
      } else {
        s->targets = parse_targets();
        if (accept_op("=")) {
          s->kind = Stmt::Kind::set;
          s->expr = parse_tuple_or_expression();
        } else {
          if (s->targets.size() != 1) error("a block set takes one name");
          s->kind = Stmt::Kind::set_block;
          s->filter_expr = parse_filter_chain();
          expect(K::block_end, "'%}'");
          s->body = parse_body({"endset"});
        }
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::macro;
      s->text = expect_name();
      expect_op("(");
      while (!accept_op(")")) {
        std::string param = expect_name();
        ExprPtr def = accept_op("=") ? parse_expression() : nullptr;
        s->params.emplace_back(param, std::move(def));
        if (!at_op(")")) expect_op(",");
      }
      expect(K::block_end, "'%}'");
      int outer_loops = std::exchange(loop_depth_, 0);  // a macro body is not inside the caller's loop
      s->body = parse_body({"endmacro"});
      loop_depth_ = outer_loops;
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::filter;
      s->filter_expr = parse_filter_chain(/*required=*/true);
      expect(K::block_end, "'%}'");
      s->body = parse_body({"endfilter"});
    } else if (tag == "with") {
      s->kind = Stmt::Kind::with;
      while (peek().kind == K::name) {
        std::string name = next().value;
        expect_op("=");
        s->params.emplace_back(name, parse_expression());
        if (!accept_op(",")) break;
      }
      expect(K::block_end, "'%}'");
      s->body = parse_body({"endwith"});
    } else if (tag == "generation") {
      s->kind = Stmt::Kind::generation;
      expect(K::block_end, "'%}'");
      s->body = parse_body({"endgeneration"});
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error("'" + tag + "' outside a loop");
      s->kind = tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_;
    } else if (tag == "extends" || tag == "include" || tag == "import" || tag == "from" || tag == "block" ||
               tag == "call" || tag == "do" || tag == "autoescape" || tag == "trans") {
      error("the '" + tag + "' tag is not supported in chat templates");
    } else {
      error("unknown tag '" + tag + "'");
    }
    // The `%}` of a one-tag statement, or of the end tag ({% endif %}) of a block statement.
    expect(K::block_end, "'%}'");
    return s;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = accept_op("(");
    do {
      names.push_back(expect_name());
    } while (accept_op(","));
    if (paren) expect_op(")");
    return names;
  }

  // `| f(args) | g` applied to the block placeholder; null when there is no `|`.
  ExprPtr parse_filter_chain(bool required = false) {
    if (!required && !at_op("|")) return nullptr;
    auto node = make(Expr::Kind::name, peek().line);
    node->name = kBlockValueName;
    if (required) return parse_filter(std::move(node));
    while (accept_op("|")) node = parse_filter(std::move(node));
    return node;
  }

  ExprPtr parse_tuple_or_expression() {
    int line = peek().line;
    ExprPtr first = parse_expression();
    if (!at_op(",")) return first;
    auto tuple = make(Expr::Kind::tuple, line);
    tuple->args.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == K::block_end) break;
      tuple->args.push_back(parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression(bool allow_condition = true) {
    ExprPtr e = parse_or();
    if (!allow_condition || !at_name("if")) return e;
    int line = next().line;
    auto cond = make(Expr::Kind::condition, line);
    ExprPtr test = parse_or();
    ExprPtr otherwise = accept_name("else") ? parse_expression() : nullptr;
    cond->args.push_back(std::move(test));
    cond->args.push_back(std::move(e));
    cond->args.push_back(std::move(otherwise));
    return cond;
  }

  ExprPtr parse_binary_chain(ExprPtr (Parser::*operand)(), std::initializer_list<const char*> ops, bool names) {
    ExprPtr left = (this->*operand)();
    while (true) {
      const char* matched = nullptr;
      for (const char* op : ops)
        if (names ? at_name(op) : at_op(op)) matched = op;
      if (!matched) return left;
      int line = next().line;
      auto node = make(Expr::Kind::binary, line);
      node->name = matched;
      node->args.push_back(std::move(left));
      node->args.push_back((this->*operand)());
      left = std::move(node);
    }
  }

  ExprPtr parse_or() { return parse_binary_chain(&Parser::parse_and, {"or"}, true); }
  ExprPtr parse_and() { return parse_binary_chain(&Parser::parse_not, {"and"}, true); }

  ExprPtr parse_not() {
    if (at_name("not")) {
      int line = next().line;
      auto node = make(Expr::Kind::unary, line);
      node->name = "not";
      node->args.push_back(parse_not());
      return node;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = peek().line;
    ExprPtr first = parse_math1();
    ExprPtr node;
    while (true) {
      std::string op;
      if (peek().kind == K::op && (peek().value == "==" || peek().value == "!=" || peek().value == "<" ||
                                   peek().value == ">" || peek().value == "<=" || peek().value == ">=")) {
        op = next().value;
      } else if (at_name("in")) {
        next();
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!node) {
        node = make(Expr::Kind::compare, line);
        node->args.push_back(std::move(first));
      }
      node->ops.push_back(op);
      node->args.push_back(parse_math1());
    }
    return node ? std::move(node) : std::move(first);
  }

  ExprPtr parse_math1() { return parse_binary_chain(&Parser::parse_concat, {"+", "-"}, false); }
  ExprPtr parse_concat() { return parse_binary_chain(&Parser::parse_math2, {"~"}, false); }
  ExprPtr parse_math2() { return parse_binary_chain(&Parser::parse_pow, {"*", "/", "//", "%"}, false); }
  ExprPtr parse_pow() { return parse_binary_chain(&Parser::parse_unary_filtered, {"**"}, false); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (at_op("-") || at_op("+")) {
      int line = peek().line;
      node = make(Expr::Kind::unary, line);
      node->name = next().value;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    int line = t.line;
    if (t.kind == K::name) {
      next();
      auto node = make(Expr::Kind::literal, line);
      if (t.value == "true" || t.value == "True") node->value = Value(true);
      else if (t.value == "false" || t.value == "False") node->value = Value(false);
      else if (t.value == "none" || t.value == "None") node->value = Value(nullptr);
      else {
        node->kind = Expr::Kind::name;
        node->name = t.value;
      }
      return node;
    }
    if (t.kind == K::string) {
      std::string s = next().value;
      while (peek().kind == K::string) s += next().value;  // adjacent literals concatenate
      auto node = make(Expr::Kind::literal, line);
      node->value = Value(std::move(s));
      return node;
    }
    if (t.kind == K::integer || t.kind == K::floating) {
      std::string text = next().value;
      auto node = make(Expr::Kind::literal, line);
      if (t.kind == K::integer) {
        int64_t v = 0;
        auto res = std::from_chars(text.data(), text.data() + text.size(), v);
        if (res.ec != std::errc()) error("integer literal " + text + " is out of range");
        node->value = Value(v);
      } else {
        node->value = Value(std::strtod(text.c_str(), nullptr));
      }
      return node;
    }
    if (accept_op("(")) {
      if (accept_op(")")) return make(Expr::Kind::tuple, line);
      ExprPtr first = parse_expression();
      if (accept_op(")")) return first;
      auto tuple = make(Expr::Kind::tuple, line);
      tuple->args.push_back(std::move(first));
      while (accept_op(",")) {
        if (at_op(")")) break;
        tuple->args.push_back(parse_expression());
      }
      expect_op(")");
      return tuple;
    }
    if (accept_op("[")) {
      auto list = make(Expr::Kind::list, line);
      while (!accept_op("]")) {
        list->args.push_back(parse_expression());
        if (!at_op("]")) expect_op(",");
      }
      return list;
    }
    if (accept_op("{")) {
      auto dict = make(Expr::Kind::dict, line);
      while (!accept_op("}")) {
        dict->args.push_back(parse_expression());
        expect_op(":");
        dict->args.push_back(parse_expression());
        if (!at_op("}")) expect_op(",");
      }
      return dict;
    }
    error("unexpected '" + describe(t) + "'");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      int line = peek().line;
      if (accept_op(".")) {
        auto attr = make(Expr::Kind::attribute, line);
        if (peek().kind == K::integer) {  // x.0 is x[0] in Jinja
          attr->kind = Expr::Kind::item;
          attr->args.push_back(std::move(node));
          auto index = make(Expr::Kind::literal, line);
          index->value = Value(static_cast<int64_t>(std::stoll(next().value)));
          attr->args.push_back(std::move(index));
        } else {
          attr->name = expect_name();
          attr->args.push_back(std::move(node));
        }
        node = std::move(attr);
      } else if (accept_op("[")) {
        node = parse_subscript(std::move(node), line);
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!at_op("]")) {
      if (accept_op(":")) {
        is_slice = true;
        if (++part > 2) error("too many ':' in slice");
        continue;
      }
      if (parts[part]) error("expected ':' or ']'");
      parts[part] = parse_expression();
    }
    next();
    if (!is_slice) {
      if (!parts[0]) error("empty subscript");
      auto item = make(Expr::Kind::item, line);
      item->args.push_back(std::move(target));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = make(Expr::Kind::slice, line);
    slice->args.push_back(std::move(target));
    for (auto& p : parts) slice->args.push_back(std::move(p));
    return slice;
  }

  // Arguments "(a, b, k=v)" into node->args (after what is already there) and node->kwargs.
  void parse_arguments(Expr& node) {
    expect_op("(");
    while (!accept_op(")")) {
      if (at_op("*") || at_op("**")) error("*args and **kwargs in calls are not supported");
      if (peek().kind == K::name && at_op("=", 1)) {
        std::string key = next().value;
        next();
        node.kwargs.emplace_back(key, parse_expression());
      } else {
        if (!node.kwargs.empty()) error("positional argument after keyword argument");
        node.args.push_back(parse_expression());
      }
      if (!at_op(")")) expect_op(",");
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = make(Expr::Kind::call, peek().line);
    call->args.push_back(std::move(callee));
    parse_arguments(*call);
    return call;
  }

  ExprPtr parse_filter(ExprPtr target) {
    auto f = make(Expr::Kind::filter, peek().line);
    f->name = expect_name();
    while (accept_op(".")) f->name += "." + expect_name();
    f->args.push_back(std::move(target));
    if (at_op("(")) parse_arguments(*f);
    return f;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (accept_op("|")) {
        node = parse_filter(std::move(node));
      } else if (at_name("is")) {
        int line = next().line;
        auto test = make(Expr::Kind::test, line);
        test->negated = accept_name("not");
        test->name = expect_name();
        test->args.push_back(std::move(node));
        if (at_op("(")) {
          parse_arguments(*test);
        } else if (starts_test_argument()) {
          ExprPtr arg = parse_primary();
          test->args.push_back(parse_postfix(std::move(arg)));
        }
        node = std::move(test);
      } else if (at_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // `x is divisibleby 3`: a test may take one argument without parentheses.
  bool starts_test_argument() const {
    const Token& t = peek();
    if (t.kind == K::string || t.kind == K::integer || t.kind == K::floating) return true;
    if (t.kind == K::op) return t.value == "[" || t.value == "{";
    if (t.kind == K::name)
      return t.value != "else" && t.value != "or" && t.value != "and" && t.value != "if" && t.value != "in" &&
             t.value != "not" && t.value != "is";
    return false;
  }

  const std::vector<Token>& t_;
  size_t i_ = 0;
  std::string end_tag_;
  int loop_depth_ = 0;  // enclosing for-loop bodies, for break/continue
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens) { return Parser(tokens).parse_all(); }

}  // namespace regolith::jinja
