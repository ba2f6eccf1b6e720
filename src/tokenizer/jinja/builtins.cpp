// Attribute and item access, iteration, Python methods of str/dict/list, and globals — the
// parts of Python that Jinja2's ImmutableSandboxedEnvironment lets a template reach.

#include "tokenizer/jinja/builtins.h"

#include <ctime>

#include "core/error.h"
#include "tokenizer/jinja/args.h"
#include "tokenizer/jinja/pystring.h"

namespace regolith::jinja {

void undefined_error(const Value& v) {
  const std::string& name = v.undefined_name();
  if (name.empty()) fail("undefined value used");
  fail("'", name, "' is undefined");
}

std::vector<Value> iterate(const Value& v) {
  if (v.is_list()) return v.as_list();
  if (v.is_dict()) {
    std::vector<Value> keys;
    for (const auto& kv : v.as_dict().items) keys.push_back(kv.first);
    return keys;
  }
  if (v.is_string()) {
    std::vector<Value> chars;
    for (char32_t c : py::to_u32(v.as_string())) chars.emplace_back(py::from_u32(std::u32string(1, c)));
    return chars;
  }
  if (v.is_undefined()) return {};
  fail("'", v.type_name(), "' object is not iterable");
}

namespace {

std::optional<std::string> optional_string(const Value& v, const char* what) {
  if (v.is_none() || v.is_undefined()) return std::nullopt;
  if (!v.is_string()) fail(what, " must be a string, not ", v.type_name());
  return v.as_string();
}

Value string_list(const std::vector<std::string>& parts) {
  std::vector<Value> items(parts.begin(), parts.end());
  return Value::list(std::move(items));
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) fail(prefix ? "startswith" : "endswith", " first arg must be str or a tuple of str");
    const std::string& x = a.as_string();
    return x.size() <= s.size() && (prefix ? s.compare(0, x.size(), x) : s.compare(s.size() - x.size(), x.size(), x)) == 0;
  };
  if (affix.is_list()) {
    for (const Value& a : affix.as_list())
      if (one(a)) return true;
    return false;
  }
  return one(affix);
}

// find/rfind/index/count on code points (Python's indices are characters, not bytes).
int64_t char_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(py::length(std::string_view(s).substr(0, byte_pos)));
}

