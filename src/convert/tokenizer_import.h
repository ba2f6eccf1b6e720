// Imports a Hugging Face byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json,
// optional chat_template.jinja and config.json) into GGUF `tokenizer.ggml.*` metadata, with the
// keys and conventions of llama.cpp's converter so the file also loads there.
#pragma once

#include <cstdint>
#include <string>

namespace regolith {

class GgufWriter;

// n_vocab: rows of the model's embedding (config.json vocab_size); ids the tokenizer does not
// define are written as unused "[PAD{id}]" tokens. 0 means "exactly the tokenizer's ids".
// Throws Error naming the file and field when the tokenizer is not one regolith can run.
void import_hf_tokenizer(const std::string& hf_dir, GgufWriter& writer, int64_t n_vocab);

}  // namespace regolith
