// The input of the evaluation subcommands (`imatrix`, `kld`): a token file or a text file, and a
// per-chunk status line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace regolith {
class GgufFile;
}

namespace regolith::cli {

// Exactly one of `tokens_file` (ids separated by commas and/or whitespace) and `text_file` (read
// as bytes, tokenized with `model`'s tokenizer, special tokens not parsed). Throws when both or
// neither are given, on an unreadable file, or when there is no token.
std::vector<int32_t> read_eval_tokens(const std::string& tokens_file, const std::string& text_file, const GgufFile& model);

// "\rLABEL: chunk i/n, t/T tokens, x tok/s" on stderr when it is a terminal; a newline after the last.
void show_chunk_progress(const char* label, int64_t chunk, int64_t n_chunks, int64_t done, int64_t total, double seconds);

}  // namespace regolith::cli
