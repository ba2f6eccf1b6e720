// Streaming detokenizer: turns generated ids into text one token at a time and never emits part
// of a UTF-8 character. A character split across tokens (common for CJK and emoji in byte-level
// BPE) is held back until its last byte arrives. Output is always valid UTF-8: bytes that can
// never form a character become U+FFFD, as Hugging Face's lossy decode does.
#pragma once

#include <cstdint>
#include <string>

namespace regolith {

class Tokenizer;

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  // The text that became complete with this token (often empty while a character is pending).
  std::string push(int32_t id);
  // Ends the stream: whatever is still pending, with an unfinished character as U+FFFD.
  std::string finish();
  // Bytes held back, waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }
  void reset() { pending_.clear(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace regolith
