// Byte-level BPE merges: turns one pre-tokenized piece (raw bytes) into token ids by repeatedly
// merging the adjacent pair of lowest merge rank, leftmost first, as Hugging Face's BPE model
// does. Pieces are short in practice; a pathological long piece stays O(n log n).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace regolith {

class BpeMerges {
 public:
  BpeMerges() = default;
  // byte_ids[b]: the id of the token for byte b alone.
  explicit BpeMerges(const std::array<int32_t, 256>& byte_ids) : byte_ids_(byte_ids) {}

  // Adds the merge (left, right) -> merged with the next rank; false if the pair is already
  // present (the first occurrence keeps its rank).
  bool add(int32_t left, int32_t right, int32_t merged);
  size_t size() const { return n_merges_; }

  // Appends the ids of one piece to out.
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;

 private:
  struct Slot {
    uint64_t key = kEmpty;
    int32_t rank = 0;
    int32_t merged = 0;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  // (rank, merged) of the pair, or rank -1.
  struct Found {
    int32_t rank;
    int32_t merged;
  };
  Found find(int32_t left, int32_t right) const;
  void grow();
  void encode_short(std::vector<int32_t>& symbols) const;
  void encode_long(std::vector<int32_t>& symbols) const;

  std::array<int32_t, 256> byte_ids_{};
  std::vector<Slot> slots_;  // open addressing, linear probing, power-of-two size
  size_t n_merges_ = 0;
};

}  // namespace regolith
