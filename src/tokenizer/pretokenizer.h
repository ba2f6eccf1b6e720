// The pre-tokenizer: splits text into pieces that BPE encodes independently, with the regex
// of the GGUF's `tokenizer.ggml.pre` type. Matching is Unicode-aware (PCRE2 with UTF and UCP,
// JIT-compiled); text between matches becomes pieces too (Hugging Face's "Isolated" split), so
// every byte of the input lands in exactly one piece, invalid UTF-8 included.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace regolith {

enum class PreType {
  qwen2,   // Qwen2 / Qwen3 / Qwen3-Next
  qwen35,  // Qwen3.5 / Qwen3.8-Flash-Next: marks (\p{M}) join letters
};

struct PreTypeInfo {
  PreType type;
  const char* gguf_name;  // `tokenizer.ggml.pre`
  const char* hf_regex;   // as written in tokenizer.json's Split pre-tokenizer
  bool nfc;               // the tokenizer.json normaliser is NFC
};

const PreTypeInfo& pre_type_info(PreType type);
// The type with this GGUF name, or the type whose Hugging Face regex is exactly `hf_regex`;
// nullptr when none is known.
const PreTypeInfo* find_pre_type_by_name(std::string_view gguf_name);
const PreTypeInfo* find_pre_type_by_hf_regex(std::string_view hf_regex);

class PreTokenizer {
 public:
  explicit PreTokenizer(PreType type);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  PreType type() const { return type_; }

  // Calls emit(piece) for consecutive pieces covering all of text. Thread-safe.
  void split(std::string_view text, const std::function<void(std::string_view)>& emit) const;

 private:
  struct Compiled;
  PreType type_;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace regolith
