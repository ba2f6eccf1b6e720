// Tree-walking interpreter for parsed templates. Scoping follows Jinja2: `for` bodies, macro
// calls and `with` open a scope (so `set` inside a loop does not leak out, which is why
// templates use namespace()); `if` does not.

#include <cmath>
#include <map>
#include <unordered_map>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/jinja/template.h"

namespace regolith::jinja {
namespace {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { normal, break_loop, continue_loop };

[[noreturn]] void type_error(const char* op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
}

// Python ints are unbounded; ours are 64-bit, so overflow is an error instead of a wrong value.
template <typename Op>
int64_t checked(Op op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op(x, y, &r)) fail("integer overflow");
  return r;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(items), a.is_tuple());
    }
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list() ? &a : b.is_string() || b.is_list() ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && (count->is_int() || count->is_bool())) {
      int64_t n = std::max<int64_t>(0, count->as_int());
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->as_string();
        return Value(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq->as_list().begin(), seq->as_list().end());
      return Value::list(std::move(items), seq->is_tuple());
    }
  }
  if (!a.is_number() || !b.is_number()) {
    if (op == "%" && a.is_string()) fail("printf-style string formatting ('%') is not supported");
    type_error(op.c_str(), a, b);
  }
  bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (b.as_double() == 0) fail("division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (ints) {
    int64_t x = a.as_int(), y = b.as_int();
    auto add = [](int64_t p, int64_t q, int64_t* r) { return __builtin_add_overflow(p, q, r); };
    auto sub = [](int64_t p, int64_t q, int64_t* r) { return __builtin_sub_overflow(p, q, r); };
    auto mul = [](int64_t p, int64_t q, int64_t* r) { return __builtin_mul_overflow(p, q, r); };
    if (op == "+") return Value(checked(add, x, y));
    if (op == "-") return Value(checked(sub, x, y));
    if (op == "*") return Value(checked(mul, x, y));
    if (op == "//" || op == "%") {
      if (y == 0) fail("integer division or modulo by zero");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // Python floors
      return Value(op == "//" ? q : m);
    }
    if (op == "**") {
      if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
      int64_t result = 1;
      for (int64_t i = 0; i < y; ++i) result = checked(mul, result, x);
      return Value(result);
    }
  }
  double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "//" || op == "%") {
    if (y == 0) fail("float division or modulo by zero");
    double m = std::fmod(x, y);
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value(op == "//" ? std::floor(x / y) : m);
  }
  if (op == "**") return Value(std::pow(x, y));
  fail("unknown operator '", op, "'");
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) fail("'in <string>' requires string as left operand, not ", item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return container.as_dict().find(item) != nullptr;
  if (container.is_list()) {
    for (const Value& v : container.as_list())
      if (equals(v, item)) return true;
    return false;
  }
  if (container.is_undefined()) return false;  // Undefined iterates as empty
  fail("argument of type '", container.type_name(), "' is not iterable");
}

