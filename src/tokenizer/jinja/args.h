// Binding call arguments to named parameters with defaults, Python style, for built-in
// filters, tests, methods and globals.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja/value.h"

namespace regolith::jinja {

struct Param {
  const char* name;
  std::optional<Value> fallback;  // nullopt: required
};

// Values for `params` in order, from positional then keyword arguments.
inline std::vector<Value> bind_args(const std::string& fn, CallArgs& args, std::initializer_list<Param> params) {
  std::vector<std::optional<Value>> bound(params.size());
  if (args.positional.size() > params.size())
    fail(fn, "() takes at most ", params.size(), " argument(s) (", args.positional.size(), " given)");
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    for (const Param& p : params) {
      if (key == p.name) break;
      ++i;
    }
    if (i == params.size()) fail(fn, "() got an unexpected keyword argument '", key, "'");
    if (bound[i]) fail(fn, "() got multiple values for argument '", key, "'");
    bound[i] = value;
  }
  std::vector<Value> out;
  size_t i = 0;
  for (const Param& p : params) {
    if (bound[i])
      out.push_back(*bound[i]);
    else if (p.fallback)
      out.push_back(*p.fallback);
    else
      fail(fn, "() missing required argument '", p.name, "'");
    ++i;
  }
  return out;
}

}  // namespace regolith::jinja
