// Jinja2's built-in filters and tests, plus transformers' `tojson`. Semantics follow
// jinja2/filters.py and jinja2/tests.py (3.1); comments mark where Jinja2 does something
// surprising that templates may rely on.

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/args.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/pystring.h"

namespace regolith::jinja {
namespace {

int64_t length_of(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(py::length(v.as_string()));
  if (v.is_list()) return static_cast<int64_t>(v.as_list().size());
  if (v.is_dict()) return static_cast<int64_t>(v.as_dict().items.size());
  if (v.is_undefined()) return 0;
  if (v.is_object()) return static_cast<int64_t>(v.as_object().attrs.size());
  fail("object of type '", v.type_name(), "' has no len()");
}

// Attribute paths like "a.b" or "0", as Jinja2's make_attrgetter resolves them.
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = get_item(cur, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value case_folded(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(py::lower(v.as_string())) : v;
}

Value html_escape(const Value& v) {
  std::string out;
  for (char c : v.str()) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(std::move(out));
}

// select / reject / selectattr / rejectattr share this: the test named by the first remaining
// argument (truthiness when there is none) applied to each item or its attribute.
Value select_items(const Value& seq, CallArgs& args, bool by_attribute, bool keep_when) {
  std::vector<Value> rest = args.positional;
  if (!args.keyword.empty()) fail("select filters take no keyword arguments");
  std::string attribute;
  if (by_attribute) {
    if (rest.empty()) fail("selectattr/rejectattr need an attribute name");
    attribute = rest[0].str();
    rest.erase(rest.begin());
  }
  std::string test = rest.empty() ? "" : rest[0].str();
  CallArgs test_args;
  if (!rest.empty()) test_args.positional.assign(rest.begin() + 1, rest.end());
  std::vector<Value> out;
  for (const Value& item : iterate(seq)) {
    Value probe = by_attribute ? attribute_path(item, attribute) : item;
    CallArgs a = test_args;
    bool pass = test.empty() ? probe.truthy() : apply_test(test, probe, a);
    if (pass == keep_when) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value sorted_items(std::vector<Value> items, bool reverse, bool case_sensitive, const std::string& attribute) {
  auto key = [&](const Value& v) { return case_folded(attribute.empty() ? v : attribute_path(v, attribute), case_sensitive); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    int c = compare(key(a), key(b));
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value to_int(const Value& v, const Value& fallback, int64_t base) {
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return Value(static_cast<int64_t>(std::trunc(v.as_double())));
  if (v.is_string()) {
    std::string s = py::strip(v.as_string(), nullptr, 0);
    std::string digits;
    for (char c : s)
      if (c != '_') digits += c;
    try {
      size_t used = 0;
      int64_t r = std::stoll(digits, &used, static_cast<int>(base));
      if (used == digits.size()) return Value(r);
    } catch (const std::exception&) {
    }
    try {  // Jinja2 falls back to int(float(value))
      size_t used = 0;
      double d = std::stod(s, &used);
      if (used == s.size() && std::isfinite(d)) return Value(static_cast<int64_t>(std::trunc(d)));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value tojson(const Value& v, CallArgs& args) {
  // transformers: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
  // sort_keys=sort_keys), with ensure_ascii defaulting to False.
  auto a = bind_args("tojson", args, {{"ensure_ascii", Value(false)}, {"indent", Value(nullptr)},
                                      {"separators", Value(nullptr)}, {"sort_keys", Value(false)}});
  JsonOptions o;
  o.ensure_ascii = a[0].truthy();
  if (a[1].is_int()) o.indent = std::string(std::max<int64_t>(0, a[1].as_int()), ' ');
  else if (a[1].is_string()) o.indent = a[1].as_string();
  else if (!a[1].is_none()) fail("tojson indent must be an int, a string or None");
  if (o.indent) o.item_separator = ",";
  if (a[2].is_list()) {
    if (a[2].as_list().size() != 2) fail("tojson separators must be a pair");
    o.item_separator = a[2].as_list()[0].str();
    o.key_separator = a[2].as_list()[1].str();
  }
  o.sort_keys = a[3].truthy();
  return Value(to_json(v, o));
}

Value indent_filter(const Value& v, CallArgs& args) {
  auto a = bind_args("indent", args, {{"width", Value(int64_t{4})}, {"first", Value(false)}, {"blank", Value(false)}});
  std::string pad = a[0].is_string() ? a[0].as_string() : std::string(std::max<int64_t>(0, a[0].as_int()), ' ');
  std::string s = v.str() + "\n";  // Jinja2 appends a newline so splitlines keeps a trailing empty line
  std::vector<std::string> lines = py::splitlines(s, false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    bool indent = i == 0 ? a[1].truthy() : (a[2].truthy() || !lines[i].empty());
    if (indent) out += pad;
    out += lines[i];
  }
  return Value(std::move(out));
}

}  // namespace

Value apply_filter(const std::string& name, const Value& v, CallArgs& args) {
  if (name == "tojson") return tojson(v, args);
  if (name == "safe" || (name == "list" && v.is_list())) return bind_args(name, args, {}), v;
  if (name == "string") return bind_args(name, args, {}), Value(v.str());
  if (name == "length" || name == "count") return bind_args(name, args, {}), Value(length_of(v));
  if (name == "trim") {
    auto a = bind_args(name, args, {{"chars", Value(nullptr)}});
    std::string chars = a[0].is_none() ? "" : a[0].str();
    return Value(py::strip(v.str(), a[0].is_none() ? nullptr : &chars, 0));
  }
  if (name == "upper") return bind_args(name, args, {}), Value(py::upper(v.str()));
  if (name == "lower") return bind_args(name, args, {}), Value(py::lower(v.str()));
  if (name == "capitalize") return bind_args(name, args, {}), Value(py::capitalize(v.str()));
  if (name == "title") {
    // Jinja2 title-cases after runs of "-", whitespace, "(", "{", "[", "<" only.
    bind_args(name, args, {});
    std::u32string u = py::to_u32(v.str());
    std::string out;
    bool word_start = true;
    for (char32_t c : u) {
      bool sep = c == '-' || py::is_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
      std::string ch = py::from_u32(std::u32string(1, c));
      out += sep ? ch : word_start ? py::upper(ch) : py::lower(ch);
      word_start = sep;
    }
    return Value(std::move(out));
  }
  if (name == "default" || name == "d") {
    auto a = bind_args(name, args, {{"default_value", Value("")}, {"boolean", Value(false)}});
    return v.is_undefined() || (a[1].truthy() && !v.truthy()) ? a[0] : v;
  }
  if (name == "join") {
    auto a = bind_args(name, args, {{"d", Value("")}, {"attribute", Value(nullptr)}});
    std::string out, sep = a[0].str();
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += sep;
      out += (a[1].is_none() ? item : attribute_path(item, a[1].str())).str();
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "first" || name == "last") {
    bind_args(name, args, {});
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value(Undefined{"No " + name + " item, sequence was empty."});
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return bind_args(name, args, {}), Value::list(iterate(v));
  if (name == "items") {
    bind_args(name, args, {});
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict()) fail("items filter needs a mapping, got ", v.type_name());
    std::vector<Value> out;
    for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::list({k, x}, true));
    return Value::list(std::move(out));
  }
  if (name == "dictsort") {
    auto a = bind_args(name, args, {{"case_sensitive", Value(false)}, {"by", Value("key")}, {"reverse", Value(false)}});
    if (!v.is_dict()) fail("dictsort needs a mapping, got ", v.type_name());
    size_t pos = a[1].str() == "value" ? 1 : 0;
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.as_dict().items) pairs.push_back(Value::list({k, x}, true));
    bool cs = a[0].truthy(), rev = a[2].truthy();
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
      int c = compare(case_folded(p.as_list()[pos], cs), case_folded(q.as_list()[pos], cs));
      return rev ? c > 0 : c < 0;
    });
    return Value::list(std::move(pairs));
  }
  if (name == "sort") {
    auto a = bind_args(name, args, {{"reverse", Value(false)}, {"case_sensitive", Value(false)}, {"attribute", Value(nullptr)}});
    return sorted_items(iterate(v), a[0].truthy(), a[1].truthy(), a[2].is_none() ? "" : a[2].str());
  }
  if (name == "unique") {
    auto a = bind_args(name, args, {{"case_sensitive", Value(false)}, {"attribute", Value(nullptr)}});
    std::vector<Value> out, seen;
    for (const Value& item : iterate(v)) {
      Value key = case_folded(a[1].is_none() ? item : attribute_path(item, a[1].str()), a[0].truthy());
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "reverse") {
    bind_args(name, args, {});
    if (v.is_string()) {
      std::u32string u = py::to_u32(v.as_string());
      return Value(py::from_u32(std::u32string(u.rbegin(), u.rend())));
    }
    std::vector<Value> items = iterate(v);
    return Value::list(std::vector<Value>(items.rbegin(), items.rend()));
  }
  if (name == "map") {
    std::vector<Value> out;
    std::string attribute;
    Value fallback = Value(Undefined{});
    bool has_default = false;
    for (auto& [k, x] : args.keyword) {
      if (k == "attribute") attribute = x.str();
      else if (k == "default") fallback = x, has_default = true;
      else fail("map() got an unexpected keyword argument '", k, "'");
    }
    if (!attribute.empty()) {
      for (const Value& item : iterate(v)) {
        Value r = attribute_path(item, attribute);
        out.push_back(r.is_undefined() && has_default ? fallback : r);
      }
      return Value::list(std::move(out));
    }
    if (args.positional.empty()) fail("map() needs a filter name or attribute=");
    std::string filter = args.positional[0].str();
    for (const Value& item : iterate(v)) {
      CallArgs inner;
      inner.positional.assign(args.positional.begin() + 1, args.positional.end());
      out.push_back(apply_filter(filter, item, inner));
    }
    return Value::list(std::move(out));
  }
  if (name == "select") return select_items(v, args, false, true);
  if (name == "reject") return select_items(v, args, false, false);
  if (name == "selectattr") return select_items(v, args, true, true);
  if (name == "rejectattr") return select_items(v, args, true, false);
  if (name == "replace") {
    auto a = bind_args(name, args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value(nullptr)}});
    return Value(py::replace(v.str(), a[0].str(), a[1].str(), a[2].is_none() ? -1 : a[2].as_int()));
  }
  if (name == "int") {
    auto a = bind_args(name, args, {{"default", Value(int64_t{0})}, {"base", Value(int64_t{10})}});
    return to_int(v, a[0], a[1].as_int());
  }
  if (name == "float") {
    auto a = bind_args(name, args, {{"default", Value(0.0)}});
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      try {
        std::string s = py::strip(v.as_string(), nullptr, 0);
        size_t used = 0;
        double d = std::stod(s, &used);
        if (used == s.size()) return Value(d);
      } catch (const std::exception&) {
      }
    }
    return a[0];
  }
  if (name == "abs") {
    bind_args(name, args, {});
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    fail("bad operand type for abs(): '", v.type_name(), "'");
  }
  if (name == "round") {
    auto a = bind_args(name, args, {{"precision", Value(int64_t{0})}, {"method", Value("common")}});
    double scale = std::pow(10.0, static_cast<double>(a[0].as_int())), x = v.as_double() * scale;
    std::string method = a[1].str();
    // Python's round() takes halves to even; the default rounding mode does the same.
    double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
    if (method != "common" && method != "ceil" && method != "floor") fail("round method must be common, ceil or floor");
    return Value(r / scale);
  }
  if (name == "sum") {
    auto a = bind_args(name, args, {{"attribute", Value(nullptr)}, {"start", Value(int64_t{0})}});
    Value total = a[1];
    for (const Value& item : iterate(v)) {
      Value x = a[0].is_none() ? item : attribute_path(item, a[0].str());
      if (!x.is_number() || !total.is_number()) fail("sum() supports numbers only");
      total = total.is_float() || x.is_float() ? Value(total.as_double() + x.as_double()) : Value(total.as_int() + x.as_int());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    auto a = bind_args(name, args, {{"case_sensitive", Value(false)}, {"attribute", Value(nullptr)}});
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value(Undefined{"No aggregated item, sequence was empty."});
    std::string attr = a[1].is_none() ? "" : a[1].str();
    auto key = [&](const Value& x) { return case_folded(attr.empty() ? x : attribute_path(x, attr), a[0].truthy()); };
    Value best = items[0];
    for (const Value& x : items) {
      int c = compare(key(x), key(best));
      if (name == "min" ? c < 0 : c > 0) best = x;
    }
    return best;
  }
  if (name == "indent") return indent_filter(v, args);
  if (name == "escape" || name == "e" || name == "forceescape") return bind_args(name, args, {}), html_escape(v);
  if (name == "center") {
    auto a = bind_args(name, args, {{"width", Value(int64_t{80})}});
    std::string s = v.str();
    int64_t len = static_cast<int64_t>(py::length(s)), width = a[0].as_int();
    if (width <= len) return Value(s);
    int64_t total = width - len, left = total / 2 + (total & width & 1);  // CPython's str.center
    return Value(std::string(left, ' ') + s + std::string(total - left, ' '));
  }
  if (name == "wordcount") {
    bind_args(name, args, {});
    return Value(static_cast<int64_t>(py::split(v.str(), nullptr, -1).size()));
  }
  if (name == "attr") {
    auto a = bind_args(name, args, {{"name", std::nullopt}});
    return get_attribute(v, a[0].str());
  }
  fail("filter '", name, "' is not supported");
}

bool apply_test(const std::string& name, const Value& v, CallArgs& args) {
  auto one = [&](const char* param) { return bind_args(name, args, {{param, std::nullopt}})[0]; };
  auto none = [&] { bind_args(name, args, {}); };
  if (name == "defined") return none(), !v.is_undefined();
  if (name == "undefined") return none(), v.is_undefined();
  if (name == "none") return none(), v.is_none();
  if (name == "boolean") return none(), v.is_bool();
  if (name == "true") return none(), v.is_bool() && v.as_bool();
  if (name == "false") return none(), v.is_bool() && !v.as_bool();
  if (name == "integer") return none(), v.is_int();
  if (name == "float") return none(), v.is_float();
  if (name == "number") return none(), v.is_number();
  if (name == "string") return none(), v.is_string();
  if (name == "mapping") return none(), v.is_dict();
  // Jinja2's Undefined is iterable (empty) and has __len__ and __getitem__.
  if (name == "iterable") return none(), v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return none(), v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return none(), v.is_function();
  if (name == "escaped") return none(), false;
  if (name == "odd" || name == "even") {
    none();
    if (!v.is_int() && !v.is_bool()) fail("'", name, "' test needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    Value n = one("num");
    if (n.as_int() == 0) fail("integer division or modulo by zero");
    return v.as_int() % n.as_int() == 0;
  }
  if (name == "lower") return none(), v.is_string() && py::lower(v.as_string()) == v.as_string();
  if (name == "upper") return none(), v.is_string() && py::upper(v.as_string()) == v.as_string();
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, one("other"));
  if (name == "ne" || name == "!=") return !equals(v, one("other"));
  if (name == "sameas") {
    Value o = one("other");
    if (v.is_none() || v.is_bool() || v.is_undefined()) return equals(v, o) && v.kind() == o.kind();
    return (v.is_dict() && o.is_dict() && &v.as_dict() == &o.as_dict()) ||
           (v.is_list() && o.is_list() && &v.as_list() == &o.as_list()) ||
           (v.is_object() && o.is_object() && &v.as_object() == &o.as_object());
  }
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, one("other")) < 0;
  if (name == "le" || name == "<=") return compare(v, one("other")) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, one("other")) > 0;
  if (name == "ge" || name == ">=") return compare(v, one("other")) >= 0;
  if (name == "in") {
    Value seq = one("seq");
    if (seq.is_string()) return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
    if (seq.is_dict()) return seq.as_dict().find(v) != nullptr;
    for (const Value& x : iterate(seq))
      if (equals(x, v)) return true;
    return false;
  }
  fail("test '", name, "' is not supported");
}

}  // namespace regolith::jinja
