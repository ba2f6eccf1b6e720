// Reads a Hugging Face qwen4_exp config.json (Qwen4ExpForConditionalGeneration with a
// text_config, or Qwen4ExpForCausalLM) into GGUF hyperparameters, checking every field the
// text model needs and rejecting variants the engine does not implement.
#pragma once

#include <cstdint>
#include <string>

#include "model/qwen4exp_hparams.h"

namespace regolith {

struct HfModelConfig {
  std::string architecture;          // architectures[0]
  Qwen4ExpHparams hparams;           // hash constants not yet filled
  int64_t ngram_vocab_size_base = 0;
  int64_t ngram_pad_to = 128;        // make_ngram_vocab_size_divisible_by
  int64_t split_ngram_parts = 0;
  int64_t ple_seed = 1234;
  int64_t mtp_layers = 0;
  int64_t eos_token_id = -1;
  bool tie_word_embeddings = false;
};

HfModelConfig read_hf_config(const std::string& hf_dir);

}  // namespace regolith