class Interpreter {
 public:
  Value eval(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::literal: return e.value;
      case Expr::Kind::name: {
        const Value* v = scope->find(e.name);
        return v ? *v : Value(Undefined{e.name});
      }
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        std::vector<Value> items;
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return Value::list(std::move(items), e.kind == Expr::Kind::tuple);
      }
      case Expr::Kind::dict: {
        std::vector<std::pair<Value, Value>> items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i], scope), v = eval(*e.args[i + 1], scope);
          bool replaced = false;
          for (auto& kv : items)
            if (equals(kv.first, k)) kv.second = v, replaced = true;
          if (!replaced) items.emplace_back(std::move(k), std::move(v));
        }
        return Value::dict(std::move(items));
      }
      case Expr::Kind::attribute: return get_attribute(eval(*e.args[0], scope), e.name);
      case Expr::Kind::item: return get_item(eval(*e.args[0], scope), eval(*e.args[1], scope));
      case Expr::Kind::slice: {
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i], scope) : Value(nullptr); };
        return get_slice(eval(*e.args[0], scope), part(1), part(2), part(3));
      }
      case Expr::Kind::call: {
        Value callee = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope);
        if (callee.is_undefined()) undefined_error(callee);
        if (!callee.is_function()) fail("'", callee.type_name(), "' object is not callable");
        return callee.as_function().call(args);
      }
      case Expr::Kind::filter: {
        Value target = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope);
        return apply_filter(e.name, target, args);
      }
      case Expr::Kind::test: {
        Value target = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope);
        return Value(apply_test(e.name, target, args) != e.negated);
      }
      case Expr::Kind::unary: {
        Value v = eval(*e.args[0], scope);
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_undefined()) undefined_error(v);
        if (!v.is_number()) fail("bad operand type for unary ", e.name, ": '", v.type_name(), "'");
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        return v.is_float() ? Value(-v.as_double()) : arithmetic("-", Value(int64_t{0}), v);
      }
      case Expr::Kind::binary: {
        if (e.name == "and") {
          Value a = eval(*e.args[0], scope);
          return a.truthy() ? eval(*e.args[1], scope) : a;
        }
        if (e.name == "or") {
          Value a = eval(*e.args[0], scope);
          return a.truthy() ? a : eval(*e.args[1], scope);
        }
        Value a = eval(*e.args[0], scope), b = eval(*e.args[1], scope);
        if (e.name == "~") return Value(a.str() + b.str());
        return arithmetic(e.name, a, b);
      }
      case Expr::Kind::compare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==") ok = equals(left, right);
          else if (op == "!=") ok = !equals(left, right);
          else if (op == "in") ok = contains(right, left);
          else if (op == "not in") ok = !contains(right, left);
          else {
            if (left.is_undefined()) undefined_error(left);
            if (right.is_undefined()) undefined_error(right);
            int c = compare(left, right);
            ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::condition: {
        if (eval(*e.args[0], scope).truthy()) return eval(*e.args[1], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value(Undefined{"(if without else)"});
      }
    }
    fail("unknown expression");
  }

  Flow exec(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const StmtPtr& s : body) {
      Flow f;
      try {
        f = exec_one(*s, scope, out);
      } catch (const Error& e) {
        std::string what = e.what();
        if (what.rfind("chat template", 0) == 0) throw;
        fail("chat template line ", s->line, ": ", what);
      }
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

 private:
  CallArgs eval_args(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    for (size_t i = 1; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], scope));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v, scope));
    return args;
  }

  static void assign(Scope& scope, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    std::vector<Value> items = iterate(v);
    if (items.size() != targets.size())
      fail("cannot unpack ", items.size(), " values into ", targets.size(), " names");
    for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = items[i];
  }

  Value render_body(const Body& body, const ScopePtr& scope) {
    std::string text;
    exec(body, scope, text);
    return Value(std::move(text));
  }

  Value apply_block_filters(const Expr* chain, Value body, const ScopePtr& scope) {
    if (!chain) return body;
    auto inner = std::make_shared<Scope>();
    inner->parent = scope;
    inner->vars[kBlockValueName] = std::move(body);
    return eval(*chain, inner);
  }

  Flow exec_one(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::text: out += s.text; return Flow::normal;
      case Stmt::Kind::output: out += eval(*s.expr, scope).str(); return Flow::normal;
      case Stmt::Kind::if_:
        for (size_t i = 0; i < s.conditions.size(); ++i)
          if (eval(*s.conditions[i], scope).truthy()) return exec(s.bodies[i], scope, out);
        return exec(s.else_body, scope, out);
      case Stmt::Kind::for_: return exec_for(s, scope, out);
      case Stmt::Kind::set: {
        Value v = eval(*s.expr, scope);
        if (s.attribute.empty()) {
          assign(*scope, s.targets, v);
          return Flow::normal;
        }
        const Value* ns = scope->find(s.targets[0]);
        if (!ns || !ns->is_object() || !ns->as_object().assignable)
          fail("cannot assign attribute on non-namespace object '", s.targets[0], "'");
        ns->as_object().set(s.attribute, std::move(v));
        return Flow::normal;
      }
      case Stmt::Kind::set_block: {
        Value v = apply_block_filters(s.filter_expr.get(), render_body(s.body, scope), scope);
        scope->vars[s.targets[0]] = std::move(v);
        return Flow::normal;
      }
      case Stmt::Kind::macro: define_macro(s, scope); return Flow::normal;
      case Stmt::Kind::filter: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        out += apply_block_filters(s.filter_expr.get(), render_body(s.body, inner), scope).str();
        return Flow::normal;
      }
      case Stmt::Kind::with: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        for (const auto& [name, expr] : s.params) inner->vars[name] = eval(*expr, scope);
        return exec(s.body, inner, out);
      }
      case Stmt::Kind::generation: return exec(s.body, scope, out);
      case Stmt::Kind::break_: return Flow::break_loop;
      case Stmt::Kind::continue_: return Flow::continue_loop;
    }
    return Flow::normal;
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*s.expr, scope));
    if (s.filter_expr) {
      std::vector<Value> kept;
      for (Value& item : items) {
        auto probe = std::make_shared<Scope>();
        probe->parent = scope;
        assign(*probe, s.targets, item);
        if (eval(*s.filter_expr, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec(s.else_body, scope, out);
      return Flow::normal;
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      assign(*inner, s.targets, items[i]);
      auto loop = std::make_shared<ObjectData>();
      loop->type_name = "LoopContext";
      loop->attrs = {
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(n - i)},
          {"revindex0", Value(n - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"depth", Value(1)},
          {"depth0", Value(0)},
          {"previtem", i > 0 ? items[i - 1] : Value(Undefined{"loop.previtem"})},
          {"nextitem", i + 1 < n ? items[i + 1] : Value(Undefined{"loop.nextitem"})},
          {"cycle", Value::function("loop.cycle",
                                    [i](CallArgs& a) {
                                      if (a.positional.empty()) fail("no items for cycling given");
                                      return a.positional[i % a.positional.size()];
                                    })},
      };
      inner->vars["loop"] = Value(std::move(loop));
      if (exec(s.body, inner, out) == Flow::break_loop) break;
    }
    return Flow::normal;
  }

  void define_macro(const Stmt& s, const ScopePtr& scope) {
    std::weak_ptr<Scope> defined_in = scope;
    const Stmt* macro = &s;
    scope->vars[s.text] = Value::function(s.text, [this, macro, defined_in](CallArgs& args) {
      ScopePtr parent = defined_in.lock();
      if (!parent) fail("macro '", macro->text, "' called after its scope ended");
      auto inner = std::make_shared<Scope>();
      inner->parent = parent;
      if (args.positional.size() > macro->params.size())
        fail("macro '", macro->text, "' takes not more than ", macro->params.size(), " argument(s)");
      std::vector<bool> given(macro->params.size(), false);
      for (size_t i = 0; i < args.positional.size(); ++i) {
        inner->vars[macro->params[i].first] = args.positional[i];
        given[i] = true;
      }
      for (auto& [key, value] : args.keyword) {
        size_t i = 0;
        while (i < macro->params.size() && macro->params[i].first != key) ++i;
        if (i == macro->params.size()) fail("macro '", macro->text, "' takes no keyword argument '", key, "'");
        if (given[i]) fail("macro '", macro->text, "' got multiple values for argument '", key, "'");
        inner->vars[key] = value;
        given[i] = true;
      }
      for (size_t i = 0; i < macro->params.size(); ++i)
        if (!given[i])
          inner->vars[macro->params[i].first] = macro->params[i].second ? eval(*macro->params[i].second, inner)
                                                                        : Value(Undefined{macro->params[i].first});
      std::string text;
      exec(macro->body, inner, text);
      return Value(std::move(text));
    });
  }
};

}  // namespace

Template Template::parse(std::string_view source) {
  Template t;
  t.body_ = std::make_shared<const Body>(parse_template(tokenize_template(source)));
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& variables) const {
  auto globals = std::make_shared<Scope>();
  for (auto& [name, value] : builtin_globals()) globals->vars[name] = std::move(value);
  auto context = std::make_shared<Scope>();
  context->parent = globals;
  for (const auto& [name, value] : variables) context->vars[name] = value;
  Interpreter interpreter;
  std::string out;
  if (interpreter.exec(*body_, context, out) != Flow::normal) fail("chat template: break/continue outside a loop");
  return out;
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) fail("chat template context must be a JSON object");
  std::vector<std::pair<std::string, Value>> variables;
  for (const auto& [k, v] : context.items()) variables.emplace_back(k, Value::from_json(v));
  return render(variables);
}

}  // namespace regolith::jinja
