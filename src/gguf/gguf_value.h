// A GGUF metadata value: one of the 13 GGUF v3 value types, arrays (possibly nested) included.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace regolith {

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

std::string_view gguf_type_name(GgufType type);

class GgufValue;

struct GgufArray {
  GgufType element_type = GgufType::UINT8;
  std::vector<GgufValue> items;
};

class GgufValue {
 public:
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, GgufArray, uint64_t, int64_t, double>;

  GgufValue() : value_(uint8_t{0}) {}
  template <typename T>
  GgufValue(T v) : value_(std::move(v)) {}  // NOLINT: implicit on purpose, for literals
  GgufValue(const char* s) : value_(std::string(s)) {}

  GgufType type() const { return static_cast<GgufType>(value_.index()); }
  const Storage& storage() const { return value_; }

  // Accessors check the type and throw Error naming `what` (usually the key) on mismatch.
  bool is_integer() const;
  bool is_number() const;
  int64_t as_int(std::string_view what = "value") const;    // any integer type in range
  uint64_t as_uint(std::string_view what = "value") const;  // any non-negative integer
  double as_double(std::string_view what = "value") const;  // any number
  bool as_bool(std::string_view what = "value") const;
  const std::string& as_string(std::string_view what = "value") const;
  const GgufArray& as_array(std::string_view what = "value") const;
  std::vector<int64_t> as_int_array(std::string_view what = "value") const;
  std::vector<uint64_t> as_uint_array(std::string_view what = "value") const;
  std::vector<double> as_double_array(std::string_view what = "value") const;
  std::vector<std::string> as_string_array(std::string_view what = "value") const;

  // A short human-readable rendering (arrays abbreviated), for `regolith inspect`.
  std::string describe(size_t max_items = 8) const;

  // Typed array helpers for writers.
  template <typename T>
  static GgufValue array(GgufType element_type, const std::vector<T>& values) {
    GgufArray a{element_type, {}};
    a.items.reserve(values.size());
    for (const T& v : values) a.items.emplace_back(v);
    return GgufValue(std::move(a));
  }

 private:
  Storage value_;
};

}  // namespace regolith
