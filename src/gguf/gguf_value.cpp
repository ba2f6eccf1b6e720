#include "gguf/gguf_value.h"

#include <cmath>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace regolith {

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::UINT8: return "u8";
    case GgufType::INT8: return "i8";
    case GgufType::UINT16: return "u16";
    case GgufType::INT16: return "i16";
    case GgufType::UINT32: return "u32";
    case GgufType::INT32: return "i32";
    case GgufType::FLOAT32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::UINT64: return "u64";
    case GgufType::INT64: return "i64";
    case GgufType::FLOAT64: return "f64";
  }
  return "unknown";
}

namespace {

[[noreturn]] void wrong_type(std::string_view what, std::string_view expected, GgufType got) {
  fail(what, ": expected ", expected, ", found ", gguf_type_name(got));
}

}  // namespace

bool GgufValue::is_integer() const {
  switch (type()) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_number() const {
  return is_integer() || type() == GgufType::FLOAT32 || type() == GgufType::FLOAT64;
}

int64_t GgufValue::as_int(std::string_view what) const {
  if (const auto* u = std::get_if<uint64_t>(&value_)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(what, ": value ", *u, " out of range");
    return static_cast<int64_t>(*u);
  }
  if (!is_integer()) wrong_type(what, "an integer", type());
  return std::visit(
      [](const auto& v) -> int64_t {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) return static_cast<int64_t>(v);
        return 0;
      },
      value_);
}

uint64_t GgufValue::as_uint(std::string_view what) const {
  if (const auto* u = std::get_if<uint64_t>(&value_)) return *u;
  int64_t v = as_int(what);
  if (v < 0) fail(what, ": expected a non-negative integer, found ", v);
  return static_cast<uint64_t>(v);
}

double GgufValue::as_double(std::string_view what) const {
  if (const auto* f = std::get_if<float>(&value_)) return *f;
  if (const auto* d = std::get_if<double>(&value_)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&value_)) return static_cast<double>(*u);
  if (!is_integer()) wrong_type(what, "a number", type());
  return static_cast<double>(as_int(what));
}

bool GgufValue::as_bool(std::string_view what) const {
  if (const auto* b = std::get_if<bool>(&value_)) return *b;
  wrong_type(what, "a bool", type());
}

const std::string& GgufValue::as_string(std::string_view what) const {
  if (const auto* s = std::get_if<std::string>(&value_)) return *s;
  wrong_type(what, "a string", type());
}

const GgufArray& GgufValue::as_array(std::string_view what) const {
  if (const auto* a = std::get_if<GgufArray>(&value_)) return *a;
  wrong_type(what, "an array", type());
}

std::vector<int64_t> GgufValue::as_int_array(std::string_view what) const {
  std::vector<int64_t> out;
  for (const GgufValue& v : as_array(what).items) out.push_back(v.as_int(what));
  return out;
}

std::vector<uint64_t> GgufValue::as_uint_array(std::string_view what) const {
  std::vector<uint64_t> out;
  for (const GgufValue& v : as_array(what).items) out.push_back(v.as_uint(what));
  return out;
}

std::vector<double> GgufValue::as_double_array(std::string_view what) const {
  std::vector<double> out;
  for (const GgufValue& v : as_array(what).items) out.push_back(v.as_double(what));
  return out;
}

std::vector<std::string> GgufValue::as_string_array(std::string_view what) const {
  std::vector<std::string> out;
  for (const GgufValue& v : as_array(what).items) out.push_back(v.as_string(what));
  return out;
}

std::string GgufValue::describe(size_t max_items) const {
  std::ostringstream out;
  std::visit(
      [&](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::string>) {
          std::string shown = v.size() > 60 ? v.substr(0, 57) + "..." : v;
          for (char& c : shown)
            if (c == '\n' || c == '\r' || c == '\t') c = ' ';
          out << '"' << shown << '"';
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          out << '[';
          for (size_t i = 0; i < v.items.size() && i < max_items; ++i)
            out << (i ? ", " : "") << v.items[i].describe(max_items);
          if (v.items.size() > max_items) out << ", ... (" << v.items.size() << " items)";
          out << ']';
        } else if constexpr (std::is_same_v<T, bool>) {
          out << (v ? "true" : "false");
        } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
          out << static_cast<int>(v);
        } else {
          out << v;
        }
      },
      value_);
  return out.str();
}

}  // namespace regolith
