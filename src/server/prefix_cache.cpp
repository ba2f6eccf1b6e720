#include "server/prefix_cache.h"

#include <algorithm>

namespace regolith::server {
namespace {

uint64_t mix(uint64_t h, int32_t token) {
  h ^= static_cast<uint32_t>(token) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

}  // namespace

std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens) {
  std::vector<uint64_t> out(tokens.size() + 1);
  out[0] = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < tokens.size(); ++i) out[i + 1] = mix(out[i], tokens[i]);
  return out;
}

std::optional<PrefixCache::Hit> PrefixCache::find(std::span<const int32_t> tokens, int64_t max_tokens) {
  max_tokens = std::min<int64_t>(max_tokens, static_cast<int64_t>(tokens.size()));
  if (lru_.empty() || max_tokens <= 0) {
    ++stats_.misses;
    return std::nullopt;
  }
  std::vector<uint64_t> hashes = prefix_hashes(tokens.first(static_cast<size_t>(max_tokens)));
  for (auto it = lengths_.upper_bound(max_tokens); it != lengths_.begin();) {
    --it;
    int64_t n = it->first;
    auto found = by_hash_.find(hashes[n]);
    if (found == by_hash_.end()) continue;
    const Entry& e = *found->second;
    if (static_cast<int64_t>(e.tokens.size()) != n || !std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
      continue;  // a hash collision
    lru_.splice(lru_.begin(), lru_, found->second);
    ++stats_.hits;
    stats_.hit_tokens += n;
    return Hit{e.snapshot, e.logits, n};
  }
  ++stats_.misses;
  return std::nullopt;
}

bool PrefixCache::refresh(std::span<const int32_t> tokens, SnapshotPoint point) {
  auto found = by_hash_.find(prefix_hashes(tokens).back());
  if (found == by_hash_.end() ||
      !std::equal(found->second->tokens.begin(), found->second->tokens.end(), tokens.begin(), tokens.end()))
    return false;
  if (point != SnapshotPoint::chunk) found->second->point = point;
  lru_.splice(lru_.begin(), lru_, found->second);
  return true;
}

void PrefixCache::erase(List::iterator it) {
  used_ -= it->bytes;
  if (--lengths_[static_cast<int64_t>(it->tokens.size())] == 0) lengths_.erase(static_cast<int64_t>(it->tokens.size()));
  by_hash_.erase(it->hash);
  lru_.erase(it);
  stats_.entries = static_cast<int64_t>(lru_.size());
  stats_.bytes = static_cast<int64_t>(used_);
}

void PrefixCache::insert(std::vector<int32_t> tokens, std::shared_ptr<const SessionSnapshot> snapshot,
                         std::vector<float> logits, size_t bytes, SnapshotPoint point) {
  bytes += logits.size() * sizeof(float);
  if (!enabled() || tokens.empty() || bytes > budget_) return;
  uint64_t hash = prefix_hashes(tokens).back();
  if (auto found = by_hash_.find(hash); found != by_hash_.end()) {
    if (found->second->tokens == tokens) {  // already cached: refresh, keep the more useful label
      if (point != SnapshotPoint::chunk) found->second->point = point;
      lru_.splice(lru_.begin(), lru_, found->second);
      return;
    }
    erase(found->second);
  }
  while (used_ + bytes > budget_ && !lru_.empty()) {
    erase(std::prev(lru_.end()));
    ++stats_.evictions;
  }
  lengths_[static_cast<int64_t>(tokens.size())]++;
  lru_.push_front(Entry{std::move(tokens), std::move(snapshot),
                        std::make_shared<const std::vector<float>>(std::move(logits)), bytes, hash, point});
  by_hash_[hash] = lru_.begin();
  used_ += bytes;
  stats_.entries = static_cast<int64_t>(lru_.size());
  stats_.bytes = static_cast<int64_t>(used_);
}

std::vector<std::vector<int32_t>> PrefixCache::persistent_keys() const {
  std::vector<std::vector<int32_t>> out;
  for (const Entry& e : lru_)
    if (e.point != SnapshotPoint::chunk) out.push_back(e.tokens);
  return out;
}

size_t estimate_snapshot_bytes(const Qwen4ExpHparams& hp, int64_t n_tokens, DType gdn_state) {
  int64_t capacity = 256;
  while (capacity < n_tokens) capacity = std::max(n_tokens, 2 * capacity);
  int64_t floats = 0, gdn_values = 0;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    if (hp.is_recurrent[il]) {
      floats += hp.ssm_conv_dim() * (hp.ssm_conv_kernel - 1);
      gdn_values += hp.ssm_v_head_dim * hp.ssm_k_head_dim * hp.ssm_n_v_heads;
    } else {
      int64_t ratio = std::max<int64_t>(1, hp.compress_ratios[il]);
      floats += capacity * (2 * hp.head_dim * hp.n_head_kv + hp.indexer_head_dim);
      floats += (capacity / ratio + 1) * hp.indexer_head_dim;
    }
  }
  if (!hp.ple_layers.empty()) floats += hp.hc_dim() * (hp.ple_conv_kernel - 1) * hp.ple_ngram_size;
  // The MTP layer's caches (dense attention: no pooled keys) and a waiting residual.
  if (hp.n_layer_nextn) floats += capacity * (2 * hp.head_dim * hp.n_head_kv + hp.indexer_head_dim) + hp.hc_dim();
  return static_cast<size_t>(floats) * sizeof(float) + static_cast<size_t>(gdn_values) * dtype_bytes(gdn_state) +
         static_cast<size_t>(2 * n_tokens) * sizeof(int32_t) + 1024;
}

}  // namespace regolith::server