Value string_method(const std::string& s, const std::string& name, CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    auto a = bind_args(name, args, {{"chars", Value(nullptr)}});
    std::optional<std::string> chars = optional_string(a[0], "chars");
    return Value(py::strip(s, chars ? &*chars : nullptr, name == "strip" ? 0 : name == "lstrip" ? 1 : 2));
  }
  if (name == "split" || name == "rsplit") {
    auto a = bind_args(name, args, {{"sep", Value(nullptr)}, {"maxsplit", Value(int64_t{-1})}});
    std::optional<std::string> sep = optional_string(a[0], "sep");
    auto f = name == "split" ? py::split : py::rsplit;
    return string_list(f(s, sep ? &*sep : nullptr, a[1].as_int()));
  }
  if (name == "splitlines") {
    auto a = bind_args(name, args, {{"keepends", Value(false)}});
    return string_list(py::splitlines(s, a[0].truthy()));
  }
  if (name == "startswith" || name == "endswith") {
    auto a = bind_args(name, args, {{"prefix", std::nullopt}});
    return Value(affix_matches(s, a[0], name == "startswith"));
  }
  if (name == "replace") {
    auto a = bind_args(name, args, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value(int64_t{-1})}});
    return Value(py::replace(s, a[0].as_string(), a[1].as_string(), a[2].as_int()));
  }
  if (name == "upper") return Value(py::upper(s));
  if (name == "lower") return Value(py::lower(s));
  if (name == "title") return Value(py::title(s));
  if (name == "capitalize") return Value(py::capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    auto a = bind_args(name, args, {{"sub", std::nullopt}});
    if (!a[0].is_string()) fail(name, "() argument must be str, not ", a[0].type_name());
    const std::string& sub = a[0].as_string();
    if (name == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(py::length(s) + 1));
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") fail("substring not found");
      return Value(int64_t{-1});
    }
    return Value(char_index(s, p));
  }
  if (name == "join") {
    auto a = bind_args(name, args, {{"iterable", std::nullopt}});
    std::string out;
    bool first = true;
    for (const Value& v : iterate(a[0])) {
      if (!v.is_string()) fail("sequence item: expected str instance, ", v.type_name(), " found");
      if (!first) out += s;
      out += v.as_string();
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    auto a = bind_args(name, args, {{"affix", std::nullopt}});
    const std::string& x = a[0].as_string();
    if (name == "removeprefix") return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    bool ends = x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value(ends ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    bind_args(name, args, {});
    return Value(py::is_class(s, name));
  }
  fail("str method '", name, "' is not supported");
}

Value dict_method(const Value& d, const std::string& name, CallArgs& args) {
  if (name == "items" || name == "keys" || name == "values") {
    bind_args(name, args, {});
    std::vector<Value> out;
    for (const auto& [k, v] : d.as_dict().items) {
      if (name == "items") out.push_back(Value::list({k, v}, /*is_tuple=*/true));
      else out.push_back(name == "keys" ? k : v);
    }
    return Value::list(std::move(out));
  }
  if (name == "get") {
    auto a = bind_args(name, args, {{"key", std::nullopt}, {"default", Value(nullptr)}});
    const Value* v = d.as_dict().find(a[0]);
    return v ? *v : a[1];
  }
  fail("dict method '", name, "' is not supported");
}

Value list_method(const Value& l, const std::string& name, CallArgs& args) {
  auto a = bind_args(name, args, {{"value", std::nullopt}});
  int64_t count = 0;
  for (size_t i = 0; i < l.as_list().size(); ++i)
    if (equals(l.as_list()[i], a[0])) {
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++count;
    }
  if (name == "index") fail(a[0].repr(), " is not in list");
  return Value(count);
}

bool is_string_method(const std::string& n) {
  static const char* const names[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith",
                                      "endswith", "replace", "upper", "lower", "title", "capitalize", "find",
                                      "rfind", "index", "rindex", "count", "join", "removeprefix", "removesuffix",
                                      "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower", "format",
                                      "center", "ljust", "rjust", "zfill", "partition", "rpartition", "encode",
                                      "casefold", "swapcase", "expandtabs", "translate", "format_map"};
  for (const char* x : names)
    if (n == x) return true;
  return false;
}

bool is_mutating_method(const Value& obj, const std::string& n) {
  if (obj.is_list())
    return n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" || n == "clear" ||
           n == "sort" || n == "reverse";
  if (obj.is_dict()) return n == "update" || n == "pop" || n == "popitem" || n == "setdefault" || n == "clear";
  return false;
}

Value bound(const Value& obj, const std::string& name, Value (*method)(const Value&, const std::string&, CallArgs&)) {
  return Value::function(obj.type_name() + "." + name, [obj, name, method](CallArgs& a) { return method(obj, name, a); });
}

}  // namespace

