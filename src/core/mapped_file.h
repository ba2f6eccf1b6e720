// A read-only memory map of a whole file. Tensor data is read through it in place, so
// opening a 100 GB model costs address space, not memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace regolith {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws Error naming the path
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace regolith
