#include "cli/token_list.h"

#include <cctype>

#include "core/error.h"

namespace regolith::cli {

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ',')) ++i;
    if (i == text.size()) break;
    size_t j = i;
    int64_t v = 0;
    while (j < text.size() && std::isdigit(static_cast<unsigned char>(text[j]))) {
      v = v * 10 + (text[j] - '0');
      if (v > INT32_MAX) fail("--tokens: id too large at '", text.substr(i, j - i + 1), "'");
      ++j;
    }
    if (j == i) fail("--tokens: expected a token id at '", text.substr(i), "'");
    out.push_back(static_cast<int32_t>(v));
    i = j;
    if (i < text.size() && text[i] != ',' && text[i] != ' ') fail("--tokens: unexpected '", text[i], "'");
  }
  if (out.empty()) fail("--tokens: no token ids");
  return out;
}

}  // namespace regolith::cli
