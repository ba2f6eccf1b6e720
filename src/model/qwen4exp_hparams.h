// Hyperparameters of a qwen4exp model, as stored in GGUF metadata (model-spec §6.1).
// read_hparams() takes them from a GGUF file only, rejecting missing or inconsistent values
// with an error naming the key; write_hparams() is its inverse, used by the converter and
// by `regolith mkmodel`.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace regolith {

class GgufFile;
class GgufWriter;

inline constexpr const char* kQwen4ExpArch = "qwen4exp";

struct Qwen4ExpHparams {
  int64_t n_vocab = 0;
  int64_t n_embd = 0;             // H
  int64_t n_layer = 0;            // trunk layers (without the MTP block)
  int64_t n_layer_nextn = 0;      // trailing MTP blocks (0 or 1)
  int64_t n_ctx_train = 0;
  double rms_eps = 1e-6;

  // QSA attention layers
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_rot = 0;              // rotary dims (partial RoPE)
  double rope_theta = 1e7;
  std::array<int32_t, 4> rope_sections{};
  int64_t indexer_n_head = 0, indexer_head_dim = 0, indexer_top_k = 0;  // top_k in tokens
  std::vector<int32_t> compress_ratios;  // per block (trunk + MTP); 0 on GDN layers

  // Gated DeltaNet layers
  int64_t ssm_conv_kernel = 0;
  int64_t ssm_k_head_dim = 0;     // ssm.state_size: q/k head width
  int64_t ssm_v_head_dim = 0;     // ssm.inner_size / ssm.time_step_rank
  int64_t ssm_n_k_heads = 0;      // ssm.group_count
  int64_t ssm_n_v_heads = 0;      // ssm.time_step_rank
  std::vector<bool> is_recurrent; // per trunk layer: GDN (true) or QSA (false)

  // The LM head reuses token_embd (no output.weight), as tied checkpoints convert.
  bool output_tied = false;

  // MoE
  int64_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;

  // Hyper-connections
  int64_t hc_count = 0, hc_low_rank = 0;

  // PLE n-gram table (absent when ple_layers is empty)
  std::vector<int32_t> ple_layers;  // zero-based
  int64_t ple_ngram_size = 0, ple_heads_per_ngram = 0, ple_conv_kernel = 0;
  int64_t ple_row_dim = 0;          // embedding_length_per_layer_input
  int64_t ple_eos_token_id = -1, ple_image_token_id = -1;
  std::vector<uint64_t> ple_multipliers, ple_head_offsets, ple_head_vocab;

  int64_t n_layer_total() const { return n_layer + n_layer_nextn; }
  int64_t hc_dim() const { return hc_count * n_embd; }
  int64_t ple_n_heads() const { return (ple_ngram_size - 1) * ple_heads_per_ngram; }
  int64_t ssm_key_dim() const { return ssm_n_k_heads * ssm_k_head_dim; }
  int64_t ssm_value_dim() const { return ssm_n_v_heads * ssm_v_head_dim; }
  int64_t ssm_conv_dim() const { return 2 * ssm_key_dim() + ssm_value_dim(); }
  bool is_ple_layer(int64_t il) const;

  // Checks the relations between fields (divisibility, ranges); throws naming the field.
  void validate(const std::string& source) const;
};

Qwen4ExpHparams read_hparams(const GgufFile& file);
void write_hparams(GgufWriter& writer, const Qwen4ExpHparams& hp);

}  // namespace regolith
