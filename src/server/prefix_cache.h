// The prefix cache for hybrid state: complete Session snapshots (GDN recurrent + conv state, QSA
// caches, PLE history) keyed by the token sequence they have consumed. A hybrid model cannot
// truncate its recurrent state to an arbitrary prefix, so the cache keeps whole checkpoints at
// useful points (prefill chunk boundaries, the end of each prompt and reply) and a new request
// restores the longest one that is a prefix of its prompt. Each entry also keeps the logits of its
// last token, so a prompt that is cached whole needs no forward pass at all. Memory-bounded, least recently used
// evicted first. Owned and used by the scheduler thread only; counters are atomics for /metrics.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/session.h"

namespace regolith::server {

enum class SnapshotPoint : uint8_t { chunk, prompt_end, reply_end, restored_from_disk };

struct PrefixCacheStats {
  std::atomic<int64_t> entries{0}, bytes{0}, hits{0}, misses{0}, evictions{0}, hit_tokens{0};
};

class PrefixCache {
 public:
  explicit PrefixCache(size_t budget_bytes) : budget_(budget_bytes) {}

  struct Hit {
    std::shared_ptr<const SessionSnapshot> snapshot;
    std::shared_ptr<const std::vector<float>> logits;  // the row after the last cached token
    int64_t n_tokens = 0;
  };
  // The longest cached prefix of `tokens` with at most `max_tokens` tokens.
  std::optional<Hit> find(std::span<const int32_t> tokens, int64_t max_tokens);

  // Stores a snapshot of a session that has consumed exactly `tokens` and the logits its last
  // token produced (`bytes`: the snapshot's memory).
  void insert(std::vector<int32_t> tokens, std::shared_ptr<const SessionSnapshot> snapshot, std::vector<float> logits,
              size_t bytes, SnapshotPoint point);
  // Marks an existing entry as just used (and as `point` unless that is a chunk); false when absent.
  bool refresh(std::span<const int32_t> tokens, SnapshotPoint point);

  // Token sequences worth keeping across restarts: ends of prompts and replies, most recent first.
  std::vector<std::vector<int32_t>> persistent_keys() const;

  bool enabled() const { return budget_ > 0; }
  size_t budget() const { return budget_; }
  const PrefixCacheStats& stats() const { return stats_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::shared_ptr<const SessionSnapshot> snapshot;
    std::shared_ptr<const std::vector<float>> logits;
    size_t bytes = 0;
    uint64_t hash = 0;
    SnapshotPoint point = SnapshotPoint::chunk;
  };
  using List = std::list<Entry>;  // most recently used first
  void erase(List::iterator it);

  size_t budget_, used_ = 0;
  List lru_;
  std::unordered_map<uint64_t, List::iterator> by_hash_;
  std::map<int64_t, int64_t> lengths_;  // entry length -> how many entries have it
  PrefixCacheStats stats_;
};

// Rolling hash of token prefixes: prefix_hashes(t)[i] is the hash of t[0..i).
std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens);

// Bytes a snapshot of `n_tokens` holds: the fixed recurrent state plus the QSA caches, which grow
// by doubling from 256 token slots as Qwen4ExpState does. An estimate made from the hyperparameters
// until the runtime reports a snapshot's size itself.
size_t estimate_snapshot_bytes(const Qwen4ExpHparams& hp, int64_t n_tokens, DType gdn_state);

}  // namespace regolith::server
