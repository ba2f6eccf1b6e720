// Values of the Jinja interpreter, with Python's semantics, because chat templates are written
// against Jinja2 running on Python: str() and repr() of lists and dicts, float repr, truthiness,
// == across int/float/bool, ordered dicts. Lists and dicts are immutable and shared (the
// sandbox transformers uses forbids mutating them); namespaces are the one mutable object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace regolith::jinja {

class Value;

struct Undefined {
  std::string name;  // what was looked up, for the error when it is used
};
struct ListData {
  std::vector<Value> items;
  bool is_tuple = false;
};
struct DictData {
  std::vector<std::pair<Value, Value>> items;  // insertion order, keys unique
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
};
// Attribute bags: `namespace(...)` (assignable with {% set ns.x = ... %}) and `loop`.
struct ObjectData {
  std::string type_name;
  std::vector<std::pair<std::string, Value>> attrs;
  bool assignable = false;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value v);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
struct Function {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

using ListPtr = std::shared_ptr<const ListData>;
using DictPtr = std::shared_ptr<const DictData>;
using ObjectPtr = std::shared_ptr<ObjectData>;
using FunctionPtr = std::shared_ptr<const Function>;

class Value {
 public:
  using Storage = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, ListPtr, DictPtr,
                               ObjectPtr, FunctionPtr>;
  enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, object, function };

  Value() : v_(Undefined{}) {}
  Value(Undefined u) : v_(std::move(u)) {}
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(ListPtr l) : v_(std::move(l)) {}
  Value(DictPtr d) : v_(std::move(d)) {}
  Value(ObjectPtr o) : v_(std::move(o)) {}
  Value(FunctionPtr f) : v_(std::move(f)) {}

  static Value list(std::vector<Value> items, bool is_tuple = false);
  static Value dict(std::vector<std::pair<Value, Value>> items);
  static Value function(std::string name, std::function<Value(CallArgs&)> call);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::undefined; }
  bool is_none() const { return kind() == Kind::none; }
  bool is_bool() const { return kind() == Kind::boolean; }
  bool is_int() const { return kind() == Kind::integer; }  // bools are not ints here
  bool is_float() const { return kind() == Kind::floating; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is a Number
  bool is_string() const { return kind() == Kind::string; }
  bool is_list() const { return kind() == Kind::list; }  // lists and tuples
  bool is_tuple() const { return is_list() && std::get<ListPtr>(v_)->is_tuple; }
  bool is_dict() const { return kind() == Kind::dict; }
  bool is_object() const { return kind() == Kind::object; }
  bool is_function() const { return kind() == Kind::function; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;  // ints and bools
  double as_double() const;  // any number
  const std::string& as_string() const { return std::get<std::string>(v_); }
  const std::vector<Value>& as_list() const { return std::get<ListPtr>(v_)->items; }
  const DictData& as_dict() const { return *std::get<DictPtr>(v_); }
  ObjectData& as_object() const { return *std::get<ObjectPtr>(v_); }
  const Function& as_function() const { return *std::get<FunctionPtr>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }

  // Python's type(x).__name__, for error messages.
  std::string type_name() const;
  bool truthy() const;
  std::string str() const;   // str(x); undefined prints as ""
  std::string repr() const;  // repr(x)

 private:
  Storage v_;
};

// Python ==, and the order of <, for the types that have one (throws otherwise).
bool equals(const Value& a, const Value& b);
int compare(const Value& a, const Value& b);

// Python's repr(float): shortest round-trip digits, exponent outside 1e-4 <= |x| < 1e16.
std::string python_float_repr(double d);

struct JsonOptions {
  std::optional<std::string> indent;  // nullopt: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// Python's json.dumps(x, ...) (what transformers' `tojson` filter calls).
std::string to_json(const Value& v, const JsonOptions& options);

}  // namespace regolith::jinja
