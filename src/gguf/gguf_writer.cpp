// GGUF writer: header and tensor infos up front, then tensor data streamed in declaration order.

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "gguf/gguf.h"

namespace regolith {
namespace {
constexpr uint32_t kGgufMagic = 0x46554747;
constexpr uint32_t kGgufVersion = 3;
}  // namespace

GgufWriter::GgufWriter(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {}

GgufWriter::~GgufWriter() {
  if (file_) {  // abandoned before finish(): leave nothing half-written behind
    std::fclose(file_);
    std::remove(tmp_path_.c_str());
  }
}

void GgufWriter::set(const std::string& key, GgufValue value) {
  if (header_written_) fail(path_, ": metadata '", key, "' set after the header was written");
  for (auto& [k, v] : metadata_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  metadata_.emplace_back(key, std::move(value));
}

void GgufWriter::set_alignment(uint32_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) fail("alignment ", alignment, " is not a power of two");
  alignment_ = alignment;
  set("general.alignment", alignment);
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne) {
  if (header_written_) fail(path_, ": tensor '", name, "' added after the header was written");
  if (tensor_index_.count(name)) fail(path_, ": duplicate tensor '", name, "'");
  if (ne.empty() || ne.size() > 4) fail(path_, ": tensor '", name, "' has ", ne.size(), " dimensions (1..4 allowed)");
  GgufTensor t;
  t.name = name;
  t.type = type;
  t.ne = std::move(ne);
  for (int64_t d : t.ne)
    if (d <= 0) fail(path_, ": tensor '", name, "' has a non-positive dimension");
  t.n_bytes = row_bytes(type, t.ne[0]) * static_cast<uint64_t>(t.n_elements() / t.ne[0]);
  uint64_t offset = 0;
  if (!tensors_.empty()) {
    const GgufTensor& last = tensors_.back();
    offset = (last.offset + last.n_bytes + alignment_ - 1) / alignment_ * alignment_;
  }
  t.offset = offset;
  tensor_index_.emplace(name, tensors_.size());
  tensors_.push_back(std::move(t));
}

void GgufWriter::put(const void* p, size_t n) {
  if (n && std::fwrite(p, 1, n, file_) != n) fail(tmp_path_, ": write failed: ", std::strerror(errno));
  written_ += n;
}

void GgufWriter::put_string(const std::string& s) {
  uint64_t n = s.size();
  put(&n, sizeof n);
  put(s.data(), s.size());
}

void GgufWriter::put_value(const GgufValue& v) {
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          put_string(x);
        } else if constexpr (std::is_same_v<T, GgufArray>) {
          uint32_t et = static_cast<uint32_t>(x.element_type);
          uint64_t n = x.items.size();
          put(&et, sizeof et);
          put(&n, sizeof n);
          for (const GgufValue& item : x.items) {
            if (item.type() != x.element_type)
              fail(path_, ": array of ", gguf_type_name(x.element_type), " holds a ", gguf_type_name(item.type()));
            put_value(item);
          }
        } else if constexpr (std::is_same_v<T, bool>) {
          uint8_t b = x ? 1 : 0;
          put(&b, 1);
        } else {
          put(&x, sizeof x);
        }
      },
      v.storage());
}

void GgufWriter::pad_to_alignment() {
  static const uint8_t zeros[256] = {};
  uint64_t target = (written_ + alignment_ - 1) / alignment_ * alignment_;
  while (written_ < target) put(zeros, std::min<uint64_t>(sizeof zeros, target - written_));
}

void GgufWriter::write_header() {
  if (header_written_) fail(path_, ": header written twice");
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (!file_) fail(tmp_path_, ": cannot create: ", std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 22);
  uint32_t magic = kGgufMagic, version = kGgufVersion;
  uint64_t n_tensors = tensors_.size(), n_kv = metadata_.size();
  put(&magic, 4);
  put(&version, 4);
  put(&n_tensors, 8);
  put(&n_kv, 8);
  for (const auto& [key, value] : metadata_) {
    put_string(key);
    uint32_t type = static_cast<uint32_t>(value.type());
    put(&type, 4);
    put_value(value);
  }
  for (const GgufTensor& t : tensors_) {
    put_string(t.name);
    uint32_t n_dims = static_cast<uint32_t>(t.ne.size());
    put(&n_dims, 4);
    for (int64_t d : t.ne) put(&d, 8);
    uint32_t type = static_cast<uint32_t>(t.type);
    put(&type, 4);
    put(&t.offset, 8);
  }
  pad_to_alignment();
  header_written_ = true;
}

void GgufWriter::write_data(std::span<const uint8_t> bytes) {
  if (!header_written_) fail(path_, ": tensor data written before the header");
  while (!bytes.empty()) {
    if (current_tensor_ >= tensors_.size()) fail(path_, ": more tensor data than declared tensors");
    const GgufTensor& t = tensors_[current_tensor_];
    uint64_t take = std::min<uint64_t>(bytes.size(), t.n_bytes - current_written_);
    put(bytes.data(), take);
    current_written_ += take;
    bytes = bytes.subspan(take);
    if (current_written_ == t.n_bytes) {
      pad_to_alignment();
      ++current_tensor_;
      current_written_ = 0;
    }
  }
}

void GgufWriter::finish() {
  if (!header_written_) write_header();
  if (current_tensor_ != tensors_.size())
    fail(path_, ": finished with tensor '", tensors_[current_tensor_].name, "' incomplete");
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    fail(tmp_path_, ": close failed: ", std::strerror(errno));
  }
  file_ = nullptr;
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    fail(path_, ": cannot rename from ", tmp_path_, ": ", std::strerror(errno));
}

}  // namespace regolith
