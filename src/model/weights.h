// Binding a qwen4exp GGUF's tensors to typed weight views (model-spec §6.2). Every tensor of
// qwen4exp_tensor_specs() must be present with its exact shape and a type the backends can read;
// anything else is an Error naming the file and the tensor. The views point into the file's memory
// map, so binding costs no copies (but for the MTP projection's two halves, a few MB) and the
// n-gram table is paged in only where it is read.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "model/ple_hash.h"
#include "model/qwen4exp_hparams.h"

namespace regolith {

class GgufFile;

struct HcWeights {
  Weight norm, down, up, inject;  // inject absent in the final mixer
};

struct GdnWeights {
  Weight qkv, gate, alpha, beta, ssm_a, dt_bias, conv, norm, out;
};

struct QsaWeights {
  Weight q, k, v, out, q_norm, k_norm;
  Weight index_q, index_k, index_q_norm, index_k_norm;
};

struct MoeWeights {
  Weight router, gate_exps, up_exps, down_exps;
  Weight shared_gate_inp, shared_gate, shared_up, shared_down;
};

struct PleWeights {
  Weight key, value, norm_key, norm_query, norm_conv, conv;
};

struct LayerWeights {
  bool recurrent = true;  // GDN (true) or QSA (false)
  bool has_ple = false;
  HcWeights hc_attn, hc_ffn;
  GdnWeights gdn;
  QsaWeights qsa;
  MoeWeights moe;
  PleWeights ple;
};

// The MTP draft block (model-spec §4.10, GGUF blk.N with nextn.*): one QSA layer with its MoE, fed
// by a projection of the next token's embedding and the trunk's wide residual.
struct MtpWeights {
  Weight enorm, hnorm;  // offset norms of the embedding (H) and of the wide residual (W, one group)
  // nextn.eh_proj {2H, H} applied to [embedding | stream] is proj_embd·embedding + proj_stream·stream:
  // the file's tensor split on its input into its first and last H columns, so the embedding's
  // product is made once for the four streams.
  Weight proj_embd, proj_stream;
  HcWeights head_hc;  // the draft's final mixer (no inject)
  LayerWeights layer;
  std::shared_ptr<const std::vector<uint8_t>> split_bytes;  // proj_embd's rows, then proj_stream's
};

struct Qwen4ExpWeights {
  Weight token_embd;
  Weight ple_table;       // per_layer_token_embd, {row_dim, rows}
  Weight output;          // LM head; token_embd when the file has no output.weight (tied)
  bool tied_output = false;
  HcWeights output_hc;
  std::vector<LayerWeights> layers;  // trunk layers only
  std::optional<MtpWeights> mtp;     // when the file has a usable MTP block
  std::string mtp_unusable;          // why a file's MTP block cannot draft, when it cannot
};

// The weights of `file` for `hp`; throws Error naming the first missing, misshapen or unreadable tensor.
Qwen4ExpWeights bind_weights(const GgufFile& file, const Qwen4ExpHparams& hp);

// Recomputes the PLE hash constants the way transformers builds them and checks the file's
// arrays (model-spec §4.8.1): head vocabularies are the successive primes from the first one,
// offsets their prefix sums, and the table has that many rows padded to a multiple of 128. The
// multipliers depend on a seed that GGUF metadata does not record, so only their form is checked:
// odd and small enough that token·m stays below 2^63. Returns the constants to hash with.
PleHashConstants check_ple_hash(const Qwen4ExpHparams& hp, int64_t table_rows, const std::string& source);

// Bytes of a weight's stored data (0 when absent).
uint64_t weight_bytes(const Weight& w);
// Weight bytes one decode token reads: every dense tensor, the routed experts at their share
// n_expert_used / n_expert, and one n-gram table row per hash head. For bandwidth reports.
uint64_t decode_weight_bytes(const Qwen4ExpHparams& hp, const Qwen4ExpWeights& w);

}  // namespace regolith
