// Mutation fuzzing of the GGUF and safetensors readers: thousands of corrupted variants of
// valid files (flipped bytes, extreme integers at every field position, truncations,
// insertions). Each must parse or give regolith::Error; never crash or read out of bounds
// (this suite also runs under AddressSanitizer and UBSan in CI).

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/safetensors.h"
#include "test_files.h"

using namespace regolith;

namespace {

std::vector<uint8_t> read_all(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  std::vector<uint8_t> out;
  uint8_t buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

std::vector<uint8_t> sample_gguf() {
  TempDir dir;
  GgufWriter w(dir.path("s.gguf"));
  w.set("general.architecture", std::string("qwen4exp"));
  w.set("qwen4exp.block_count", uint32_t{4});
  w.set("tokens", GgufValue::array(GgufType::STRING, std::vector<std::string>{"a", "bb", "ccc"}));
  w.set("mult", GgufValue::array(GgufType::UINT64, std::vector<uint64_t>{1, 2, 3}));
  w.set("eps", 1e-6f);
  w.set("flag", false);
  w.add_tensor("w", GgmlType::Q8_0, {32, 2});
  w.add_tensor("v", GgmlType::F32, {3});
  w.write_header();
  std::vector<uint8_t> data(68 + 12, 0x3c);
  w.write_data(data);
  w.finish();
  return read_all(dir.path("s.gguf"));
}

// Touches every byte a successful parse exposes, so a bad bounds check shows under ASan.
uint64_t touch(const GgufFile& f) {
  uint64_t sum = 0;
  for (const GgufTensor& t : f.tensors())
    for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
  for (const auto& [k, v] : f.metadata()) sum += k.size() + v.describe().size();
  return sum;
}

template <typename Parse>
void mutate_and_parse(const std::vector<uint8_t>& valid, uint32_t seed, int iterations, Parse parse) {
  std::mt19937 rng(seed);
  const uint64_t extremes[] = {0, 1, 0x7f, 0xff, 0xffff, 0xffffffffull, 0x7fffffffffffffffull, ~0ull, 1ull << 32, 1ull << 62};
  for (int it = 0; it < iterations; ++it) {
    std::vector<uint8_t> b = valid;
    int n_mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mutations && !b.empty(); ++m) {
      size_t pos = rng() % b.size();
      switch (rng() % 5) {
        case 0: b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: b[pos] = static_cast<uint8_t>(rng()); break;
        case 2: {
          uint64_t v = extremes[rng() % std::size(extremes)];
          size_t width = (rng() % 2) ? 8 : 4;
          if (pos + width <= b.size()) std::memcpy(&b[pos], &v, width);
          break;
        }
        case 3: b.resize(pos); break;
        case 4: b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), static_cast<uint8_t>(rng())); break;
      }
    }
    try {
      parse(b);
    } catch (const Error&) {
      // a clear error is the expected outcome for most mutations
    }
  }
}

}  // namespace

TEST(FormatFuzz, GgufMutationsNeverCrash) {
  std::vector<uint8_t> valid = sample_gguf();
  ASSERT_NO_THROW(touch(GgufFile::parse(valid, "valid")));
  mutate_and_parse(valid, 1234, 20000, [](const std::vector<uint8_t>& b) { touch(GgufFile::parse(b, "fuzz")); });
}

TEST(FormatFuzz, SafetensorsMutationsNeverCrash) {
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"I64","shape":[2],"data_offsets":[12,28]}})";
  std::vector<uint8_t> valid;
  valid.reserve(8 + header.size() + 28);
  for (int i = 0; i < 8; ++i) valid.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  valid.insert(valid.end(), header.begin(), header.end());
  valid.resize(valid.size() + 28, 0x41);
  auto parse = [](const std::vector<uint8_t>& b) {
    SafetensorsFile f = SafetensorsFile::parse(b, "fuzz");
    for (const StTensor& t : f.tensors()) {
      if (t.dtype == StDtype::I64) t.to_i64();
      else t.to_f32();
    }
  };
  ASSERT_NO_THROW(parse(valid));
  mutate_and_parse(valid, 99, 20000, parse);
}
