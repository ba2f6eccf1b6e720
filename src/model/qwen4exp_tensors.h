// The tensors a qwen4exp GGUF holds for given hyperparameters: names and ggml shapes
// (model-spec §6.2), each with a class that says what it is for. One table serves the
// converter (to check its output), `regolith mkmodel` (to write a random model), the engine
// (to bind and validate weights) and quantization recipes (to pick a type per class).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/ggml_type.h"
#include "model/qwen4exp_hparams.h"

namespace regolith {

enum class TensorClass {
  TokenEmbedding,   // token_embd
  Output,           // output (LM head)
  NormOffset,       // RMSNorm gamma stored as 1 + w
  NormPlain,        // ssm_norm: plain gamma
  HyperConnection,  // hc_*_down / up / inject, output_hc_down / up
  AttentionProj,    // attn_q/k/v/output
  IndexerProj,      // indexer.q_proj / k_proj
  GdnProj,          // attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out
  GdnDecay,         // ssm_a (= -exp(A_log))
  GdnDtBias,        // ssm_dt.bias
  Conv,             // ssm_conv1d, ple_conv1d
  Router,           // ffn_gate_inp
  SharedExpertGate, // ffn_gate_inp_shexp
  ExpertGateUp,     // ffn_gate_exps, ffn_up_exps
  ExpertDown,       // ffn_down_exps
  SharedExpert,     // ffn_{gate,up,down}_shexp
  PleProj,          // ple_key, ple_value
  NgramTable,       // per_layer_token_embd
  MtpProj,          // nextn.eh_proj
};

std::string_view tensor_class_name(TensorClass c);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order, innermost first
  TensorClass cls;
  int64_t fan_in() const { return ne[0]; }
};

// The type a tensor is stored as when `requested` is asked for the model's weights: vectors and
// convolutions stay F32, the router stays F32 under a quantized request (top-k selection is
// sensitive to it), and a row whose length the requested block size does not divide stays F32.
GgmlType storage_type(const TensorSpec& spec, GgmlType requested);

std::vector<TensorSpec> qwen4exp_tensor_specs(const Qwen4ExpHparams& hp, int64_t ple_table_rows);

}  // namespace regolith
