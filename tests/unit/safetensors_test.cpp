// Safetensors reader: single files, sharded checkpoints, and malformed input.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/half.h"
#include "gguf/safetensors.h"
#include "test_files.h"

using namespace regolith;

namespace {

std::vector<uint8_t> st_file(const std::string& header_json, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  out.reserve(8 + header_json.size() + data.size());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(header_json.size() >> (8 * i)));
  out.insert(out.end(), header_json.begin(), header_json.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> sample_data() {
  std::vector<uint8_t> d(20);
  float f[2] = {1.5f, -2.0f};
  uint16_t h[2] = {f32_to_f16(0.5f), f32_to_bf16(3.0f)};
  int64_t i = 23703573157769;
  std::memcpy(d.data(), f, 8);
  std::memcpy(d.data() + 8, h, 4);
  std::memcpy(d.data() + 12, &i, 8);
  return d;
}

const char* kSampleHeader =
    R"({"__metadata__":{"format":"pt"},)"
    R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("h":{"dtype":"F16","shape":[1],"data_offsets":[8,10]},)"
    R"("b":{"dtype":"BF16","shape":[1,1],"data_offsets":[10,12]},)"
    R"("i":{"dtype":"I64","shape":[1],"data_offsets":[12,20]}})";

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

void expect_error(const std::string& header, const std::vector<uint8_t>& data, const std::string& needle) {
  try {
    SafetensorsFile::parse(st_file(header, data), "x.safetensors");
    FAIL() << "expected error with '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Safetensors, ReadsDtypesAndMetadata) {
  auto bytes = st_file(kSampleHeader, sample_data());
  SafetensorsFile f = SafetensorsFile::parse(bytes, "x.safetensors");
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const StTensor& t : f.tensors()) {
    if (t.name == "w") {
      EXPECT_EQ(t.to_f32(), (std::vector<float>{1.5f, -2.0f}));
    }
    if (t.name == "h") {
      EXPECT_EQ(t.to_f32()[0], 0.5f);
    }
    if (t.name == "b") {
      EXPECT_EQ(t.to_f32()[0], 3.0f);
      EXPECT_EQ(t.shape_string(), "[1, 1]");
    }
    if (t.name == "i") {
      EXPECT_EQ(t.to_i64()[0], 23703573157769);
      EXPECT_THROW(t.to_f32(), Error);
    }
  }
}

TEST(Safetensors, RejectsMalformedFiles) {
  auto data = sample_data();
  expect_error("{not json", data, "not valid JSON");
  expect_error("[1,2]", data, "not a JSON object");
  expect_error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", data, "outside");
  expect_error(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data, "needs 12");
  expect_error(R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", data, "unsupported dtype Q4");
  expect_error(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data, "non-negative");
  expect_error(R"({"w":{"dtype":"F32","shape":[2]}})", data, "data_offsets");
  expect_error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", data, "overflow");
  expect_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
               data, "overlap");
  std::vector<uint8_t> short_file = {1, 2, 3};
  EXPECT_THROW(SafetensorsFile::parse(short_file, "s"), Error);
  std::vector<uint8_t> huge_header(16, 0xff);
  EXPECT_THROW(SafetensorsFile::parse(huge_header, "s"), Error);
}

TEST(Safetensors, EveryTruncationIsACleanError) {
  auto bytes = st_file(kSampleHeader, sample_data());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(SafetensorsFile::parse(cut, "cut"), Error) << n;
  }
}

TEST(Safetensors, ShardedCheckpointFollowsTheIndex) {
  TempDir dir;
  write_file(dir.path("a.safetensors"), st_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", sample_data()));
  write_file(dir.path("b.safetensors"), st_file(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", sample_data()));
  std::ofstream(dir.path("model.safetensors.index.json")) << R"({"weight_map":{"x":"a.safetensors","y":"b.safetensors"}})";
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(dir.path(""));
  EXPECT_EQ(ck.get("x").to_f32()[1], -2.0f);
  EXPECT_EQ(ck.get("y").to_f32()[0], 1.5f);
  EXPECT_EQ(ck.tensors().size(), 2u);
  EXPECT_THROW(ck.get("z"), Error);

  std::ofstream(dir.path("model.safetensors.index.json")) << R"({"weight_map":{"x":"b.safetensors"}})";
  EXPECT_THROW(SafetensorsCheckpoint::open(dir.path("")), Error);  // listed in the wrong shard
  std::ofstream(dir.path("model.safetensors.index.json")) << R"({"weight_map":{"x":"../a.safetensors"}})";
  EXPECT_THROW(SafetensorsCheckpoint::open(dir.path("")), Error);  // escapes the directory
  std::ofstream(dir.path("model.safetensors.index.json")) << R"({"weight_map":{"x":"missing.safetensors"}})";
  EXPECT_THROW(SafetensorsCheckpoint::open(dir.path("")), Error);
}
