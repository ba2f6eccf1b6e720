// Python semantics for Jinja values: str/repr, equality and ordering, json.dumps.

#include "tokenizer/jinja/value.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace regolith::jinja {

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (equals(k, key)) return &v;
  return nullptr;
}

const Value* DictData::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k.is_string() && k.as_string() == key) return &v;
  return nullptr;
}

const Value* ObjectData::find(std::string_view name) const {
  for (const auto& [k, v] : attrs)
    if (k == name) return &v;
  return nullptr;
}

void ObjectData::set(const std::string& name, Value v) {
  for (auto& [k, old] : attrs)
    if (k == name) {
      old = std::move(v);
      return;
    }
  attrs.emplace_back(name, std::move(v));
}

Value Value::list(std::vector<Value> items, bool is_tuple) {
  return Value(std::make_shared<const ListData>(ListData{std::move(items), is_tuple}));
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  return Value(std::make_shared<const DictData>(DictData{std::move(items)}));
}

Value Value::function(std::string name, std::function<Value(CallArgs&)> call) {
  return Value(std::make_shared<const Function>(Function{std::move(name), std::move(call)}));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(nullptr);
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<Value, Value>> items;
      for (const auto& [k, v] : j.items()) items.emplace_back(Value(k), from_json(v));
      return dict(std::move(items));
    }
    default: return Value(nullptr);  // binary / discarded: not produced by a JSON parser
  }
}

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(v_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(v_);
  return static_cast<double>(as_int());
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: return is_tuple() ? "tuple" : "list";
    case Kind::dict: return "dict";
    case Kind::object: return as_object().type_name;
    case Kind::function: return "function";
  }
  return "?";
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::undefined:
    case Kind::none: return false;
    case Kind::boolean: return as_bool();
    case Kind::integer: return as_int() != 0;
    case Kind::floating: return as_double() != 0.0;
    case Kind::string: return !as_string().empty();
    case Kind::list: return !as_list().empty();
    case Kind::dict: return !as_dict().items.empty();
    default: return true;
  }
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-1.2345e+02": shortest round-trip digits
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, 1) + (e > 2 ? sci.substr(2, e - 2) : "");
  int exponent = std::stoi(sci.substr(e + 1));
  int decpt = exponent + 1;  // digits d1 d2 ... with the point after decpt of them
  std::string out = negative ? "-" : "";
  if (decpt > 16 || decpt < -3) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + ebuf;
  }
  if (decpt <= 0) return out + "0." + std::string(-decpt, '0') + digits;
  if (static_cast<size_t>(decpt) >= digits.size()) return out + digits + std::string(decpt - digits.size(), '0') + ".0";
  return out + digits.substr(0, decpt) + "." + digits.substr(decpt);
}

namespace {

// Python's str.isprintable() for one character: everything but categories Cc Cf Cs Co Cn
// Zl Zp Zs, except the ASCII space.
bool python_printable(char32_t c) {
  if (c == ' ') return true;
  switch (u_charType(static_cast<UChar32>(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_SURROGATE:
    case U_PRIVATE_USE_CHAR:
    case U_UNASSIGNED:
    case U_LINE_SEPARATOR:
    case U_PARAGRAPH_SEPARATOR:
    case U_SPACE_SEPARATOR: return false;
    default: return true;
  }
}

std::string string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  size_t pos = 0;
  while (pos < s.size()) {
    char32_t c = utf8::decode(s, pos);
    char buf[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x7F ? (c >= 0x20) : python_printable(c)) {
      utf8::append(out, c);
    } else {
      std::snprintf(buf, sizeof buf, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", unsigned(c));
      out += buf;
    }
  }
  out += quote;
  return out;
}

std::string sequence_str(const Value& v) {
  const auto& items = v.as_list();
  std::string out = v.is_tuple() ? "(" : "[";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += items[i].repr();
  }
  if (v.is_tuple() && items.size() == 1) out += ",";
  out += v.is_tuple() ? ")" : "]";
  return out;
}

std::string dict_str(const DictData& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.items.size(); ++i) {
    if (i) out += ", ";
    out += d.items[i].first.repr() + ": " + d.items[i].second.repr();
  }
  return out + "}";
}

}  // namespace

