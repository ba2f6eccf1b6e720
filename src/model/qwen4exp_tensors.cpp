#include "model/qwen4exp_tensors.h"

#include "core/error.h"

namespace regolith {

std::string_view tensor_class_name(TensorClass c) {
  switch (c) {
    case TensorClass::TokenEmbedding: return "token_embedding";
    case TensorClass::Output: return "output";
    case TensorClass::NormOffset: return "norm";
    case TensorClass::NormPlain: return "norm_plain";
    case TensorClass::HyperConnection: return "hyper_connection";
    case TensorClass::AttentionProj: return "attention";
    case TensorClass::IndexerProj: return "indexer";
    case TensorClass::GdnProj: return "gdn";
    case TensorClass::GdnDecay: return "gdn_decay";
    case TensorClass::GdnDtBias: return "gdn_dt_bias";
    case TensorClass::Conv: return "conv";
    case TensorClass::Router: return "router";
    case TensorClass::SharedExpertGate: return "shared_expert_gate";
    case TensorClass::ExpertGateUp: return "expert_gate_up";
    case TensorClass::ExpertDown: return "expert_down";
    case TensorClass::SharedExpert: return "shared_expert";
    case TensorClass::PleProj: return "ple";
    case TensorClass::NgramTable: return "ngram_table";
    case TensorClass::MtpProj: return "mtp";
  }
  return "?";
}

GgmlType storage_type(const TensorSpec& spec, GgmlType requested) {
  bool is_float = requested == GgmlType::F32 || requested == GgmlType::F16 || requested == GgmlType::BF16;
  if (spec.ne.size() == 1 || spec.cls == TensorClass::Conv) return GgmlType::F32;
  if (spec.cls == TensorClass::Router && !is_float) return GgmlType::F32;
  if (spec.ne[0] % traits(requested).block_size != 0) return GgmlType::F32;
  return requested;
}

namespace {

void add_hc(std::vector<TensorSpec>& out, const std::string& prefix, const Qwen4ExpHparams& hp, bool inject) {
  out.push_back({prefix + "_norm.weight", {hp.hc_dim()}, TensorClass::NormOffset});
  out.push_back({prefix + "_down.weight", {hp.hc_dim(), hp.hc_low_rank}, TensorClass::HyperConnection});
  out.push_back({prefix + "_up.weight", {hp.hc_low_rank, hp.hc_dim()}, TensorClass::HyperConnection});
  if (inject) out.push_back({prefix + "_inject.weight", {hp.hc_dim(), hp.hc_count}, TensorClass::HyperConnection});
}

void add_qsa(std::vector<TensorSpec>& out, const std::string& b, const Qwen4ExpHparams& hp) {
  int64_t H = hp.n_embd;
  out.push_back({b + "attn_q.weight", {H, 2 * hp.n_head * hp.head_dim}, TensorClass::AttentionProj});
  out.push_back({b + "attn_k.weight", {H, hp.n_head_kv * hp.head_dim}, TensorClass::AttentionProj});
  out.push_back({b + "attn_v.weight", {H, hp.n_head_kv * hp.head_dim}, TensorClass::AttentionProj});
  out.push_back({b + "attn_output.weight", {hp.n_head * hp.head_dim, H}, TensorClass::AttentionProj});
  out.push_back({b + "attn_q_norm.weight", {hp.head_dim}, TensorClass::NormOffset});
  out.push_back({b + "attn_k_norm.weight", {hp.head_dim}, TensorClass::NormOffset});
  out.push_back({b + "indexer.q_proj.weight", {H, hp.indexer_n_head * hp.indexer_head_dim}, TensorClass::IndexerProj});
  out.push_back({b + "indexer.k_proj.weight", {H, hp.indexer_head_dim}, TensorClass::IndexerProj});
  out.push_back({b + "indexer.q_norm.weight", {hp.indexer_head_dim}, TensorClass::NormOffset});
  out.push_back({b + "indexer.k_norm.weight", {hp.indexer_head_dim}, TensorClass::NormOffset});
}

void add_gdn(std::vector<TensorSpec>& out, const std::string& b, const Qwen4ExpHparams& hp) {
  int64_t H = hp.n_embd;
  out.push_back({b + "attn_qkv.weight", {H, hp.ssm_conv_dim()}, TensorClass::GdnProj});
  out.push_back({b + "attn_gate.weight", {H, hp.ssm_value_dim()}, TensorClass::GdnProj});
  out.push_back({b + "ssm_alpha.weight", {H, hp.ssm_n_v_heads}, TensorClass::GdnProj});
  out.push_back({b + "ssm_beta.weight", {H, hp.ssm_n_v_heads}, TensorClass::GdnProj});
  out.push_back({b + "ssm_a", {hp.ssm_n_v_heads}, TensorClass::GdnDecay});
  out.push_back({b + "ssm_dt.bias", {hp.ssm_n_v_heads}, TensorClass::GdnDtBias});
  out.push_back({b + "ssm_conv1d.weight", {hp.ssm_conv_kernel, hp.ssm_conv_dim()}, TensorClass::Conv});
  out.push_back({b + "ssm_norm.weight", {hp.ssm_v_head_dim}, TensorClass::NormPlain});
  out.push_back({b + "ssm_out.weight", {hp.ssm_value_dim(), H}, TensorClass::GdnProj});
}

void add_moe(std::vector<TensorSpec>& out, const std::string& b, const Qwen4ExpHparams& hp) {
  int64_t H = hp.n_embd;
  out.push_back({b + "ffn_gate_inp.weight", {H, hp.n_expert}, TensorClass::Router});
  out.push_back({b + "ffn_gate_exps.weight", {H, hp.n_ff_exp, hp.n_expert}, TensorClass::ExpertGateUp});
  out.push_back({b + "ffn_up_exps.weight", {H, hp.n_ff_exp, hp.n_expert}, TensorClass::ExpertGateUp});
  out.push_back({b + "ffn_down_exps.weight", {hp.n_ff_exp, H, hp.n_expert}, TensorClass::ExpertDown});
  out.push_back({b + "ffn_gate_inp_shexp.weight", {H}, TensorClass::SharedExpertGate});
  out.push_back({b + "ffn_gate_shexp.weight", {H, hp.n_ff_shexp}, TensorClass::SharedExpert});
  out.push_back({b + "ffn_up_shexp.weight", {H, hp.n_ff_shexp}, TensorClass::SharedExpert});
  out.push_back({b + "ffn_down_shexp.weight", {hp.n_ff_shexp, H}, TensorClass::SharedExpert});
}

void add_ple(std::vector<TensorSpec>& out, const std::string& b, const Qwen4ExpHparams& hp) {
  int64_t H = hp.n_embd;
  out.push_back({b + "ple_key.weight", {H, hp.hc_dim()}, TensorClass::PleProj});
  out.push_back({b + "ple_value.weight", {H, H}, TensorClass::PleProj});
  out.push_back({b + "ple_norm_key.weight", {hp.hc_dim()}, TensorClass::NormOffset});
  out.push_back({b + "ple_norm_query.weight", {hp.hc_dim()}, TensorClass::NormOffset});
  out.push_back({b + "ple_norm_conv.weight", {hp.hc_dim()}, TensorClass::NormOffset});
  out.push_back({b + "ple_conv1d.weight", {hp.ple_conv_kernel, hp.hc_dim()}, TensorClass::Conv});
}

}  // namespace

std::vector<TensorSpec> qwen4exp_tensor_specs(const Qwen4ExpHparams& hp, int64_t ple_table_rows) {
  std::vector<TensorSpec> out;
  int64_t H = hp.n_embd;
  out.push_back({"token_embd.weight", {H, hp.n_vocab}, TensorClass::TokenEmbedding});
  if (!hp.ple_layers.empty())
    out.push_back({"per_layer_token_embd.weight", {hp.ple_row_dim, ple_table_rows}, TensorClass::NgramTable});
  for (int64_t il = 0; il < hp.n_layer_total(); ++il) {
    std::string b = cat("blk.", il, ".");
    add_hc(out, b + "hc_attn", hp, true);
    add_hc(out, b + "hc_ffn", hp, true);
    if (il < hp.n_layer && hp.is_recurrent[il])
      add_gdn(out, b, hp);
    else
      add_qsa(out, b, hp);
    if (hp.is_ple_layer(il)) add_ple(out, b, hp);
    add_moe(out, b, hp);
    if (il >= hp.n_layer) {  // the MTP block's own head
      out.push_back({b + "nextn.enorm.weight", {H}, TensorClass::NormOffset});
      out.push_back({b + "nextn.hnorm.weight", {hp.hc_dim()}, TensorClass::NormOffset});
      out.push_back({b + "nextn.eh_proj.weight", {2 * H, H}, TensorClass::MtpProj});
      add_hc(out, b + "nextn.hc_head", hp, false);
    }
  }
  add_hc(out, "output_hc", hp, false);
  if (!hp.output_tied) out.push_back({"output.weight", {H, hp.n_vocab}, TensorClass::Output});
  return out;
}

}  // namespace regolith
