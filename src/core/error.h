// Errors: one exception type whose message names the file, tensor or field at fault.
// Everything that reads untrusted bytes throws regolith::Error; nothing aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace regolith {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Concatenates the arguments with operator<< (g++ 12 has no <format>).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

}  // namespace regolith