std::string Value::str() const {
  switch (kind()) {
    case Kind::undefined: return "";
    case Kind::none: return "None";
    case Kind::boolean: return as_bool() ? "True" : "False";
    case Kind::integer: return std::to_string(as_int());
    case Kind::floating: return python_float_repr(as_double());
    case Kind::string: return as_string();
    case Kind::list: return sequence_str(*this);
    case Kind::dict: return dict_str(as_dict());
    case Kind::object: {
      std::string out = "<" + as_object().type_name + " {";
      bool first = true;
      for (const auto& [k, v] : as_object().attrs) {
        out += (first ? "" : ", ") + string_repr(k) + ": " + v.repr();
        first = false;
      }
      return out + "}>";
    }
    case Kind::function: return "<function " + as_function().name + ">";
  }
  return "";
}

std::string Value::repr() const {
  if (is_string()) return string_repr(as_string());
  if (is_undefined()) return "Undefined";
  return str();
}

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::undefined:
    case K::none: return true;
    case K::string: return a.as_string() == b.as_string();
    case K::list: {
      if (a.is_tuple() != b.is_tuple() || a.as_list().size() != b.as_list().size()) return false;
      for (size_t i = 0; i < a.as_list().size(); ++i)
        if (!equals(a.as_list()[i], b.as_list()[i])) return false;
      return true;
    }
    case K::dict: {
      if (a.as_dict().items.size() != b.as_dict().items.size()) return false;
      for (const auto& [k, v] : a.as_dict().items) {
        const Value* other = b.as_dict().find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    case K::object: return &a.as_object() == &b.as_object();
    case K::function: return &a.as_function() == &b.as_function();
    default: return false;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (equals(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

namespace {

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t pos = 0;
  while (pos < s.size()) {
    size_t start = pos;
    char32_t c = utf8::decode(s, pos);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      out += buf;
    } else if (c >= 0x80 && ensure_ascii) {
      if (c >= 0x10000) {
        char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", unsigned(0xD800 | (v >> 10)), unsigned(0xDC00 | (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      }
      out += buf;
    } else {
      out.append(s, start, pos - start);  // the original bytes (keeps even invalid ones)
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return python_float_repr(d);
}

std::string json_key(const Value& k) {
  if (k.is_string()) return k.as_string();
  if (k.is_bool()) return k.as_bool() ? "true" : "false";
  if (k.is_int()) return std::to_string(k.as_int());
  if (k.is_float()) return json_float(k.as_double());
  if (k.is_none()) return "null";
  fail("keys must be str, int, float, bool or None, not ", k.type_name());
}

void json_value(const Value& v, const JsonOptions& o, int level, std::string& out) {
  auto newline = [&](int lv) {
    if (!o.indent) return;
    out += '\n';
    for (int i = 0; i < lv; ++i) out += *o.indent;
  };
  switch (v.kind()) {
    case Value::Kind::none: out += "null"; return;
    case Value::Kind::boolean: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::integer: out += std::to_string(v.as_int()); return;
    case Value::Kind::floating: out += json_float(v.as_double()); return;
    case Value::Kind::string: json_string(v.as_string(), o.ensure_ascii, out); return;
    case Value::Kind::list: {
      const auto& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(level + 1);
        json_value(items[i], o, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::dict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return compare(a->first, b->first) < 0; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(level + 1);
        json_string(json_key(items[i]->first), o.ensure_ascii, out);
        out += o.key_separator;
        json_value(items[i]->second, o, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default: fail("Object of type ", v.type_name(), " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const JsonOptions& options) {
  std::string out;
  json_value(v, options, 0, out);
  return out;
}

}  // namespace regolith::jinja
