// BPE merge loop. Two paths with identical results: a quadratic scan for short pieces (the
// common case: a word is a handful of bytes, and a scan of a few pairs beats a heap), and a
// heap over a linked list for long ones. Both pick the lowest rank, then the leftmost pair.

#include "tokenizer/bpe.h"

#include <queue>

#include "core/error.h"

namespace regolith {
namespace {

constexpr size_t kShortPiece = 48;

uint64_t pair_key(int32_t left, int32_t right) {
  return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

size_t hash_key(uint64_t key) { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 17); }

}  // namespace

bool BpeMerges::add(int32_t left, int32_t right, int32_t merged) {
  if ((n_merges_ + 1) * 2 > slots_.size()) grow();
  uint64_t key = pair_key(left, right);
  size_t mask = slots_.size() - 1;
  for (size_t i = hash_key(key) & mask;; i = (i + 1) & mask) {
    if (slots_[i].key == key) return false;
    if (slots_[i].key == kEmpty) {
      slots_[i] = {key, static_cast<int32_t>(n_merges_), merged};
      ++n_merges_;
      return true;
    }
  }
}

void BpeMerges::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    size_t i = hash_key(s.key) & mask;
    while (slots_[i].key != kEmpty) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

BpeMerges::Found BpeMerges::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return {-1, 0};
  uint64_t key = pair_key(left, right);
  size_t mask = slots_.size() - 1;
  for (size_t i = hash_key(key) & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.key == key) return {s.rank, s.merged};
    if (s.key == kEmpty) return {-1, 0};
  }
}

void BpeMerges::encode_piece(std::string_view bytes, std::vector<int32_t>& out) const {
  if (bytes.empty()) return;
  std::vector<int32_t> symbols(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    uint8_t b = static_cast<uint8_t>(bytes[i]);
    symbols[i] = byte_ids_[b];
    if (symbols[i] < 0) fail("cannot encode byte 0x", std::hex, int(b), ": the vocabulary has no token for it");
  }
  if (symbols.size() <= kShortPiece)
    encode_short(symbols);
  else
    encode_long(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeMerges::encode_short(std::vector<int32_t>& symbols) const {
  // ranks[i]: rank of (symbols[i], symbols[i+1]), -1 when they do not merge.
  int32_t ranks[kShortPiece];
  int32_t merged_ids[kShortPiece];
  size_t n = symbols.size();
  for (size_t i = 0; i + 1 < n; ++i) {
    Found f = find(symbols[i], symbols[i + 1]);
    ranks[i] = f.rank;
    merged_ids[i] = f.merged;
  }
  while (n > 1) {
    size_t best = n;
    for (size_t i = 0; i + 1 < n; ++i)
      if (ranks[i] >= 0 && (best == n || ranks[i] < ranks[best])) best = i;
    if (best == n) break;
    symbols[best] = merged_ids[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      symbols[i] = symbols[i + 1];
      ranks[i] = ranks[i + 1];
      merged_ids[i] = merged_ids[i + 1];
    }
    --n;
    if (best + 1 < n) {
      Found f = find(symbols[best], symbols[best + 1]);
      ranks[best] = f.rank;
      merged_ids[best] = f.merged;
    }
    if (best > 0) {
      Found f = find(symbols[best - 1], symbols[best]);
      ranks[best - 1] = f.rank;
      merged_ids[best - 1] = f.merged;
    }
  }
  symbols.resize(n);
}

void BpeMerges::encode_long(std::vector<int32_t>& symbols) const {
  // Symbols live in a doubly linked list over their original positions; the heap holds
  // candidate merges ordered by (rank, position) and is validated lazily when popped.
  const int32_t n = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> prev(n), next(n);
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    Found f = find(symbols[pos], symbols[next[pos]]);
    if (f.rank >= 0) heap.push({f.rank, pos, symbols[pos], symbols[next[pos]], f.merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    if (!alive[c.pos] || symbols[c.pos] != c.left) continue;
    int32_t r = next[c.pos];
    if (r < 0 || symbols[r] != c.right) continue;
    symbols[c.pos] = c.merged;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t i = 0; i >= 0; i = next[i]) symbols[w++] = symbols[i];
  symbols.resize(w);
}

}  // namespace regolith
