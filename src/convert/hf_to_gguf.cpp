// The converter works backwards from the GGUF layout: for every tensor the qwen4exp table
// expects, it finds the Hugging Face tensor(s) it comes from and a row producer applying the
// transform. Checkpoint tensors nothing consumed are an error (vision ones are skipped).

#include "convert/hf_to_gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "convert/hf_config.h"
#include "convert/synthetic_vocab.h"
#include "convert/tokenizer_import.h"
#include "convert/tensor_stream.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/safetensors.h"
#include "model/ple_hash.h"
#include "model/qwen4exp_tensors.h"

namespace regolith {
namespace {

// Rows of `src` (row length = its last dimension), copied with an element transform.
using ElementFn = float (*)(float);
float identity(float x) { return x; }
float plus_one(float x) { return x + 1.0f; }             // zero-centred gamma -> 1 + w
// A_log -> ssm_a, through double so the result is the correctly rounded float.
float neg_exp(float x) { return static_cast<float>(-std::exp(static_cast<double>(x))); }

// Qwen4ExpForConditionalGeneration nests the text model under model.language_model.,
// Qwen4ExpForCausalLM under model.
std::string text_prefix(const SafetensorsCheckpoint& ck) {
  for (const StTensor* t : ck.tensors())
    if (t->name.rfind("model.language_model.", 0) == 0) return "model.language_model.";
  return "model.";
}

class Converter {
 public:
  Converter(const HfModelConfig& cfg, const SafetensorsCheckpoint& ck)
      : cfg_(cfg), hp_(cfg.hparams), ck_(ck), prefix_(text_prefix(ck)) {}

  const StTensor& use(const std::string& name) {
    const StTensor* t = ck_.find(name);
    if (!t) fail(ck_.dir(), ": missing tensor '", name, "'");
    used_.insert(name);
    return *t;
  }
  const StTensor* use_if(const std::string& name) { return ck_.find(name) ? &use(name) : nullptr; }

  // The Hugging Face source and transform of one GGUF tensor.
  RowProducer producer(const TensorSpec& spec);
  std::set<std::string> unused() const;
  Qwen4ExpHparams& hparams() { return hp_; }

 private:
  RowProducer copy(const StTensor& src, const TensorSpec& spec, ElementFn fn = identity);
  RowProducer gather_rows(const StTensor& src, const TensorSpec& spec, std::function<int64_t(int64_t)> row_of);
  RowProducer permute_columns(const StTensor& src, const TensorSpec& spec, ElementFn fn);
  RowProducer concat_rows(std::vector<const StTensor*> parts, const TensorSpec& spec);
  RowProducer concat_columns(const StTensor& a, const StTensor& b, const TensorSpec& spec);
  RowProducer layer_tensor(const std::string& hf_layer, const std::string& short_name, const TensorSpec& spec);
  RowProducer hc_tensor(const std::string& hf_module, const std::string& part, const TensorSpec& spec);
  RowProducer expert_tensor(const std::string& mlp, const std::string& which, const TensorSpec& spec);

  // GGUF tiles GDN v-heads (h = j·n_k + g), Hugging Face groups them by k-head (g·ratio + j).
  int64_t hf_vhead(int64_t gguf_head) const {
    int64_t n_k = hp_.ssm_n_k_heads, ratio = hp_.ssm_n_v_heads / n_k;
    return (gguf_head % n_k) * ratio + gguf_head / n_k;
  }

