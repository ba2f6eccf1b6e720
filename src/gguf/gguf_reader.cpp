// GGUF reader: parses the header, metadata and tensor infos with explicit bounds checks.

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "gguf/gguf.h"

namespace regolith {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kMaxDims = 4;              // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 4;

// A bounds-checked little-endian cursor over the file's bytes.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> bytes, const std::string& source) : bytes_(bytes), source_(source) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  template <typename... Args>
  [[noreturn]] void error(const Args&... args) const {
    fail(source_, ": ", args..., " (at byte ", pos_, " of ", bytes_.size(), ")");
  }

  template <typename T>
  T read(const char* what) {
    if (remaining() < sizeof(T)) error("truncated file: cannot read ", what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    uint64_t n = read<uint64_t>(what);
    if (n > remaining()) error("truncated file: ", what, " claims ", n, " bytes");
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  const std::string& source_;
  uint64_t pos_ = 0;
};

// Smallest encoded size of one value of a type, used to reject absurd array counts early.
uint64_t min_encoded_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 12;
  }
  return 1;
}

GgufType read_type(Cursor& c, const std::string& key) {
  uint32_t t = c.read<uint32_t>("value type");
  if (t > static_cast<uint32_t>(GgufType::FLOAT64)) c.error("metadata '", key, "': unknown value type ", t);
  return static_cast<GgufType>(t);
}

GgufValue read_value(Cursor& c, GgufType type, const std::string& key, int depth) {
  switch (type) {
    case GgufType::UINT8: return c.read<uint8_t>("u8");
    case GgufType::INT8: return c.read<int8_t>("i8");
    case GgufType::UINT16: return c.read<uint16_t>("u16");
    case GgufType::INT16: return c.read<int16_t>("i16");
    case GgufType::UINT32: return c.read<uint32_t>("u32");
    case GgufType::INT32: return c.read<int32_t>("i32");
    case GgufType::FLOAT32: return c.read<float>("f32");
    case GgufType::UINT64: return c.read<uint64_t>("u64");
    case GgufType::INT64: return c.read<int64_t>("i64");
    case GgufType::FLOAT64: return c.read<double>("f64");
    case GgufType::BOOL: {
      uint8_t b = c.read<uint8_t>("bool");
      if (b > 1) c.error("metadata '", key, "': bool value ", int(b), " is neither 0 nor 1");
      return b != 0;
    }
    case GgufType::STRING: return c.read_string("string");
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth) c.error("metadata '", key, "': arrays nested too deeply");
      GgufArray a;
      a.element_type = read_type(c, key);
      uint64_t n = c.read<uint64_t>("array length");
      if (n > c.remaining() / min_encoded_size(a.element_type))
        c.error("metadata '", key, "': array of ", n, " items does not fit in the file");
      a.items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) a.items.push_back(read_value(c, a.element_type, key, depth + 1));
      return GgufValue(std::move(a));
    }
  }
  c.error("metadata '", key, "': unknown value type");
}

}  // namespace

int64_t GgufTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::string GgufTensor::shape_string() const {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

GgufFile GgufFile::open(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  GgufFile f = parse(map->bytes(), path);
  f.map_ = std::move(map);
  return f;
}

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, std::string source) {
  GgufFile f;
  f.source_ = std::move(source);
  f.file_size_ = bytes.size();
  Cursor c(bytes, f.source_);

  if (c.read<uint32_t>("magic") != kGgufMagic) c.error("not a GGUF file (bad magic)");
  f.version_ = c.read<uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3)
    c.error("unsupported GGUF version ", f.version_, " (this reader knows versions 2 and 3)");
  uint64_t n_tensors = c.read<uint64_t>("tensor count");
  uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_kv > c.remaining() / 13) c.error("metadata count ", n_kv, " does not fit in the file");
  if (n_tensors > c.remaining() / 24) c.error("tensor count ", n_tensors, " does not fit in the file");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key");
    if (key.empty()) c.error("metadata key ", i, " is empty");
    if (f.metadata_index_.count(key)) c.error("duplicate metadata key '", key, "'");
    GgufType type = read_type(c, key);
    GgufValue value = read_value(c, type, key, 0);
    f.metadata_index_.emplace(key, f.metadata_.size());
    f.metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const GgufValue* a = f.find("general.alignment")) {
    if (a->type() != GgufType::UINT32) c.error("general.alignment must be a u32");
    uint64_t align = a->as_uint();
    if (align == 0 || (align & (align - 1)) != 0) c.error("general.alignment ", align, " is not a power of two");
    f.alignment_ = align;
  }

  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    t.name = c.read_string("tensor name");
    if (t.name.empty()) c.error("tensor ", i, " has an empty name");
    if (f.tensor_index_.count(t.name)) c.error("duplicate tensor name '", t.name, "'");
    uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims) c.error("tensor '", t.name, "': ", n_dims, " dimensions (1..4 allowed)");
    uint64_t n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = c.read<uint64_t>("tensor dimension");
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / n_elements)
        c.error("tensor '", t.name, "': dimension ", d, " = ", ne, " is zero or overflows");
      n_elements *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    uint32_t type_id = c.read<uint32_t>("tensor type");
    auto traits = ggml_type_traits(type_id);
    if (!traits) c.error("tensor '", t.name, "': unknown ggml type id ", type_id);
    t.type = static_cast<GgmlType>(type_id);
    if (t.ne[0] % traits->block_size != 0)
      c.error("tensor '", t.name, "': row length ", t.ne[0], " is not a multiple of the ", traits->name,
              " block size ", traits->block_size);
    uint64_t n_blocks = n_elements / traits->block_size;
    if (n_blocks > bytes.size() / traits->block_bytes)
      c.error("tensor '", t.name, "': ", n_elements, " values of ", traits->name, " cannot fit in the file");
    t.n_bytes = n_blocks * traits->block_bytes;
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % f.alignment_ != 0)
      c.error("tensor '", t.name, "': offset ", t.offset, " is not a multiple of the alignment ", f.alignment_);
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  uint64_t data_offset = (c.pos() + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  if (data_offset > bytes.size() && !f.tensors_.empty())
    c.error("truncated file: the tensor data section is missing");
  f.data_offset_ = data_offset;
  uint64_t data_size = bytes.size() > data_offset ? bytes.size() - data_offset : 0;

  std::vector<const GgufTensor*> by_offset;
  for (GgufTensor& t : f.tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      fail(f.source_, ": tensor '", t.name, "' (", t.n_bytes, " bytes at data offset ", t.offset,
           ") extends past the end of the file (", data_size, " data bytes): truncated or corrupt");
    t.data = bytes.data() + data_offset + t.offset;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i - 1]->offset + by_offset[i - 1]->n_bytes > by_offset[i]->offset)
      fail(f.source_, ": tensors '", by_offset[i - 1]->name, "' and '", by_offset[i]->name, "' overlap");
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const GgufValue& GgufFile::get(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) fail(source_, ": missing metadata key '", key, "'");
  return *v;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t) fail(source_, ": missing tensor '", name, "'");
  return *t;
}

}  // namespace regolith
