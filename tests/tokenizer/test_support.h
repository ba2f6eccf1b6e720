// Helpers shared by the tokenizer tests: test data paths, a tiny GGUF tokenizer builder, and the
// Qwen3 tokenizer converted to GGUF once per test run (files are read with core/text_file.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/text_file.h"
#include "tokenizer/tokenizer.h"

namespace regolith::test {

std::string data_path(const std::string& name);  // under tests/data/tokenizer
std::string temp_path(const std::string& name);  // a fresh path in the test's temp dir

// Directory holding Qwen3's tokenizer.json (+ config), or "" when it could not be fetched.
std::string qwen3_dir();
// Qwen3's tokenizer imported into a tokenizer-only GGUF with the given pre type (the
// Qwen3.5 regex is swapped in for "qwen35"); the result is cached per pre type.
const Tokenizer& qwen3_tokenizer(const std::string& pre = "qwen2");

struct TinyVocab {
  std::vector<std::string> tokens;  // byte-level text
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "qwen2";
};
// Every byte as a token, then `extra` tokens and merges.
TinyVocab byte_vocab();
Tokenizer make_tokenizer(const TinyVocab& vocab);

// Unpacks the three-characters-per-id encoding of expected_*.jsonl.
std::vector<int32_t> unpack_ids(const std::string& packed);

}  // namespace regolith::test
