// GGUF v3 files: a strict reader over a memory map, and a streaming writer.
// The reader validates every count, length, type and offset before use, so a truncated or
// hostile file gives an Error naming the file and what is wrong, never a crash.
// Tensor shapes are in ggml `ne` order: ne[0] is the innermost (contiguous) dimension.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/ggml_type.h"
#include "core/mapped_file.h"
#include "gguf/gguf_value.h"

namespace regolith {

inline constexpr uint64_t kGgufDefaultAlignment = 32;

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;          // 1..4 dimensions, innermost first
  uint64_t offset = 0;              // relative to the start of the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;    // inside the mapped file

  int64_t n_elements() const;
  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(n_bytes)}; }
  std::string shape_string() const;  // "{2560, 248320}"
};

class GgufFile {
 public:
  static GgufFile open(const std::string& path);
  // Parses bytes the caller keeps alive (tests, fuzzing); `source` names them in errors.
  static GgufFile parse(std::span<const uint8_t> bytes, std::string source);

  const std::string& source() const { return source_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }

  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  const GgufValue& get(std::string_view key) const;  // throws naming the missing key

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // throws naming the missing tensor

 private:
  std::shared_ptr<MappedFile> map_;
  std::string source_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Writes a GGUF file in one pass: metadata and tensor infos first, then the tensors' bytes
// in the order they were declared, each padded to the alignment. Data may arrive in pieces,
// so a tensor larger than memory can be streamed. The file appears under its final name
// only after finish() (written as PATH.tmp, then renamed).
class GgufWriter {
 public:
  explicit GgufWriter(std::string path);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  void set(const std::string& key, GgufValue value);  // replaces an existing key in place
  void set_alignment(uint32_t alignment);             // also written as general.alignment
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne);

  void write_header();                                 // after all set/add_tensor calls
  void write_data(std::span<const uint8_t> bytes);    // the next bytes of the current tensor
  void finish();                                       // all tensors complete; renames

  const std::vector<GgufTensor>& tensors() const { return tensors_; }

 private:
  void put(const void* p, size_t n);
  void put_string(const std::string& s);
  void put_value(const GgufValue& v);
  void pad_to_alignment();

  std::string path_, tmp_path_;
  FILE* file_ = nullptr;
  uint64_t written_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  bool header_written_ = false;
  size_t current_tensor_ = 0;
  uint64_t current_written_ = 0;
};

}  // namespace regolith
