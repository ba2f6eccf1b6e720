// GGUF writer/reader round trip and strict validation of malformed headers.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "test_files.h"

using namespace regolith;

namespace {

std::string write_sample(const std::string& path) {
  GgufWriter w(path);
  w.set("general.architecture", std::string("test"));
  w.set("u8", uint8_t{200});
  w.set("i8", int8_t{-5});
  w.set("u16", uint16_t{60000});
  w.set("i16", int16_t{-30000});
  w.set("u32", uint32_t{4000000000u});
  w.set("i32", int32_t{-2000000000});
  w.set("f32", 1.5f);
  w.set("bool", true);
  w.set("str", std::string("héllo"));
  w.set("u64", uint64_t{23703573157769ull});
  w.set("i64", int64_t{-7});
  w.set("f64", 2.25);
  w.set("arr_i32", GgufValue::array(GgufType::INT32, std::vector<int32_t>{1, -2, 3}));
  w.set("arr_str", GgufValue::array(GgufType::STRING, std::vector<std::string>{"a", "", "ccc"}));
  GgufArray nested{GgufType::ARRAY, {}};
  nested.items.push_back(GgufValue::array(GgufType::UINT8, std::vector<uint8_t>{1, 2}));
  nested.items.push_back(GgufValue::array(GgufType::UINT8, std::vector<uint8_t>{}));
  w.set("nested", GgufValue(nested));
  w.add_tensor("a", GgmlType::F32, {3, 2});
  w.add_tensor("b", GgmlType::Q8_0, {64});
  w.add_tensor("c", GgmlType::F16, {5});
  w.write_header();
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  w.write_data({reinterpret_cast<const uint8_t*>(a.data()), 24});
  std::vector<uint8_t> b(68, 7);
  w.write_data(std::span(b).subspan(0, 10));  // data may arrive in pieces
  w.write_data(std::span(b).subspan(10));
  std::vector<uint8_t> c(10, 9);
  w.write_data(c);
  w.finish();
  return path;
}

}  // namespace

