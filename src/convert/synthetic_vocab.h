// A stand-in tokenizer for models that ship none (random-weight models, tiny fixtures):
// GPT-2 byte-level tokens for the 256 bytes, merged pairs, ChatML specials at a chosen id and
// unused [PAD] tokens up to the vocabulary size. It lets llama.cpp and our own
// tokenizer load such a file; it is not a trained vocabulary.
#pragma once

#include <cstdint>

namespace regolith {

class GgufWriter;

struct SyntheticVocabOptions {
  int64_t n_vocab = 0;
  int64_t eos_id = 0;  // <|endoftext|>; <|im_start|> and <|im_end|> follow it
};

void write_synthetic_vocab(GgufWriter& writer, const SyntheticVocabOptions& options);

}  // namespace regolith
