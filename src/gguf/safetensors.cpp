#include "gguf/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"

namespace regolith {
namespace {

using nlohmann::json;

struct DtypeName {
  std::string_view name;
  StDtype dtype;
  size_t size;
};
constexpr DtypeName kDtypes[] = {
    {"F64", StDtype::F64, 8}, {"F32", StDtype::F32, 4}, {"F16", StDtype::F16, 2},
    {"BF16", StDtype::BF16, 2}, {"I64", StDtype::I64, 8}, {"I32", StDtype::I32, 4},
    {"I16", StDtype::I16, 2}, {"I8", StDtype::I8, 1}, {"U8", StDtype::U8, 1},
    {"BOOL", StDtype::BOOL, 1},
};

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit is 100 MB

}  // namespace

std::string_view st_dtype_name(StDtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.name;
  return "?";
}

size_t st_dtype_size(StDtype dtype) {
  for (const auto& d : kDtypes)
    if (d.dtype == dtype) return d.size;
  return 0;
}

int64_t StTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string StTensor::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void StTensor::to_f32(int64_t first, int64_t count, float* out) const {
  if (first < 0 || count < 0 || first + count > n_elements())
    fail(name, ": elements [", first, ", ", first + count, ") outside its ", n_elements());
  for (int64_t k = 0; k < count; ++k) {
    size_t i = static_cast<size_t>(first + k);
    switch (dtype) {
      case StDtype::F32: { float v; std::memcpy(&v, data + 4 * i, 4); out[k] = v; break; }
      case StDtype::F64: { double v; std::memcpy(&v, data + 8 * i, 8); out[k] = static_cast<float>(v); break; }
      case StDtype::F16: { uint16_t v; std::memcpy(&v, data + 2 * i, 2); out[k] = f16_to_f32(v); break; }
      case StDtype::BF16: { uint16_t v; std::memcpy(&v, data + 2 * i, 2); out[k] = bf16_to_f32(v); break; }
      default: fail(name, ": dtype ", st_dtype_name(dtype), " is not floating point");
    }
  }
}

std::vector<float> StTensor::to_f32() const {
  std::vector<float> out(static_cast<size_t>(n_elements()));
  to_f32(0, n_elements(), out.data());
  return out;
}

std::vector<int64_t> StTensor::to_i64() const {
  size_t n = static_cast<size_t>(n_elements());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case StDtype::I64: std::memcpy(&out[i], data + 8 * i, 8); break;
      case StDtype::I32: { int32_t v; std::memcpy(&v, data + 4 * i, 4); out[i] = v; break; }
      case StDtype::I16: { int16_t v; std::memcpy(&v, data + 2 * i, 2); out[i] = v; break; }
      case StDtype::I8: out[i] = static_cast<int8_t>(data[i]); break;
      case StDtype::U8: case StDtype::BOOL: out[i] = data[i]; break;
      default: fail(name, ": dtype ", st_dtype_name(dtype), " is not an integer type");
    }
  }
  return out;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  SafetensorsFile f = parse(map->bytes(), path);
  f.map_ = std::move(map);
  return f;
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes, std::string source) {
  if (bytes.size() < 8) fail(source, ": truncated safetensors file (", bytes.size(), " bytes)");
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > kMaxHeaderBytes || header_len > bytes.size() - 8)
    fail(source, ": safetensors header length ", header_len, " exceeds the file (", bytes.size(), " bytes)");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_len));
  } catch (const json::exception& e) {
    fail(source, ": safetensors header is not valid JSON: ", e.what());
  }
  if (!header.is_object()) fail(source, ": safetensors header is not a JSON object");

  const uint8_t* data = bytes.data() + 8 + header_len;
  uint64_t data_size = bytes.size() - 8 - header_len;
  SafetensorsFile f;
  for (const auto& item : header.items()) {
    const std::string& name = item.key();  // not a structured binding: clang 14 cannot capture those
    const json& info = item.value();
    if (name == "__metadata__") {
      if (!info.is_object()) fail(source, ": __metadata__ is not an object");
      for (const auto& [k, v] : info.items())
        if (v.is_string()) f.metadata_[k] = v.get<std::string>();
      continue;
    }
    auto bad = [&](const std::string& why) { fail(source, ": tensor '", name, "': ", why); };
    if (!info.is_object()) bad("entry is not an object");
    if (!info.contains("dtype") || !info["dtype"].is_string()) bad("missing dtype");
    if (!info.contains("shape") || !info["shape"].is_array()) bad("missing shape");
    if (!info.contains("data_offsets") || !info["data_offsets"].is_array() || info["data_offsets"].size() != 2)
      bad("missing data_offsets");
    StTensor t;
    t.name = name;
    t.file = source;
    std::string dtype = info["dtype"].get<std::string>();
    size_t elem_size = 0;
    for (const auto& d : kDtypes)
      if (d.name == dtype) t.dtype = d.dtype, elem_size = d.size;
    if (elem_size == 0) bad("unsupported dtype " + dtype);
    uint64_t n = 1;
    for (const json& d : info["shape"]) {
      if (!d.is_number_unsigned()) bad("shape entries must be non-negative integers");
      uint64_t v = d.get<uint64_t>();
      if (v != 0 && n > std::numeric_limits<uint64_t>::max() / elem_size / v) bad("shape overflows");
      n *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const json& off = info["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) bad("data_offsets must be non-negative integers");
    uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
    if (begin > end || end > data_size)
      bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside the " +
          std::to_string(data_size) + " data bytes: truncated or corrupt");
    if (end - begin != n * elem_size)
      bad("holds " + std::to_string(end - begin) + " bytes, its shape needs " + std::to_string(n * elem_size));
    t.data = data + begin;
    t.n_bytes = end - begin;
    f.tensors_.push_back(std::move(t));
  }
  std::vector<const StTensor*> sorted;
  for (const StTensor& t : f.tensors_) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->data < b->data; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i - 1]->data + sorted[i - 1]->n_bytes > sorted[i]->data)
      fail(source, ": tensors '", sorted[i - 1]->name, "' and '", sorted[i]->name, "' overlap");
  return f;
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint ck;
  ck.dir_ = dir;
  fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  json weight_map;
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    json index;
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      fail(index_path.string(), ": not valid JSON: ", e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(index_path.string(), ": no weight_map object");
    weight_map = index["weight_map"];
    std::set<std::string> unique;
    for (const auto& [name, file] : weight_map.items()) {
      if (!file.is_string()) fail(index_path.string(), ": weight_map entry '", name, "' is not a file name");
      std::string shard = file.get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        fail(index_path.string(), ": shard name '", shard, "' must be a plain file name in the checkpoint directory");
      if (unique.insert(shard).second) shard_names.push_back(shard);
    }
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    fail(dir, ": neither model.safetensors.index.json nor model.safetensors found");
  }
  ck.files_.reserve(shard_names.size());
  for (const std::string& shard : shard_names) ck.files_.push_back(SafetensorsFile::open((fs::path(dir) / shard).string()));
  for (const SafetensorsFile& f : ck.files_)
    for (const StTensor& t : f.tensors()) {
      if (ck.index_.count(t.name)) fail(dir, ": tensor '", t.name, "' appears in two shards");
      ck.index_.emplace(t.name, &t);
    }
  for (const auto& [name, file] : weight_map.items()) {
    const StTensor* t = ck.find(name);
    if (!t) fail(index_path.string(), ": tensor '", name, "' is listed but missing from ", file.get<std::string>());
    if (fs::path(t->file).filename() != file.get<std::string>())
      fail(index_path.string(), ": tensor '", name, "' is listed in ", file.get<std::string>(), " but found in ", t->file);
  }
  return ck;
}

const StTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const StTensor& SafetensorsCheckpoint::get(std::string_view name) const {
  const StTensor* t = find(name);
  if (!t) fail(dir_, ": missing tensor '", name, "'");
  return *t;
}

std::vector<const StTensor*> SafetensorsCheckpoint::tensors() const {
  std::vector<const StTensor*> out;
  for (const auto& [name, t] : index_) out.push_back(t);
  return out;
}

}  // namespace regolith
