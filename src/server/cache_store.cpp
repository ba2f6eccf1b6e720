#include "server/cache_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "core/error.h"

namespace regolith::server {
namespace fs = std::filesystem;
namespace {

constexpr const char* kExtension = ".rpc";

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
uint32_t get_u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}
uint64_t get_u64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::string file_name(const std::vector<int32_t>& tokens) {
  char name[40];
  std::snprintf(name, sizeof name, "%016llx%s",
                static_cast<unsigned long long>(checksum64(tokens.data(), tokens.size() * sizeof(int32_t))), kExtension);
  return name;
}

void write_atomically(const fs::path& path, const std::string& bytes) {
  fs::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(tmp.string(), ": cannot create: ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(tmp.string(), ": write failed: ", std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  bool ok = ::fsync(fd) == 0;
  ok &= ::close(fd) == 0;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    fail(path.string(), ": cannot write: ", std::strerror(errno));
  }
}

}  // namespace

uint64_t checksum64(const void* data, size_t n, uint64_t seed) {
  // FNV-1a over 8-byte words with a final avalanche: fast enough for snapshots, catches any flip.
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= n;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

uint64_t model_identity(const std::string& path, uint64_t data_offset) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot read");
  in.seekg(0, std::ios::end);
  uint64_t size = static_cast<uint64_t>(in.tellg());
  uint64_t h = checksum64(&size, sizeof size);
  std::string buf(static_cast<size_t>(std::min<uint64_t>(data_offset, size)), '\0');
  in.seekg(0);
  in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
  h = checksum64(buf.data(), buf.size(), h);
  constexpr int kSamples = 16;
  constexpr size_t kSampleBytes = 4096;
  buf.resize(kSampleBytes);
  for (int s = 0; s < kSamples && size > data_offset; ++s) {
    uint64_t at = data_offset + (size - data_offset) * static_cast<uint64_t>(s) / kSamples;
    in.clear();
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(kSampleBytes));
    h = checksum64(buf.data(), static_cast<size_t>(in.gcount()), h);
  }
  return h;
}

std::string CacheStore::encode(uint64_t model_id, const std::vector<int32_t>& tokens) {
  std::string payload;
  for (int32_t t : tokens) put_u32(payload, static_cast<uint32_t>(t));
  std::string out(kCacheMagic, sizeof kCacheMagic);
  put_u32(out, kCacheVersion);
  put_u32(out, kCachePayloadTokens);
  put_u64(out, model_id);
  put_u64(out, tokens.size());
  put_u64(out, payload.size());
  put_u64(out, checksum64(payload.data(), payload.size()));
  put_u64(out, checksum64(out.data(), out.size()));
  return out + payload;
}

std::vector<int32_t> CacheStore::decode(const std::string& b) const {
  if (b.size() < kCacheHeaderBytes) fail("truncated header (", b.size(), " bytes)");
  if (std::memcmp(b.data(), kCacheMagic, sizeof kCacheMagic) != 0) fail("not a regolith prefix-cache file (bad magic)");
  if (checksum64(b.data(), 48) != get_u64(b, 48)) fail("header checksum mismatch");
  if (uint32_t v = get_u32(b, 8); v != kCacheVersion) fail("format version ", v, " (this build reads ", kCacheVersion, ")");
  if (uint32_t k = get_u32(b, 12); k != kCachePayloadTokens) fail("payload kind ", k, " is not supported");
  if (get_u64(b, 16) != model_id_) fail("made for another model (identity mismatch)");
  uint64_t n_tokens = get_u64(b, 24), payload_bytes = get_u64(b, 32);
  if (n_tokens == 0 || n_tokens >= static_cast<uint64_t>(n_ctx_) || payload_bytes != n_tokens * 4)
    fail("bad sizes: ", n_tokens, " tokens, ", payload_bytes, " payload bytes (context ", n_ctx_, ")");
  if (b.size() != kCacheHeaderBytes + payload_bytes) fail("size ", b.size(), " does not match the header");
  if (checksum64(b.data() + kCacheHeaderBytes, payload_bytes) != get_u64(b, 40)) fail("payload checksum mismatch");
  std::vector<int32_t> tokens(n_tokens);
  for (uint64_t i = 0; i < n_tokens; ++i) {
    tokens[i] = static_cast<int32_t>(get_u32(b, kCacheHeaderBytes + 4 * i));
    if (tokens[i] < 0 || tokens[i] >= n_vocab_) fail("token id ", tokens[i], " outside the vocabulary");
  }
  return tokens;
}

void CacheStore::save(const std::vector<std::vector<int32_t>>& prefixes) const {
  fs::create_directories(dir_);
  std::set<std::string> keep;
  for (const auto& tokens : prefixes) {
    std::string name = file_name(tokens);
    if (!keep.insert(name).second) continue;
    fs::path path = fs::path(dir_) / name;
    if (fs::exists(path)) {  // written by an earlier save: rewritten only if it does not hold these tokens
      std::ifstream in(path, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), {});
      try {
        if (decode(bytes) == tokens) continue;
      } catch (const Error&) {
      }
    }
    write_atomically(path, encode(model_id_, tokens));
  }
  for (const auto& entry : fs::directory_iterator(dir_)) {
    std::string name = entry.path().filename().string();
    bool ours = entry.path().extension() == kExtension || name.find(std::string(kExtension) + ".tmp.") != std::string::npos;
    if (ours && !keep.count(name)) fs::remove(entry.path());
  }
}

std::vector<std::vector<int32_t>> CacheStore::load(std::vector<std::string>& warnings) const {
  std::vector<std::vector<int32_t>> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (entry.path().extension() != kExtension || !entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    try {
      out.push_back(decode(s.str()));
    } catch (const Error& e) {
      warnings.push_back(entry.path().string() + ": ignored: " + e.what());
    }
  }
  return out;
}

}  // namespace regolith::server
