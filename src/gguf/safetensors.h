// Safetensors checkpoints: one file (8-byte header length, JSON header, raw data) or a sharded
// set described by model.safetensors.index.json. Read in place through memory maps.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mapped_file.h"

namespace regolith {

enum class StDtype { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL };

std::string_view st_dtype_name(StDtype dtype);
size_t st_dtype_size(StDtype dtype);

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::F32;
  std::vector<int64_t> shape;  // PyTorch order: shape[0] is the outermost dimension
  const uint8_t* data = nullptr;
  uint64_t n_bytes = 0;
  std::string file;            // the shard it lives in, for messages

  int64_t n_elements() const;
  std::span<const uint8_t> bytes() const { return {data, static_cast<size_t>(n_bytes)}; }
  std::string shape_string() const;  // "[10240, 2560]"
  // Converts elements to float (floating dtypes only); throws for integer dtypes.
  std::vector<float> to_f32() const;
  void to_f32(int64_t first, int64_t count, float* out) const;  // elements [first, first+count)
  // Integer dtypes only.
  std::vector<int64_t> to_i64() const;
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  static SafetensorsFile parse(std::span<const uint8_t> bytes, std::string source);

  const std::vector<StTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::shared_ptr<MappedFile> map_;
  std::vector<StTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint directory: model.safetensors.index.json with its shards, or one model.safetensors.
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open(const std::string& dir);

  const StTensor* find(std::string_view name) const;
  const StTensor& get(std::string_view name) const;  // throws naming the tensor
  // All tensors, in name order.
  std::vector<const StTensor*> tensors() const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, const StTensor*, std::less<>> index_;
};

}  // namespace regolith
