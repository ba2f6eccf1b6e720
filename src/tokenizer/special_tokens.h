// Finds added tokens (`<|im_start|>`, `<think>`, ...) in text: leftmost, then longest match, as
// Hugging Face's added-vocabulary split does. Text between matches is left for the BPE path.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace regolith {

class SpecialTokenMatcher {
 public:
  void add(std::string_view text, int32_t id);
  bool empty() const { return nodes_.size() <= 1; }

  struct Segment {
    std::string_view text;  // plain text when id < 0
    int32_t id;
  };
  std::vector<Segment> split(std::string_view text) const;

 private:
  // A byte trie; nodes_[0] is the root. Children are kept sorted by byte for a binary search.
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;
    int32_t id = -1;
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool first_byte_[256] = {};
};

}  // namespace regolith
