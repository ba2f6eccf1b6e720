#include "convert/hf_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace regolith {
namespace {

using nlohmann::json;

class ConfigReader {
 public:
  ConfigReader(const json& j, std::string source) : j_(j), source_(std::move(source)) {}

  const json& raw(const char* key) const {
    if (!j_.contains(key) || j_[key].is_null()) fail(source_, ": missing '", key, "'");
    return j_[key];
  }
  int64_t integer(const char* key) const {
    const json& v = raw(key);
    if (!v.is_number_integer()) fail(source_, ": '", key, "' must be an integer");
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t fallback) const { return has(key) ? integer(key) : fallback; }
  double number(const char* key) const {
    const json& v = raw(key);
    if (!v.is_number()) fail(source_, ": '", key, "' must be a number");
    return v.get<double>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!raw(key).is_boolean()) fail(source_, ": '", key, "' must be true or false");
    return raw(key).get<bool>();
  }
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }
  const std::string& source() const { return source_; }

 private:
  const json& j_;
  std::string source_;
};

// The first id of a scalar-or-list token id field (transformers takes eos_token_id[0]).
int64_t first_id(const json& v, const std::string& what) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
  fail(what, " must be an integer or a list of integers");
}

}  // namespace

HfModelConfig read_hf_config(const std::string& hf_dir) {
  std::string path = (std::filesystem::path(hf_dir) / "config.json").string();
  std::ifstream in(path);
  if (!in) fail(path, ": cannot open");
  json top;
  try {
    top = json::parse(in);
  } catch (const json::exception& e) {
    fail(path, ": not valid JSON: ", e.what());
  }
  if (!top.is_object()) fail(path, ": not a JSON object");

  HfModelConfig cfg;
  if (top.contains("architectures") && top["architectures"].is_array() && !top["architectures"].empty())
    cfg.architecture = top["architectures"][0].get<std::string>();
  if (cfg.architecture != "Qwen4ExpForConditionalGeneration" && cfg.architecture != "Qwen4ExpForCausalLM")
    fail(path, ": architecture '", cfg.architecture,
         "' is not Qwen4ExpForConditionalGeneration or Qwen4ExpForCausalLM");
  const json& text = top.contains("text_config") ? top["text_config"] : top;
  ConfigReader c(text, path + (top.contains("text_config") ? " (text_config)" : ""));

  Qwen4ExpHparams& hp = cfg.hparams;
  hp.n_vocab = c.integer("vocab_size");
  hp.n_embd = c.integer("hidden_size");
  hp.n_layer = c.integer("num_hidden_layers");
  hp.n_ctx_train = c.integer_or("max_position_embeddings", 262144);
  hp.rms_eps = c.number("rms_norm_eps");
  hp.n_head = c.integer("num_attention_heads");
  hp.n_head_kv = c.integer("num_key_value_heads");
  hp.head_dim = c.integer_or("head_dim", hp.n_embd / hp.n_head);
  const json rope = c.has("rope_parameters") ? c.raw("rope_parameters")
                    : c.has("rope_scaling") ? c.raw("rope_scaling") : json::object();
  double partial = rope.contains("partial_rotary_factor") ? rope["partial_rotary_factor"].get<double>()
                   : c.has("partial_rotary_factor") ? c.number("partial_rotary_factor") : 1.0;
  hp.n_rot = static_cast<int64_t>(std::llround(hp.head_dim * partial));
  if (rope.contains("rope_type") && rope["rope_type"].is_string() && rope["rope_type"] != "default")
    fail(c.source(), ": rope_type '", rope["rope_type"].get<std::string>(), "' is not supported (only default)");
  hp.rope_theta = rope.contains("rope_theta") ? rope["rope_theta"].get<double>() : c.number("rope_theta");
  if (rope.contains("mrope_section")) {
    const json& s = rope["mrope_section"];
    if (!s.is_array() || s.size() > 4) fail(c.source(), ": mrope_section must be a list of up to 4 integers");
    for (size_t i = 0; i < s.size(); ++i) hp.rope_sections[i] = s[i].get<int32_t>();
  } else {
    hp.rope_sections = {static_cast<int32_t>(hp.n_rot / 2), 0, 0, 0};
  }

  hp.indexer_n_head = c.integer("indexer_n_heads");
  if (c.integer_or("indexer_kv_heads", 1) != 1) fail(c.source(), ": indexer_kv_heads must be 1");
  hp.indexer_head_dim = c.integer("indexer_head_dim");
  hp.indexer_top_k = c.integer("indexer_budget");
  int64_t ratio = c.integer("indexer_compress_ratio");

  if (c.has("layer_types")) {
    const json& types = c.raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != hp.n_layer)
      fail(c.source(), ": layer_types must list ", hp.n_layer, " layers");
    for (const json& t : types) {
      std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s == "linear_attention") {
        hp.is_recurrent.push_back(true);
      } else if (s == "full_attention" || s == "qwen_sparse_attention" || s == "deepseek_sparse_attention" ||
                 s == "hybrid_indexed") {
        hp.is_recurrent.push_back(false);
      } else {
        fail(c.source(), ": unknown layer type '", s, "'");
      }
    }
  } else {
    int64_t interval = c.integer("full_attention_interval");
    for (int64_t il = 0; il < hp.n_layer; ++il) hp.is_recurrent.push_back((il + 1) % interval != 0);
  }
  for (bool recurrent : hp.is_recurrent) hp.compress_ratios.push_back(recurrent ? 0 : static_cast<int32_t>(ratio));

  hp.ssm_conv_kernel = c.integer("linear_conv_kernel_dim");
  hp.ssm_k_head_dim = c.integer("linear_key_head_dim");
  hp.ssm_v_head_dim = c.integer("linear_value_head_dim");
  hp.ssm_n_k_heads = c.integer("linear_num_key_heads");
  hp.ssm_n_v_heads = c.integer("linear_num_value_heads");
  if (c.has("output_gate_type") && c.raw("output_gate_type") != "sigmoid")
    fail(c.source(), ": output_gate_type must be 'sigmoid' for qwen4exp");

  hp.n_expert = c.integer("num_experts");
  hp.n_expert_used = c.integer("num_experts_per_tok");
  hp.n_ff_exp = c.integer("moe_intermediate_size");
  hp.n_ff_shexp = c.integer("shared_expert_intermediate_size");
  if (!c.boolean_or("norm_topk_prob", true)) fail(c.source(), ": norm_topk_prob false is not supported");

  hp.hc_count = c.integer("hc_count");
  hp.hc_low_rank = c.integer("hc_lowrank");

  const json& eos = top.contains("eos_token_id") && !top["eos_token_id"].is_null() ? top["eos_token_id"] : c.raw("eos_token_id");
  int64_t eos_id = first_id(eos, path + ": eos_token_id");
  cfg.eos_token_id = eos_id;
  if (c.has("ple_layer_ids") && !c.raw("ple_layer_ids").empty()) {
    for (const json& l : c.raw("ple_layer_ids")) hp.ple_layers.push_back(l.get<int32_t>() - 1);  // one-indexed
    hp.ple_ngram_size = c.integer("ngram_size");
    hp.ple_heads_per_ngram = c.integer("heads_per_ngram");
    hp.ple_conv_kernel = c.integer("ple_conv_kernel_size");
    int64_t embed_dim = c.integer_or("ple_embed_dim", hp.n_embd);
    if (embed_dim != hp.n_embd) fail(c.source(), ": ple_embed_dim must equal hidden_size");
    hp.ple_row_dim = embed_dim / hp.ple_n_heads();
    hp.ple_eos_token_id = eos_id;
    if (top.contains("image_token_id") && top["image_token_id"].is_number_integer())
      hp.ple_image_token_id = top["image_token_id"].get<int64_t>();
    cfg.ngram_vocab_size_base = c.integer("ngram_vocab_size_base");
    cfg.ngram_pad_to = c.integer_or("make_ngram_vocab_size_divisible_by", 128);
    cfg.split_ngram_parts = c.integer_or("split_ngram_parts", 1);
    cfg.ple_seed = c.integer_or("seed", 1234);
  }
  cfg.mtp_layers = c.integer_or("mtp_num_hidden_layers", 0);
  cfg.tie_word_embeddings = top.value("tie_word_embeddings", text.value("tie_word_embeddings", false));
  hp.output_tied = cfg.tie_word_embeddings;
  return cfg;
}

}  // namespace regolith
