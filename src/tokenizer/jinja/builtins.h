// Jinja2's built-in filters, tests, globals and the Python methods templates call on strings,
// dicts and lists (as the sandbox exposes them). Anything not implemented is an Error naming
// it, never a silent misrender.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace regolith::jinja {

Value apply_filter(const std::string& name, const Value& target, CallArgs& args);
bool apply_test(const std::string& name, const Value& target, CallArgs& args);

// obj.name: a Python method bound to obj, a dict key, an object attribute, or Undefined.
Value get_attribute(const Value& obj, const std::string& name);
// obj[key], falling back to obj.key for strings as Jinja2's sandbox does.
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Values iterated by `for` (list items, dict keys, string characters; nothing for Undefined).
std::vector<Value> iterate(const Value& v);

// Globals every template sees: range, dict, namespace, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> builtin_globals();

// Error for using an undefined value (Jinja2's UndefinedError).
[[noreturn]] void undefined_error(const Value& v);

}  // namespace regolith::jinja
