#include "model/qwen4exp_hparams.h"

#include <algorithm>

#include "core/error.h"
#include "gguf/gguf.h"

namespace regolith {
namespace {

std::string key(const char* suffix) { return cat(kQwen4ExpArch, ".", suffix); }

class MetaReader {
 public:
  explicit MetaReader(const GgufFile& f) : f_(f) {}
  int64_t integer(const char* suffix) const {
    std::string k = key(suffix);
    return f_.get(k).as_int(cat(f_.source(), ": ", k));
  }
  int64_t integer_or(const char* suffix, int64_t fallback) const {
    std::string k = key(suffix);
    const GgufValue* v = f_.find(k);
    return v ? v->as_int(cat(f_.source(), ": ", k)) : fallback;
  }
  double number(const char* suffix) const {
    std::string k = key(suffix);
    return f_.get(k).as_double(cat(f_.source(), ": ", k));
  }
  std::vector<int64_t> ints(const char* suffix) const {
    std::string k = key(suffix);
    return f_.get(k).as_int_array(cat(f_.source(), ": ", k));
  }
  std::vector<uint64_t> uints(const char* suffix) const {
    std::string k = key(suffix);
    return f_.get(k).as_uint_array(cat(f_.source(), ": ", k));
  }
  bool has(const char* suffix) const { return f_.find(key(suffix)) != nullptr; }

