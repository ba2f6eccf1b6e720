// Byte trie over the added tokens; only positions whose byte can start a token are tried.

#include "tokenizer/special_tokens.h"

#include <algorithm>

namespace regolith {

int32_t SpecialTokenMatcher::child(int32_t node, uint8_t b) const {
  const auto& c = nodes_[node].children;
  auto it = std::lower_bound(c.begin(), c.end(), std::make_pair(b, INT32_MIN));
  return it != c.end() && it->first == b ? it->second : -1;
}

void SpecialTokenMatcher::add(std::string_view text, int32_t id) {
  if (text.empty()) return;
  int32_t node = 0;
  for (char ch : text) {
    uint8_t b = static_cast<uint8_t>(ch);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& c = nodes_[node].children;
      c.insert(std::lower_bound(c.begin(), c.end(), std::make_pair(b, INT32_MIN)), {b, next});
    }
    node = next;
  }
  // Two ids with the same text: the first one wins, as it does in a vocabulary lookup.
  if (nodes_[node].id < 0) nodes_[node].id = id;
  first_byte_[static_cast<uint8_t>(text[0])] = true;
}

std::vector<SpecialTokenMatcher::Segment> SpecialTokenMatcher::split(std::string_view text) const {
  std::vector<Segment> out;
  size_t plain_start = 0, pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t node = 0, best_id = -1;
    size_t best_len = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      if (nodes_[node].id >= 0) best_id = nodes_[node].id, best_len = i - pos + 1;
    }
    if (best_id < 0) {
      ++pos;
      continue;
    }
    if (pos > plain_start) out.push_back({text.substr(plain_start, pos - plain_start), -1});
    out.push_back({text.substr(pos, best_len), best_id});
    pos += best_len;
    plain_start = pos;
  }
  if (plain_start < text.size()) out.push_back({text.substr(plain_start), -1});
  return out;
}

}  // namespace regolith