TEST(Gguf, RoundTripsEveryValueTypeAndTensor) {
  TempDir dir;
  GgufFile f = GgufFile::open(write_sample(dir.path("s.gguf")));
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get("u8").as_int(), 200);
  EXPECT_EQ(f.get("i8").as_int(), -5);
  EXPECT_EQ(f.get("u16").as_int(), 60000);
  EXPECT_EQ(f.get("i16").as_int(), -30000);
  EXPECT_EQ(f.get("u32").as_uint(), 4000000000u);
  EXPECT_EQ(f.get("i32").as_int(), -2000000000);
  EXPECT_EQ(f.get("f32").as_double(), 1.5);
  EXPECT_TRUE(f.get("bool").as_bool());
  EXPECT_EQ(f.get("str").as_string(), "héllo");
  EXPECT_EQ(f.get("u64").as_uint(), 23703573157769ull);
  EXPECT_EQ(f.get("i64").as_int(), -7);
  EXPECT_EQ(f.get("f64").as_double(), 2.25);
  EXPECT_EQ(f.get("arr_i32").as_int_array(), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(f.get("arr_str").as_string_array(), (std::vector<std::string>{"a", "", "ccc"}));
  const GgufArray& nested = f.get("nested").as_array();
  ASSERT_EQ(nested.items.size(), 2u);
  EXPECT_EQ(nested.items[0].as_int_array(), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(nested.items[1].as_array().items.empty());

  const GgufTensor& a = f.tensor("a");
  EXPECT_EQ(a.ne, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(a.n_bytes, 24u);
  float a5;
  std::memcpy(&a5, a.data + 20, 4);
  EXPECT_EQ(a5, 6.0f);
  EXPECT_EQ(f.tensor("b").n_bytes, 68u);
  EXPECT_EQ(f.tensor("b").type, GgmlType::Q8_0);
  EXPECT_EQ(f.tensor("b").data[67], 7);
  EXPECT_EQ(f.tensor("c").data[9], 9);
  for (const GgufTensor& t : f.tensors()) EXPECT_EQ((t.data - f.tensors()[0].data) % 32, 0) << t.name;
}

TEST(Gguf, AccessorsNameTheKeyOnTypeMismatch) {
  TempDir dir;
  GgufFile f = GgufFile::open(write_sample(dir.path("s.gguf")));
  EXPECT_THROW(f.get("missing"), Error);
  try {
    f.get("str").as_int("my.key");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("my.key"), std::string::npos);
  }
  try {
    f.tensor("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos);
  }
}

TEST(Gguf, WriterRejectsInvalidTensors) {
  TempDir dir;
  GgufWriter w(dir.path("bad.gguf"));
  EXPECT_THROW(w.add_tensor("q", GgmlType::Q8_0, {33}), Error);   // not a whole block
  EXPECT_THROW(w.add_tensor("z", GgmlType::F32, {0}), Error);
  w.add_tensor("x", GgmlType::F32, {4});
  EXPECT_THROW(w.add_tensor("x", GgmlType::F32, {4}), Error);
  w.write_header();
  std::vector<uint8_t> too_much(20);
  EXPECT_THROW(w.write_data(too_much), Error);
}

TEST(Gguf, UnfinishedWriteLeavesNoFile) {
  TempDir dir;
  std::string path = dir.path("partial.gguf");
  {
    GgufWriter w(path);
    w.add_tensor("x", GgmlType::F32, {4});
    w.write_header();
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// Hand-built headers, each wrong in one way.
class GgufBytes {
 public:
  GgufBytes& u32(uint32_t v) { return raw(&v, 4); }
  GgufBytes& u64(uint64_t v) { return raw(&v, 8); }
  GgufBytes& str(const std::string& s) { u64(s.size()); return raw(s.data(), s.size()); }
  GgufBytes& raw(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
    return *this;
  }
  GgufBytes& zeros(size_t n) {
    bytes.resize(bytes.size() + n);
    return *this;
  }
  GgufBytes& pad(size_t align) {
    while (bytes.size() % align) bytes.push_back(0);
    return *this;
  }
  std::vector<uint8_t> bytes;
};

void expect_error(const std::vector<uint8_t>& bytes, const std::string& needle) {
  try {
    GgufFile::parse(bytes, "test.gguf");
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test.gguf"), std::string::npos) << e.what();
  }
}

GgufBytes header(uint64_t n_tensors, uint64_t n_kv) {
  GgufBytes b;
  b.u32(0x46554747).u32(3).u64(n_tensors).u64(n_kv);
  return b;
}

TEST(Gguf, RejectsMalformedHeaders) {
  expect_error(GgufBytes().u32(0x12345678).u32(3).u64(0).u64(0).bytes, "bad magic");
  expect_error(GgufBytes().u32(0x46554747).u32(1).u64(0).u64(0).bytes, "version 1");
  expect_error(header(0, 1ull << 60).bytes, "metadata count");
  expect_error(header(1ull << 60, 0).bytes, "tensor count");
  expect_error(header(0, 1).str("k").u32(99).bytes, "unknown value type 99");
  expect_error(header(0, 1).str("k").u32(8).u64(1000).bytes, "claims 1000 bytes");
  expect_error(header(0, 1).str("k").u32(9).u32(4).u64(1ull << 40).bytes, "does not fit");
  expect_error(header(0, 2).str("k").u32(4).u32(1).str("k").u32(4).u32(1).bytes, "duplicate metadata key 'k'");
  expect_error(header(0, 1).str("k").u32(7).raw("\x02", 1).bytes, "neither 0 nor 1");
  expect_error(header(0, 1).str("general.alignment").u32(4).u32(48).bytes, "not a power of two");
  expect_error(header(1, 0).str("t").u32(5).zeros(64).bytes, "5 dimensions");
  expect_error(header(1, 0).str("t").u32(2).u64(1ull << 62).u64(1ull << 62).zeros(64).bytes, "overflows");
  expect_error(header(1, 0).str("t").u32(1).u64(0).zeros(64).bytes, "zero");
  expect_error(header(1, 0).str("t").u32(1).u64(4).u32(4).zeros(64).bytes, "unknown ggml type id 4");
  expect_error(header(1, 0).str("t").u32(1).u64(33).u32(8).u64(0).zeros(64).bytes, "not a multiple");
  expect_error(header(1, 0).str("t").u32(1).u64(4).u32(0).u64(8).zeros(64).bytes, "alignment");
  expect_error(header(1, 0).str("t").u32(1).u64(4).u32(0).u64(0).pad(32).u64(0).bytes, "past the end");
  expect_error(header(2, 0).str("t").u32(1).u64(4).u32(0).u64(0).str("t").u32(1).u64(4).u32(0).u64(32).bytes,
               "duplicate tensor name 't'");
  GgufBytes overlap = header(2, 0).str("a").u32(1).u64(16).u32(0).u64(0).str("b").u32(1).u64(4).u32(0).u64(32);
  overlap.pad(32);
  overlap.bytes.resize(overlap.bytes.size() + 64);
  expect_error(overlap.bytes, "overlap");
}

TEST(Gguf, EveryTruncationIsACleanError) {
  TempDir dir;
  std::string path = write_sample(dir.path("s.gguf"));
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  GgufFile whole = GgufFile::parse(bytes, "whole.gguf");
  const GgufTensor& last = whole.tensors().back();
  size_t data_end = whole.data_offset() + last.offset + last.n_bytes;  // only padding follows
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
    if (n < data_end)
      EXPECT_THROW(GgufFile::parse(cut, "cut.gguf"), Error) << "prefix of " << n << " bytes";
    else
      EXPECT_NO_THROW(GgufFile::parse(cut, "cut.gguf")) << "prefix of " << n << " bytes";
  }
}
