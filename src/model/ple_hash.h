// Hash constants of the PLE n-gram table (model-spec §4.8.1), recomputed from the config the
// way transformers' Qwen4ExpTextNGramEmbedding builds them, so a GGUF's stored arrays can be
// checked and a random model can be written without a checkpoint.
#pragma once

#include <cstdint>
#include <vector>

namespace regolith {

struct PleHashConstants {
  std::vector<uint64_t> multipliers;   // one per n-gram position (ngram_size values)
  std::vector<uint64_t> head_vocab;    // rows per hash head: successive primes above base - 1
  std::vector<uint64_t> head_offsets;  // first row of each head
  uint64_t n_rows = 0;                 // table rows, padded to a multiple of `pad_to`
};

struct PleHashConfig {
  uint64_t seed = 1234;
  uint64_t ple_layer_index = 0;        // position in ple_layer_ids, not the layer number
  uint64_t vocab_size = 0;             // token vocabulary (bounds the multipliers)
  uint64_t ngram_size = 3;
  uint64_t heads_per_ngram = 8;
  uint64_t ngram_vocab_size_base = 20000000;
  uint64_t pad_to = 128;               // make_ngram_vocab_size_divisible_by
};

PleHashConstants ple_hash_constants(const PleHashConfig& config);

uint64_t splitmix64(uint64_t v);
bool is_prime(uint64_t n);

// The 2*(ngram_size-1)... row ids of one token (ctx0 = the token, ctx1/ctx2 = its predecessors
// after the EOS cut), head-major, as in model-spec §4.8.3.
void ple_row_ids(const PleHashConstants& c, uint64_t heads_per_ngram, const uint64_t* ctx,
                 uint64_t* rows_out);

}  // namespace regolith
