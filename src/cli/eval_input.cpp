#include "cli/eval_input.h"

#include <unistd.h>

#include <cstdio>

#include "cli/token_list.h"
#include "core/error.h"
#include "core/text_file.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace regolith::cli {

std::vector<int32_t> read_eval_tokens(const std::string& tokens_file, const std::string& text_file, const GgufFile& model) {
  if (tokens_file.empty() == text_file.empty()) fail("give exactly one of --tokens FILE and --text FILE");
  if (!tokens_file.empty()) {
    std::string text = read_text_file(tokens_file);
    for (char& c : text)
      if (c == '\n' || c == '\r' || c == '\t') c = ' ';
    return parse_token_list(text);
  }
  const std::string text = read_text_file(text_file);
  if (text.empty()) fail(text_file, ": no tokens (the file is empty)");
  return Tokenizer::from_gguf(model).encode(text, {.parse_special = false});
}

void show_chunk_progress(const char* label, int64_t chunk, int64_t n_chunks, int64_t done, int64_t total, double seconds) {
  if (!isatty(2)) return;
  std::fprintf(stderr, "\r%s: chunk %lld/%lld, %lld/%lld tokens, %.0f tok/s   ", label, static_cast<long long>(chunk),
               static_cast<long long>(n_chunks), static_cast<long long>(done), static_cast<long long>(total),
               seconds > 0 ? done / seconds : 0.0);
  if (chunk == n_chunks) std::fprintf(stderr, "\n");
}

}  // namespace regolith::cli