Value get_attribute(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::undefined: undefined_error(obj);
    case Value::Kind::string:
      if (is_string_method(name))
        return Value::function("str." + name, [s = obj.as_string(), name](CallArgs& a) { return string_method(s, name, a); });
      break;
    case Value::Kind::dict:
      if (name == "items" || name == "keys" || name == "values" || name == "get") return bound(obj, name, dict_method);
      if (const Value* v = obj.as_dict().find(std::string_view(name))) return *v;
      break;
    case Value::Kind::list:
      if (name == "index" || name == "count") return bound(obj, name, list_method);
      break;
    case Value::Kind::object:
      if (const Value* v = obj.as_object().find(name)) return *v;
      break;
    default: break;
  }
  if (is_mutating_method(obj, name)) {
    std::string what = "access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe";
    return Value::function(name, [what](CallArgs&) -> Value { fail(what); });
  }
  return Value(Undefined{"'" + obj.type_name() + " object' has no attribute '" + name + "'"});
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t n = obj.is_list() ? static_cast<int64_t>(obj.as_list().size())
                              : static_cast<int64_t>(py::length(obj.as_string()));
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      if (obj.is_list()) return obj.as_list()[i];
      return Value(py::from_u32(std::u32string(1, py::to_u32(obj.as_string())[i])));
    }
  }
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value(Undefined{obj.type_name() + " object has no element " + key.repr()});
}

Value get_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!obj.is_list() && !obj.is_string()) fail("'", obj.type_name(), "' object is not subscriptable");
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail("slice ", what, " must be an integer or None");
    return v.as_int();
  };
  std::u32string chars;
  if (obj.is_string()) chars = py::to_u32(obj.as_string());
  const int64_t n = obj.is_string() ? static_cast<int64_t>(chars.size()) : static_cast<int64_t>(obj.as_list().size());
  int64_t step = as_index(step_v, "step").value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= n) {
      i = step < 0 ? n - 1 : n;
    }
    return i;
  };
  int64_t start = adjust(as_index(start_v, "start"), step < 0 ? n - 1 : 0);
  int64_t stop = adjust(as_index(stop_v, "stop"), step < 0 ? -1 : n);
  std::vector<Value> items;
  std::u32string picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_string()) picked += chars[i];
    else items.push_back(obj.as_list()[i]);
  }
  if (obj.is_string()) return Value(py::from_u32(picked));
  return Value::list(std::move(items), obj.is_tuple());
}

std::vector<std::pair<std::string, Value>> builtin_globals() {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::function("range", [](CallArgs& a) {
    if (!a.keyword.empty() || a.positional.empty() || a.positional.size() > 3) fail("range() takes 1 to 3 arguments");
    for (const Value& v : a.positional)
      if (!v.is_int() && !v.is_bool()) fail("range() arguments must be integers");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() == 3) step = a.positional[2].as_int();
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    std::vector<Value> items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (items.size() >= 100000) fail("range() is too long for the sandbox (100000 items)");
      items.emplace_back(i);
    }
    return Value::list(std::move(items));
  }));
  g.emplace_back("dict", Value::function("dict", [](CallArgs& a) {
    std::vector<std::pair<Value, Value>> items;
    if (a.positional.size() > 1) fail("dict() takes at most 1 positional argument");
    if (!a.positional.empty()) items = a.positional[0].as_dict().items;
    for (auto& [k, v] : a.keyword) items.emplace_back(Value(k), v);
    return Value::dict(std::move(items));
  }));
  g.emplace_back("namespace", Value::function("namespace", [](CallArgs& a) {
    auto ns = std::make_shared<ObjectData>();
    ns->type_name = "Namespace";
    ns->assignable = true;
    for (const Value& p : a.positional) {
      if (!p.is_dict()) fail("namespace() positional arguments must be dicts");
      for (const auto& [k, v] : p.as_dict().items) ns->set(k.str(), v);
    }
    for (auto& [k, v] : a.keyword) ns->set(k, v);
    return Value(std::move(ns));
  }));
  g.emplace_back("raise_exception", Value::function("raise_exception", [](CallArgs& a) -> Value {
    fail("chat template raised an exception: ", a.positional.empty() ? std::string() : a.positional[0].str());
  }));
  g.emplace_back("strftime_now", Value::function("strftime_now", [](CallArgs& a) {
    auto args = bind_args("strftime_now", a, {{"format", std::nullopt}});
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, args[0].str().c_str(), &local);
    return Value(std::string(buf, n));
  }));
  return g;
}

}  // namespace regolith::jinja
