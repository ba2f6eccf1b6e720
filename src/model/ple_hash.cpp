#include "model/ple_hash.h"

#include "core/error.h"

namespace regolith {

uint64_t splitmix64(uint64_t v) {
  v += 0x9E3779B97F4A7C15ull;
  v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
  v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
  return v ^ (v >> 31);
}

bool is_prime(uint64_t n) {
  if (n < 2) return false;
  if (n % 2 == 0) return n == 2;
  for (uint64_t d = 3; d * d <= n; d += 2)
    if (n % d == 0) return false;
  return true;
}

PleHashConstants ple_hash_constants(const PleHashConfig& config) {
  if (config.vocab_size == 0) fail("PLE hash: vocab size is zero");
  if (config.ngram_size < 2) fail("PLE hash: n-gram size ", config.ngram_size, " is below 2");
  if (config.ngram_vocab_size_base < 2) fail("PLE hash: n-gram vocab base is below 2");
  PleHashConstants c;
  // Multipliers are odd and below (2^63-1)/vocab, so token*m never overflows a signed 64-bit.
  uint64_t half = (0x7fffffffffffffffull / config.vocab_size) / 2;
  if (half == 0) fail("PLE hash: vocab size ", config.vocab_size, " is too large");
  for (uint64_t i = 0; i < config.ngram_size; ++i) {
    uint64_t state = config.seed + 10007ull * config.ple_layer_index + 0x9E3779B97F4A7C15ull * (i + 1);
    c.multipliers.push_back(2 * (splitmix64(state) % half) + 1);
  }
  uint64_t n_heads = (config.ngram_size - 1) * config.heads_per_ngram;
  // Heads take successive primes >= base; a later PLE layer continues the sequence.
  uint64_t candidate = config.ngram_vocab_size_base - 1;
  uint64_t skip = config.ple_layer_index * n_heads;
  uint64_t offset = 0;
  for (uint64_t h = 0; h < skip + n_heads; ++h) {
    do ++candidate;
    while (!is_prime(candidate));
    if (h < skip) continue;
    c.head_vocab.push_back(candidate);
    c.head_offsets.push_back(offset);
    offset += candidate;
  }
  c.n_rows = (offset + config.pad_to - 1) / config.pad_to * config.pad_to;
  return c;
}

void ple_row_ids(const PleHashConstants& c, uint64_t heads_per_ngram, const uint64_t* ctx, uint64_t* rows_out) {
  uint64_t mixed = ctx[0] * c.multipliers[0];
  size_t head = 0;
  for (size_t n = 1; n < c.multipliers.size(); ++n) {
    mixed ^= ctx[n] * c.multipliers[n];
    for (uint64_t h = 0; h < heads_per_ngram; ++h, ++head)
      rows_out[head] = mixed % c.head_vocab[head] + c.head_offsets[head];
  }
}

}  // namespace regolith