 private:
  const GgufFile& f_;
};

}  // namespace

bool Qwen4ExpHparams::is_ple_layer(int64_t il) const {
  return std::find(ple_layers.begin(), ple_layers.end(), il) != ple_layers.end();
}

Qwen4ExpHparams read_hparams(const GgufFile& file) {
  const std::string& arch = file.get("general.architecture").as_string("general.architecture");
  if (arch != kQwen4ExpArch)
    fail(file.source(), ": architecture '", arch, "' is not ", kQwen4ExpArch);
  MetaReader m(file);
  Qwen4ExpHparams hp;
  int64_t n_block = m.integer("block_count");
  hp.n_layer_nextn = m.integer_or("nextn_predict_layers", 0);
  hp.n_layer = n_block - hp.n_layer_nextn;
  hp.n_embd = m.integer("embedding_length");
  hp.n_ctx_train = m.integer("context_length");
  hp.rms_eps = m.number("attention.layer_norm_rms_epsilon");
  if (const GgufTensor* embd = file.find_tensor("token_embd.weight"); embd && embd->ne.size() == 2)
    hp.n_vocab = embd->ne[1];
  hp.n_vocab = m.integer_or("vocab_size", hp.n_vocab);
  if (hp.n_vocab <= 0) fail(file.source(), ": cannot tell the vocabulary size (no token_embd.weight)");

  hp.n_head = m.integer("attention.head_count");
  hp.n_head_kv = m.integer("attention.head_count_kv");
  hp.head_dim = m.integer("attention.key_length");
  if (m.integer_or("attention.value_length", hp.head_dim) != hp.head_dim)
    fail(file.source(), ": ", key("attention.value_length"), " differs from key_length");
  hp.n_rot = m.integer("rope.dimension_count");
  hp.rope_theta = m.number("rope.freq_base");
  auto sections = m.ints("rope.dimension_sections");
  if (sections.size() != 4) fail(file.source(), ": ", key("rope.dimension_sections"), " must hold 4 values");
  for (size_t i = 0; i < 4; ++i) hp.rope_sections[i] = static_cast<int32_t>(sections[i]);
  hp.indexer_n_head = m.integer("attention.indexer.head_count");
  hp.indexer_head_dim = m.integer("attention.indexer.key_length");
  hp.indexer_top_k = m.integer("attention.indexer.top_k");
  for (int64_t r : m.ints("attention.compress_ratios")) hp.compress_ratios.push_back(static_cast<int32_t>(r));

  hp.ssm_conv_kernel = m.integer("ssm.conv_kernel");
  hp.ssm_k_head_dim = m.integer("ssm.state_size");
  hp.ssm_n_k_heads = m.integer("ssm.group_count");
  hp.ssm_n_v_heads = m.integer("ssm.time_step_rank");
  int64_t inner = m.integer("ssm.inner_size");
  if (hp.ssm_n_v_heads <= 0 || inner % hp.ssm_n_v_heads != 0)
    fail(file.source(), ": ", key("ssm.inner_size"), " must be a multiple of time_step_rank");
  hp.ssm_v_head_dim = inner / hp.ssm_n_v_heads;
  int64_t interval = m.integer_or("full_attention_interval", 4);
  if (interval <= 0) fail(file.source(), ": ", key("full_attention_interval"), " must be positive");
  for (int64_t il = 0; il < hp.n_layer; ++il) hp.is_recurrent.push_back((il + 1) % interval != 0);

  hp.n_expert = m.integer("expert_count");
  hp.n_expert_used = m.integer("expert_used_count");
  hp.n_ff_exp = m.integer("expert_feed_forward_length");
  hp.n_ff_shexp = m.integer("expert_shared_feed_forward_length");

  hp.output_tied = file.find_tensor("output.weight") == nullptr;

  hp.hc_count = m.integer("hyper_connection.count");
  hp.hc_low_rank = m.integer("hyper_connection.low_rank");

  if (m.has("ple.layers")) {
    for (int64_t l : m.ints("ple.layers")) hp.ple_layers.push_back(static_cast<int32_t>(l));
  }
  if (!hp.ple_layers.empty()) {
    hp.ple_ngram_size = m.integer("ple.ngram_size");
    hp.ple_heads_per_ngram = m.integer("ple.heads_per_ngram");
    hp.ple_conv_kernel = m.integer("ple.conv_kernel");
    hp.ple_row_dim = m.integer("embedding_length_per_layer_input");
    hp.ple_eos_token_id = m.integer("ple.eos_token_id");
    hp.ple_image_token_id = m.integer_or("ple.image_token_id", hp.ple_eos_token_id);
    hp.ple_multipliers = m.uints("ple.layer_multipliers");
    hp.ple_head_offsets = m.uints("ple.head_offsets");
    hp.ple_head_vocab = m.uints("ple.head_vocab_sizes");
  }
  hp.validate(file.source());
  return hp;
}

void Qwen4ExpHparams::validate(const std::string& source) const {
  auto need = [&](bool ok, const char* suffix, const std::string& why) {
    if (!ok) fail(source, ": ", key(suffix), ": ", why);
  };
  need(n_layer > 0, "block_count", "no trunk layers");
  need(n_layer_nextn == 0 || n_layer_nextn == 1, "nextn_predict_layers", "must be 0 or 1");
  need(n_embd > 0, "embedding_length", "must be positive");
  need(rms_eps > 0, "attention.layer_norm_rms_epsilon", "must be positive");
  need(n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0, "attention.head_count_kv",
       "must be positive and divide head_count");
  need(head_dim > 0 && head_dim % 2 == 0, "attention.key_length", "must be positive and even");
  need(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim && n_rot <= indexer_head_dim, "rope.dimension_count",
       "must be even and at most the attention and indexer head widths");
  need(rope_theta > 0, "rope.freq_base", "must be positive");
  need(indexer_n_head > 0 && indexer_head_dim > 0, "attention.indexer.head_count", "must be positive");
  need(indexer_top_k > 0, "attention.indexer.top_k", "must be positive");
  need(static_cast<int64_t>(compress_ratios.size()) == n_layer_total(), "attention.compress_ratios",
       cat("has ", compress_ratios.size(), " entries for ", n_layer_total(), " blocks"));
  for (int64_t il = 0; il < n_layer; ++il) {
    bool qsa = !is_recurrent[il];
    need(qsa ? compress_ratios[il] > 0 : compress_ratios[il] == 0, "attention.compress_ratios",
         cat("layer ", il, " is ", qsa ? "a QSA layer and needs a positive ratio" : "a GDN layer and needs 0"));
    if (qsa) need(indexer_top_k % compress_ratios[il] == 0, "attention.indexer.top_k", "must be a multiple of the compress ratio");
  }
  need(ssm_conv_kernel > 0 && ssm_k_head_dim > 0 && ssm_v_head_dim > 0 && ssm_n_k_heads > 0, "ssm.conv_kernel",
       "GDN sizes must be positive");
  need(ssm_n_v_heads > 0 && ssm_n_v_heads % ssm_n_k_heads == 0, "ssm.time_step_rank",
       "must be a positive multiple of ssm.group_count");
  need(n_expert > 0 && n_expert_used > 0 && n_expert_used <= n_expert, "expert_used_count",
       "must be between 1 and expert_count");
  need(n_ff_exp > 0 && n_ff_shexp > 0, "expert_feed_forward_length", "must be positive");
  need(hc_count > 1, "hyper_connection.count", "must be greater than one");
  need(hc_low_rank > 0, "hyper_connection.low_rank", "must be positive");
  if (ple_layers.empty()) return;
  need(ple_layers.size() == 1, "ple.layers", "exactly one PLE layer is supported");
  need(ple_layers[0] >= 0 && ple_layers[0] < n_layer && is_recurrent[ple_layers[0]], "ple.layers",
       "must name a GDN layer of the trunk");
  need(ple_ngram_size >= 2 && ple_ngram_size <= 8, "ple.ngram_size", "must be in 2..8");
  need(ple_heads_per_ngram > 0, "ple.heads_per_ngram", "must be positive");
  need(ple_conv_kernel > 0, "ple.conv_kernel", "must be positive");
  need(ple_row_dim > 0 && ple_row_dim * ple_n_heads() == n_embd, "embedding_length_per_layer_input",
       "times the PLE head count must equal embedding_length");
  need(ple_eos_token_id >= 0 && ple_eos_token_id < n_vocab, "ple.eos_token_id", "must be a token id");
  need(static_cast<int64_t>(ple_multipliers.size()) == ple_ngram_size, "ple.layer_multipliers",
       "needs one value per n-gram position");
  need(static_cast<int64_t>(ple_head_offsets.size()) == ple_n_heads(), "ple.head_offsets", "needs one value per head");
  need(static_cast<int64_t>(ple_head_vocab.size()) == ple_n_heads(), "ple.head_vocab_sizes", "needs one value per head");
  for (uint64_t v : ple_head_vocab) need(v > 0, "ple.head_vocab_sizes", "must be positive");
}

void write_hparams(GgufWriter& w, const Qwen4ExpHparams& hp) {
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  // Small integer arrays as INT32, the type gguf-py infers for them.
  auto i32_array = [](const auto& values) {
    std::vector<int32_t> out(values.begin(), values.end());
    return GgufValue::array(GgufType::INT32, out);
  };
  w.set("general.architecture", std::string(kQwen4ExpArch));
  w.set(key("block_count"), u32(hp.n_layer_total()));
  if (hp.n_layer_nextn) w.set(key("nextn_predict_layers"), u32(hp.n_layer_nextn));
  w.set(key("context_length"), u32(hp.n_ctx_train));
  w.set(key("embedding_length"), u32(hp.n_embd));
  w.set(key("attention.head_count"), u32(hp.n_head));
  w.set(key("attention.head_count_kv"), u32(hp.n_head_kv));
  w.set(key("attention.key_length"), u32(hp.head_dim));
  w.set(key("attention.value_length"), u32(hp.head_dim));
  w.set(key("attention.layer_norm_rms_epsilon"), static_cast<float>(hp.rms_eps));
  w.set(key("rope.dimension_count"), u32(hp.n_rot));
  w.set(key("rope.freq_base"), static_cast<float>(hp.rope_theta));
  w.set(key("rope.dimension_sections"), GgufValue::array(GgufType::INT32, std::vector<int32_t>(
                                                             hp.rope_sections.begin(), hp.rope_sections.end())));
  w.set(key("expert_count"), u32(hp.n_expert));
  w.set(key("expert_used_count"), u32(hp.n_expert_used));
  w.set(key("expert_feed_forward_length"), u32(hp.n_ff_exp));
  w.set(key("expert_shared_feed_forward_length"), u32(hp.n_ff_shexp));
  w.set(key("ssm.conv_kernel"), u32(hp.ssm_conv_kernel));
  w.set(key("ssm.state_size"), u32(hp.ssm_k_head_dim));
  w.set(key("ssm.group_count"), u32(hp.ssm_n_k_heads));
  w.set(key("ssm.time_step_rank"), u32(hp.ssm_n_v_heads));
  w.set(key("ssm.inner_size"), u32(hp.ssm_value_dim()));
  int64_t interval = 0;
  for (int64_t il = 0; il < hp.n_layer && !interval; ++il)
    if (!hp.is_recurrent[il]) interval = il + 1;
  for (int64_t il = 0; il < hp.n_layer; ++il)
    if (interval == 0 || hp.is_recurrent[il] != ((il + 1) % interval != 0))
      fail("layer schedule is not 'one QSA layer every N': not representable as full_attention_interval");
  w.set(key("full_attention_interval"), u32(interval));
  w.set(key("hyper_connection.count"), u32(hp.hc_count));
  w.set(key("hyper_connection.low_rank"), u32(hp.hc_low_rank));
  w.set(key("attention.indexer.head_count"), u32(hp.indexer_n_head));
  w.set(key("attention.indexer.key_length"), u32(hp.indexer_head_dim));
  w.set(key("attention.indexer.top_k"), u32(hp.indexer_top_k));
  w.set(key("attention.compress_ratios"), i32_array(hp.compress_ratios));
  if (hp.ple_layers.empty()) return;
  w.set(key("ple.layers"), i32_array(hp.ple_layers));
  w.set(key("ple.ngram_size"), u32(hp.ple_ngram_size));
  w.set(key("ple.heads_per_ngram"), u32(hp.ple_heads_per_ngram));
  w.set(key("ple.conv_kernel"), u32(hp.ple_conv_kernel));
  w.set(key("ple.eos_token_id"), u32(hp.ple_eos_token_id));
  if (hp.ple_image_token_id >= 0) w.set(key("ple.image_token_id"), u32(hp.ple_image_token_id));
  w.set(key("embedding_length_per_layer_input"), u32(hp.ple_row_dim));
  w.set(key("ple.layer_multipliers"), GgufValue::array(GgufType::UINT64, hp.ple_multipliers));
  w.set(key("ple.head_offsets"), GgufValue::array(GgufType::UINT64, hp.ple_head_offsets));
  w.set(key("ple.head_vocab_sizes"), GgufValue::array(GgufType::UINT64, hp.ple_head_vocab));
}

}  // namespace regolith