  const HfModelConfig& cfg_;
  Qwen4ExpHparams hp_;
  const SafetensorsCheckpoint& ck_;
  std::string prefix_;
  std::set<std::string> used_;
};

void check_elements(const StTensor& src, const TensorSpec& spec, int64_t expected) {
  if (src.n_elements() != expected)
    fail(src.name, " ", src.shape_string(), " has ", src.n_elements(), " values; ", spec.name, " ",
         "needs ", expected);
}

int64_t spec_elements(const TensorSpec& spec) {
  int64_t n = 1;
  for (int64_t d : spec.ne) n *= d;
  return n;
}

RowProducer Converter::copy(const StTensor& src, const TensorSpec& spec, ElementFn fn) {
  check_elements(src, spec, spec_elements(spec));
  int64_t row = spec.ne[0];
  return [&src, row, fn](int64_t r0, int64_t nr, float* out) {
    src.to_f32(r0 * row, nr * row, out);
    if (fn != identity)
      for (int64_t i = 0; i < nr * row; ++i) out[i] = fn(out[i]);
  };
}

RowProducer Converter::gather_rows(const StTensor& src, const TensorSpec& spec, std::function<int64_t(int64_t)> row_of) {
  int64_t row = spec.ne[0];
  if (src.shape.empty() || src.shape.back() != row)
    fail(src.name, " ", src.shape_string(), ": rows are not ", row, " wide as ", spec.name, " needs");
  int64_t src_rows = src.n_elements() / row;
  return [&src, row, row_of, src_rows, name = spec.name](int64_t r0, int64_t nr, float* out) {
    for (int64_t r = 0; r < nr; ++r) {
      int64_t s = row_of(r0 + r);
      if (s < 0 || s >= src_rows) fail(name, ": source row ", s, " outside ", src.name);
      src.to_f32(s * row, row, out + r * row);
    }
  };
}

RowProducer Converter::permute_columns(const StTensor& src, const TensorSpec& spec, ElementFn fn) {
  check_elements(src, spec, spec_elements(spec));
  int64_t row = spec.ne[0], dv = row / hp_.ssm_n_v_heads;
  std::vector<int64_t> column(row);
  for (int64_t c = 0; c < row; ++c) column[c] = hf_vhead(c / dv) * dv + c % dv;
  return [&src, row, column, fn](int64_t r0, int64_t nr, float* out) {
    std::vector<float> tmp(row);
    for (int64_t r = 0; r < nr; ++r) {
      src.to_f32((r0 + r) * row, row, tmp.data());
      for (int64_t c = 0; c < row; ++c) out[r * row + c] = fn(tmp[column[c]]);
    }
  };
}

RowProducer Converter::concat_rows(std::vector<const StTensor*> parts, const TensorSpec& spec) {
  int64_t row = spec.ne[0], total = 0;
  std::vector<int64_t> starts;
  for (const StTensor* p : parts) {
    if (p->shape.size() != 2 || p->shape[1] != row) fail(p->name, " ", p->shape_string(), ": rows must be ", row, " wide");
    starts.push_back(total);
    total += p->shape[0];
  }
  if (total != spec.ne[1]) fail(spec.name, ": the shards hold ", total, " rows, the hash heads address ", spec.ne[1]);
  return [parts, starts, row](int64_t r0, int64_t nr, float* out) {
    for (int64_t r = r0; r < r0 + nr; ++r) {
      size_t k = std::upper_bound(starts.begin(), starts.end(), r) - starts.begin() - 1;
      parts[k]->to_f32((r - starts[k]) * row, row, out + (r - r0) * row);
    }
  };
}

RowProducer Converter::concat_columns(const StTensor& a, const StTensor& b, const TensorSpec& spec) {
  int64_t half = spec.ne[0] / 2;
  check_elements(a, spec, half * spec.ne[1]);
  check_elements(b, spec, half * spec.ne[1]);
  return [&a, &b, half](int64_t r0, int64_t nr, float* out) {
    for (int64_t r = 0; r < nr; ++r) {
      a.to_f32((r0 + r) * half, half, out + r * 2 * half);
      b.to_f32((r0 + r) * half, half, out + r * 2 * half + half);
    }
  };
}

RowProducer Converter::hc_tensor(const std::string& module, const std::string& part, const TensorSpec& spec) {
  if (part == "norm") return copy(use(module + ".hc_norm.weight"), spec, plus_one);
  if (part == "down") return copy(use(module + ".input_mix_weight_down.weight"), spec);
  if (part == "up") return copy(use(module + ".input_mix_weight_up.weight"), spec);
  if (part == "inject") return copy(use(module + ".block_inject_weight.weight"), spec);
  fail("unknown hyper-connection part ", part);
}

RowProducer Converter::expert_tensor(const std::string& mlp, const std::string& which, const TensorSpec& spec) {
  int64_t ff = hp_.n_ff_exp;
  if (const StTensor* fused = which == "down" ? use_if(mlp + "experts.down_proj") : use_if(mlp + "experts.gate_up_proj")) {
    if (which == "down") return copy(*fused, spec);
    check_elements(*fused, spec, 2 * spec_elements(spec));
    int64_t offset = which == "gate" ? 0 : ff;  // per expert: rows [0, ff) gate, [ff, 2ff) up
    return gather_rows(*fused, spec, [ff, offset](int64_t r) { return (r / ff) * 2 * ff + offset + r % ff; });
  }
  std::vector<const StTensor*> per_expert;  // the unfused layout: experts.{e}.{gate,up,down}_proj.weight
  for (int64_t e = 0; e < hp_.n_expert; ++e) per_expert.push_back(&use(cat(mlp, "experts.", e, ".", which, "_proj.weight")));
  int64_t rows_per_expert = spec.ne[1];
  for (const StTensor* t : per_expert) check_elements(*t, spec, spec.ne[0] * rows_per_expert);
  int64_t row = spec.ne[0];
  return [per_expert, rows_per_expert, row](int64_t r0, int64_t nr, float* out) {
    for (int64_t r = r0; r < r0 + nr; ++r)
      per_expert[r / rows_per_expert]->to_f32((r % rows_per_expert) * row, row, out + (r - r0) * row);
  };
}

RowProducer Converter::layer_tensor(const std::string& L, const std::string& n, const TensorSpec& spec) {
  const std::string attn = L + "self_attn.", gdn = L + "linear_attn.", mlp = L + "mlp.", ple = L + "ple.";
  if (n.rfind("hc_attn_", 0) == 0) return hc_tensor(L + "attn_hyper_connection", n.substr(8, n.find('.') - 8), spec);
  if (n.rfind("hc_ffn_", 0) == 0) return hc_tensor(L + "mlp_hyper_connection", n.substr(7, n.find('.') - 7), spec);
  // QSA attention and indexer
  if (n == "attn_q.weight") return copy(use(attn + "q_proj.weight"), spec);
  if (n == "attn_k.weight") return copy(use(attn + "k_proj.weight"), spec);
  if (n == "attn_v.weight") return copy(use(attn + "v_proj.weight"), spec);
  if (n == "attn_output.weight") return copy(use(attn + "o_proj.weight"), spec);
  if (n == "attn_q_norm.weight") return copy(use(attn + "q_norm.weight"), spec, plus_one);
  if (n == "attn_k_norm.weight") return copy(use(attn + "k_norm.weight"), spec, plus_one);
  if (n == "indexer.q_proj.weight" || n == "indexer.k_proj.weight") {
    const StTensor& qk = use(attn + "indexer.index_qk_proj.weight");
    check_elements(qk, spec, (hp_.indexer_n_head + 1) * hp_.indexer_head_dim * hp_.n_embd);
    int64_t first = n == "indexer.q_proj.weight" ? 0 : hp_.indexer_n_head * hp_.indexer_head_dim;
    return gather_rows(qk, spec, [first](int64_t r) { return first + r; });
  }
  if (n == "indexer.q_norm.weight") return copy(use(attn + "indexer.q_layernorm.weight"), spec, plus_one);
  if (n == "indexer.k_norm.weight") return copy(use(attn + "indexer.k_layernorm.weight"), spec, plus_one);
  // Gated DeltaNet, v-heads reordered to the GGUF tiling
  int64_t kd = hp_.ssm_key_dim(), dv = hp_.ssm_v_head_dim;
  auto v_rows = [this, kd, dv](int64_t first_v_row) {
    return [this, kd, dv, first_v_row](int64_t r) {
      if (r < first_v_row) return r;
      int64_t local = r - first_v_row;
      return first_v_row + hf_vhead(local / dv) * dv + local % dv;
    };
  };
  auto head_rows = [this](int64_t r) { return hf_vhead(r); };
  if (n == "attn_qkv.weight") return gather_rows(use(gdn + "in_proj_qkv.weight"), spec, v_rows(2 * kd));
  if (n == "attn_gate.weight") return gather_rows(use(gdn + "in_proj_z.weight"), spec, v_rows(0));
  if (n == "ssm_alpha.weight") return gather_rows(use(gdn + "in_proj_a.weight"), spec, head_rows);
  if (n == "ssm_beta.weight") return gather_rows(use(gdn + "in_proj_b.weight"), spec, head_rows);
  if (n == "ssm_a") return permute_columns(use(gdn + "A_log"), spec, neg_exp);
  if (n == "ssm_dt.bias") return permute_columns(use(gdn + "dt_bias"), spec, identity);
  if (n == "ssm_conv1d.weight") return gather_rows(use(gdn + "conv1d.weight"), spec, v_rows(2 * kd));
  if (n == "ssm_norm.weight") return copy(use(gdn + "norm.weight"), spec);  // plain gamma: no +1
  if (n == "ssm_out.weight") return permute_columns(use(gdn + "out_proj.weight"), spec, identity);
  // PLE
  if (n == "ple_key.weight") return copy(use(ple + "key_proj.weight"), spec);
  if (n == "ple_value.weight") return copy(use(ple + "value_proj.weight"), spec);
  if (n == "ple_norm_key.weight") return copy(use(ple + "norm_key.weight"), spec, plus_one);
  if (n == "ple_norm_query.weight") return copy(use(ple + "norm_query.weight"), spec, plus_one);
  if (n == "ple_norm_conv.weight") return copy(use(ple + "norm_conv.weight"), spec, plus_one);
  if (n == "ple_conv1d.weight") return copy(use(ple + "conv1d.weight"), spec);
  // MoE
  if (n == "ffn_gate_inp.weight") return copy(use(mlp + "gate.weight"), spec);
  if (n == "ffn_gate_exps.weight") return expert_tensor(mlp, "gate", spec);
  if (n == "ffn_up_exps.weight") return expert_tensor(mlp, "up", spec);
  if (n == "ffn_down_exps.weight") return expert_tensor(mlp, "down", spec);
  if (n == "ffn_gate_inp_shexp.weight") return copy(use(mlp + "shared_expert_gate.weight"), spec);
  if (n == "ffn_gate_shexp.weight") return copy(use(mlp + "shared_expert.gate_proj.weight"), spec);
  if (n == "ffn_up_shexp.weight") return copy(use(mlp + "shared_expert.up_proj.weight"), spec);
  if (n == "ffn_down_shexp.weight") return copy(use(mlp + "shared_expert.down_proj.weight"), spec);
  // MTP head (trailing block)
  if (n == "nextn.enorm.weight") return copy(use("mtp.pre_fc_norm_embedding.weight"), spec, plus_one);
  if (n == "nextn.hnorm.weight") return copy(use("mtp.pre_fc_norm_hidden.weight"), spec, plus_one);
  if (n == "nextn.eh_proj.weight") return concat_columns(use("mtp.fc_embedding.weight"), use("mtp.fc_hidden.weight"), spec);
  if (n.rfind("nextn.hc_head_", 0) == 0) return hc_tensor("mtp.hyper_connection_mixer", n.substr(14, n.find('.', 6) - 14), spec);
  fail("no Hugging Face source known for ", spec.name);
}

RowProducer Converter::producer(const TensorSpec& spec) {
  const std::string& n = spec.name;
  if (n == "token_embd.weight") return copy(use(prefix_ + "embed_tokens.weight"), spec);
  if (n == "output.weight") return copy(use("lm_head.weight"), spec);
  if (n.rfind("output_hc_", 0) == 0)
    return hc_tensor(prefix_ + "hyper_connection_mixer", n.substr(10, n.find('.') - 10), spec);
  if (n == "per_layer_token_embd.weight") {
    std::vector<const StTensor*> shards;
    std::string base = cat(prefix_, "layers.", hp_.ple_layers[0], ".ple.ple_embedding.ngram_embedding.shard_");
    for (int64_t k = 0; k < cfg_.split_ngram_parts; ++k) shards.push_back(&use(cat(base, k, ".weight")));
    return concat_rows(shards, spec);
  }
  if (n.rfind("blk.", 0) == 0) {
    size_t dot = n.find('.', 4);
    int64_t il = std::stoll(n.substr(4, dot - 4));
    std::string hf_layer = il < hp_.n_layer ? cat(prefix_, "layers.", il, ".") : std::string("mtp.layers.0.");
    return layer_tensor(hf_layer, n.substr(dot + 1), spec);
  }
  fail("no Hugging Face source known for ", n);
}

std::set<std::string> Converter::unused() const {
  std::set<std::string> out;
  for (const StTensor* t : ck_.tensors())
    if (!used_.count(t->name)) out.insert(t->name);
  return out;
}

GgmlType default_outtype(const SafetensorsCheckpoint& ck) {
  bool any_f32 = false, any_f16 = false;
  for (const StTensor* t : ck.tensors()) {
    any_f32 |= t->dtype == StDtype::F32 || t->dtype == StDtype::F64;
    any_f16 |= t->dtype == StDtype::F16;
  }
  return any_f32 ? GgmlType::F32 : any_f16 ? GgmlType::F16 : GgmlType::BF16;
}

// Recomputes the n-gram hash constants and checks them against the checkpoint's buffers.
PleHashConstants hash_constants(const HfModelConfig& cfg, Converter& conv, const std::string& prefix) {
  const Qwen4ExpHparams& hp = cfg.hparams;
  PleHashConstants c = ple_hash_constants({.seed = static_cast<uint64_t>(cfg.ple_seed),
                                           .ple_layer_index = 0,
                                           .vocab_size = static_cast<uint64_t>(hp.n_vocab),
                                           .ngram_size = static_cast<uint64_t>(hp.ple_ngram_size),
                                           .heads_per_ngram = static_cast<uint64_t>(hp.ple_heads_per_ngram),
                                           .ngram_vocab_size_base = static_cast<uint64_t>(cfg.ngram_vocab_size_base),
                                           .pad_to = static_cast<uint64_t>(cfg.ngram_pad_to)});
  std::string base = cat(prefix, "layers.", hp.ple_layers[0], ".ple.ple_embedding.");
  auto check = [&](const char* buffer, const std::vector<uint64_t>& expected) {
    const StTensor* t = conv.use_if(base + buffer);
    if (!t) return;
    std::vector<int64_t> stored = t->to_i64();
    if (stored.size() != expected.size() || !std::equal(stored.begin(), stored.end(), expected.begin(),
                                                          [](int64_t a, uint64_t b) { return static_cast<uint64_t>(a) == b; }))
      fail(t->name, ": stored hash constants differ from those the config defines");
  };
  check("layer_multipliers", c.multipliers);
  check("ngram_heads_offsets", c.head_offsets);
  check("ngram_heads_vocab_sizes", c.head_vocab);
  return c;
}

}  // namespace

void convert_hf_to_gguf(const ConvertOptions& o) {
  HfModelConfig cfg = read_hf_config(o.hf_dir);
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(o.hf_dir);
  Converter conv(cfg, ck);
  Qwen4ExpHparams& hp = conv.hparams();
  bool has_mtp = ck.find("mtp.fc_hidden.weight") != nullptr;
  if (cfg.mtp_layers > 0 && !has_mtp) std::fprintf(stderr, "note: config declares an MTP head, the checkpoint has no mtp.* tensors\n");
  hp.n_layer_nextn = has_mtp ? 1 : 0;
  hp.compress_ratios.resize(hp.n_layer_total(), 0);

  int64_t ple_rows = 0;
  if (!hp.ple_layers.empty()) {
    PleHashConstants c = hash_constants(cfg, conv, text_prefix(ck));
    hp.ple_multipliers = c.multipliers;
    hp.ple_head_offsets = c.head_offsets;
    hp.ple_head_vocab = c.head_vocab;
    ple_rows = static_cast<int64_t>(c.n_rows);
  }
  hp.validate(o.hf_dir + "/config.json");

  GgmlType outtype = o.outtype.value_or(default_outtype(ck));
  std::vector<PlannedTensor> plan;
  for (const TensorSpec& spec : qwen4exp_tensor_specs(hp, ple_rows))
    plan.push_back({spec.name, storage_type(spec, outtype), spec.ne, conv.producer(spec)});

  size_t skipped_vision = 0;
  std::vector<std::string> unexpected;
  for (const std::string& name : conv.unused()) {
    if (name.rfind("model.visual.", 0) == 0 || name.rfind("visual.", 0) == 0)
      ++skipped_vision;
    else
      unexpected.push_back(name);
  }
  if (!unexpected.empty())
    fail(o.hf_dir, ": ", unexpected.size(), " checkpoint tensor(s) have no place in the qwen4exp layout, e.g. '",
         unexpected.front(), "'");
  if (skipped_vision) std::fprintf(stderr, "skipping %zu vision tensors (text model only)\n", skipped_vision);

  GgufWriter w(o.out_path);
  write_hparams(w, hp);
  w.set("general.name", std::filesystem::path(o.hf_dir).filename().string());
  w.set("general.source.architecture", cfg.architecture);
  if (std::filesystem::exists(std::filesystem::path(o.hf_dir) / "tokenizer.json"))
    import_hf_tokenizer(o.hf_dir, w, hp.n_vocab);
  else
    write_synthetic_vocab(w, {.n_vocab = hp.n_vocab, .eos_id = cfg.eos_token_id});
  write_planned_tensors(w, plan, "convert " + o.out_path);
}

}  // namespace regolith
