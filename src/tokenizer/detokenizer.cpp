// Streaming detokenizer (see detokenizer.h).

#include "tokenizer/detokenizer.h"

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace regolith {

std::string StreamingDetokenizer::push(int32_t id) {
  pending_.append(tokenizer_->token_bytes(id, skip_special_));
  size_t complete = utf8::complete_prefix_length(pending_);
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace regolith
