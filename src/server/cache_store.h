// The prefix cache on disk (--cache-dir): one file per cached conversation point, written
// atomically (temporary name, fsync, rename) and verified on load. A file holds a fixed header
// (magic, format version, payload kind, model identity, sizes, payload checksum, header checksum)
// and a payload. A file that is truncated, corrupted, of another version or made for another
// model is skipped with a warning and never trusted.
//
// Payload kind 1 holds the token prefix only: the runtime has no snapshot serialization yet
// (SessionSnapshot keeps its state private), so a loaded prefix is replayed through the model at
// idle time to rebuild its snapshots. Kind 2 (the snapshot's bytes) is reserved for when it has.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace regolith::server {

inline constexpr char kCacheMagic[8] = {'R', 'G', 'L', 'P', 'C', 'A', 'C', 'H'};
inline constexpr uint32_t kCacheVersion = 1;
inline constexpr uint32_t kCachePayloadTokens = 1;
inline constexpr size_t kCacheHeaderBytes = 56;

uint64_t checksum64(const void* data, size_t n, uint64_t seed = 0);

// Identity of a model file: its size, its GGUF header and metadata (everything before the tensor
// data) and samples of the tensor data. Cheap on a file of any size.
uint64_t model_identity(const std::string& path, uint64_t data_offset);

class CacheStore {
 public:
  CacheStore(std::string dir, uint64_t model_id, int64_t n_vocab, int64_t n_ctx)
      : dir_(std::move(dir)), model_id_(model_id), n_vocab_(n_vocab), n_ctx_(n_ctx) {}

  // Makes the directory's cache files these prefixes: new ones written, files of ours for other
  // prefixes removed, valid files for these prefixes left as they are.
  void save(const std::vector<std::vector<int32_t>>& prefixes) const;
  // The prefixes of every valid file; each rejected file adds a line to `warnings`.
  std::vector<std::vector<int32_t>> load(std::vector<std::string>& warnings) const;

  static std::string encode(uint64_t model_id, const std::vector<int32_t>& tokens);
  // Throws regolith::Error naming what is wrong.
  std::vector<int32_t> decode(const std::string& bytes) const;

 private:
  std::string dir_;
  uint64_t model_id_;
  int64_t n_vocab_, n_ctx_;
};

}  // namespace regolith::server
