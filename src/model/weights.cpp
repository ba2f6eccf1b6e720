#include "model/weights.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "gguf/gguf.h"
#include "model/qwen4exp_tensors.h"
#include "quant/rows.h"

namespace regolith {
namespace {

std::string shape_of(const std::vector<int64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

bool same_shape(const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    if ((i < a.size() ? a[i] : 1) != (i < b.size() ? b[i] : 1)) return false;
  return true;
}

Weight view(const GgufTensor& t) {
  Weight w;
  w.name = t.name;
  w.type = t.type;
  for (size_t i = 0; i < t.ne.size() && i < 4; ++i) w.ne[i] = t.ne[i];
  w.data = t.data;
  w.row_bytes = row_bytes(t.type, t.ne[0]);
  return w;
}

class Binder {
 public:
  Binder(const GgufFile& file, const Qwen4ExpHparams& hp, int64_t ple_rows) : file_(file) {
    for (TensorSpec& s : qwen4exp_tensor_specs(hp, ple_rows)) specs_.emplace(s.name, std::move(s));
  }

  // Validates every tensor the geometry calls for (in name order), MTP block included.
  void validate_all() {
    for (const auto& [name, spec] : specs_) get(name);
  }

  Weight get(const std::string& name) {
    auto it = specs_.find(name);
    if (it == specs_.end()) fail("internal: no tensor spec named ", name);
    const TensorSpec& spec = it->second;
    const GgufTensor* t = file_.find_tensor(name);
    if (!t)
      fail(file_.source(), ": missing tensor '", name, "' (", tensor_class_name(spec.cls), ", shape ",
           shape_of(spec.ne), ")");
    if (!same_shape(t->ne, spec.ne))
      fail(file_.source(), ": tensor '", name, "' has shape ", t->shape_string(), ", expected ", shape_of(spec.ne));
    if (!can_dequantize(t->type))
      fail(file_.source(), ": tensor '", name, "' has type ", type_name(t->type),
           ", which this engine cannot read as a weight");
    return view(*t);
  }

  Weight get_optional(const std::string& name) { return file_.find_tensor(name) ? get(name) : Weight{}; }

 private:
  const GgufFile& file_;
  std::map<std::string, TensorSpec> specs_;
};

HcWeights bind_hc(Binder& b, const std::string& prefix, bool inject) {
  HcWeights w{b.get(prefix + "_norm.weight"), b.get(prefix + "_down.weight"), b.get(prefix + "_up.weight"), {}};
  if (inject) w.inject = b.get(prefix + "_inject.weight");
  return w;
}

LayerWeights bind_layer(Binder& b, const Qwen4ExpHparams& hp, int64_t il) {
  std::string p = cat("blk.", il, ".");
  LayerWeights L;
  L.recurrent = il < hp.n_layer && hp.is_recurrent[il];  // the MTP block is a QSA layer
  L.has_ple = hp.is_ple_layer(il);
  L.hc_attn = bind_hc(b, p + "hc_attn", true);
  L.hc_ffn = bind_hc(b, p + "hc_ffn", true);
  if (L.recurrent) {
    L.gdn = {b.get(p + "attn_qkv.weight"),  b.get(p + "attn_gate.weight"),   b.get(p + "ssm_alpha.weight"),
             b.get(p + "ssm_beta.weight"),  b.get(p + "ssm_a"),              b.get(p + "ssm_dt.bias"),
             b.get(p + "ssm_conv1d.weight"), b.get(p + "ssm_norm.weight"),   b.get(p + "ssm_out.weight")};
  } else {
    L.qsa = {b.get(p + "attn_q.weight"),          b.get(p + "attn_k.weight"),         b.get(p + "attn_v.weight"),
             b.get(p + "attn_output.weight"),     b.get(p + "attn_q_norm.weight"),    b.get(p + "attn_k_norm.weight"),
             b.get(p + "indexer.q_proj.weight"),  b.get(p + "indexer.k_proj.weight"), b.get(p + "indexer.q_norm.weight"),
             b.get(p + "indexer.k_norm.weight")};
  }
  L.moe = {b.get(p + "ffn_gate_inp.weight"),       b.get(p + "ffn_gate_exps.weight"),  b.get(p + "ffn_up_exps.weight"),
           b.get(p + "ffn_down_exps.weight"),      b.get(p + "ffn_gate_inp_shexp.weight"),
           b.get(p + "ffn_gate_shexp.weight"),     b.get(p + "ffn_up_shexp.weight"),   b.get(p + "ffn_down_shexp.weight")};
  if (L.has_ple) {
    L.ple = {b.get(p + "ple_key.weight"),        b.get(p + "ple_value.weight"),     b.get(p + "ple_norm_key.weight"),
             b.get(p + "ple_norm_query.weight"), b.get(p + "ple_norm_conv.weight"), b.get(p + "ple_conv1d.weight")};
  }
  return L;
}

// The MTP block, or nothing (and why in *unusable) when its projection cannot be split: the trunk
// still runs, only drafting with MTP is refused.
std::optional<MtpWeights> bind_mtp(Binder& b, const Qwen4ExpHparams& hp, const std::string& source,
                                   std::string* unusable) {
  const int64_t il = hp.n_layer, H = hp.n_embd;
  const std::string p = cat("blk.", il, ".");
  const Weight eh = b.get(p + "nextn.eh_proj.weight");
  try {
    check_row_length(eh.type, H);
  } catch (const Error& e) {  // a block straddles the embedding's and the residual's columns
    *unusable = cat(source, ": tensor '", eh.name, "' cannot be split after its first ", H, " columns (", e.what(), ")");
    return std::nullopt;
  }
  MtpWeights m;
  m.enorm = b.get(p + "nextn.enorm.weight");
  m.hnorm = b.get(p + "nextn.hnorm.weight");
  m.head_hc = bind_hc(b, p + "nextn.hc_head", false);
  m.layer = bind_layer(b, hp, il);
  const uint64_t half = row_bytes(eh.type, H);
  auto bytes = std::make_shared<std::vector<uint8_t>>(2 * half * H);
  for (int64_t r = 0; r < H; ++r) {
    const uint8_t* row = eh.data + r * eh.row_bytes;
    std::copy(row, row + half, bytes->data() + r * half);
    std::copy(row + half, row + 2 * half, bytes->data() + (H + r) * half);
  }
  for (Weight* half_w : {&m.proj_embd, &m.proj_stream}) {
    *half_w = eh;
    half_w->ne = {H, H, 1, 1};
    half_w->row_bytes = half;
  }
  m.proj_embd.name += "[embedding]";
  m.proj_embd.data = bytes->data();
  m.proj_stream.name += "[residual]";
  m.proj_stream.data = bytes->data() + half * H;
  m.split_bytes = std::move(bytes);
  return m;
}

}  // namespace

PleHashConstants check_ple_hash(const Qwen4ExpHparams& hp, int64_t table_rows, const std::string& source) {
  PleHashConstants c;
  if (hp.ple_layers.empty()) return c;
  const uint64_t pad_to = 128;
  // The successive primes from the first head's vocabulary; base = that prime gives the same list.
  PleHashConfig cfg;
  cfg.vocab_size = static_cast<uint64_t>(hp.n_vocab);
  cfg.ngram_size = static_cast<uint64_t>(hp.ple_ngram_size);
  cfg.heads_per_ngram = static_cast<uint64_t>(hp.ple_heads_per_ngram);
  cfg.ngram_vocab_size_base = hp.ple_head_vocab.empty() ? 0 : hp.ple_head_vocab[0];
  cfg.pad_to = pad_to;
  PleHashConstants expect = ple_hash_constants(cfg);
  auto key = [](const char* k) { return cat(kQwen4ExpArch, ".", k); };
  if (hp.ple_head_vocab != expect.head_vocab)
    fail(source, ": ", key("ple.head_vocab_sizes"), " are not successive primes (recomputed from ",
         cfg.ngram_vocab_size_base, ")");
  if (hp.ple_head_offsets != expect.head_offsets)
    fail(source, ": ", key("ple.head_offsets"), " are not the prefix sums of the head vocabularies");
  if (static_cast<uint64_t>(table_rows) != expect.n_rows)
    fail(source, ": per_layer_token_embd.weight has ", table_rows, " rows, the hash heads address ",
         expect.head_offsets.back() + expect.head_vocab.back(), " (", expect.n_rows, " padded to ", pad_to, ")");
  uint64_t bound = 2 * ((0x7fffffffffffffffull / static_cast<uint64_t>(hp.n_vocab)) / 2);
  for (uint64_t m : hp.ple_multipliers)
    if (m % 2 == 0 || m >= bound)
      fail(source, ": ", key("ple.layer_multipliers"), " value ", m, " is not an odd number below ", bound);
  c = expect;
  c.multipliers = hp.ple_multipliers;
  return c;
}

Qwen4ExpWeights bind_weights(const GgufFile& file, const Qwen4ExpHparams& hp) {
  int64_t ple_rows = 0;
  if (!hp.ple_layers.empty()) {
    const GgufTensor* table = file.find_tensor("per_layer_token_embd.weight");
    if (!table) fail(file.source(), ": missing tensor 'per_layer_token_embd.weight' (the PLE n-gram table)");
    if (table->ne.size() != 2)
      fail(file.source(), ": tensor 'per_layer_token_embd.weight' has shape ", table->shape_string(), ", expected 2-D");
    ple_rows = table->ne[1];
  }
  Binder b(file, hp, ple_rows);
  Qwen4ExpWeights w;
  w.tied_output = hp.output_tied;
  b.validate_all();
  w.token_embd = b.get("token_embd.weight");
  w.output = w.tied_output ? w.token_embd : b.get("output.weight");
  if (!hp.ple_layers.empty()) {
    w.ple_table = b.get("per_layer_token_embd.weight");
    w.ple_table.stays_on_host = true;
  }
  w.output_hc = bind_hc(b, "output_hc", false);
  for (int64_t il = 0; il < hp.n_layer; ++il) w.layers.push_back(bind_layer(b, hp, il));
  if (hp.n_layer_nextn) w.mtp = bind_mtp(b, hp, file.source(), &w.mtp_unusable);
  return w;
}

uint64_t weight_bytes(const Weight& w) { return w.present() ? w.row_bytes * w.n_rows() : 0; }

uint64_t decode_weight_bytes(const Qwen4ExpHparams& hp, const Qwen4ExpWeights& w) {
  auto hc = [](const HcWeights& h) {
    return weight_bytes(h.norm) + weight_bytes(h.down) + weight_bytes(h.up) + weight_bytes(h.inject);
  };
  uint64_t b = w.token_embd.row_bytes + weight_bytes(w.output) + hc(w.output_hc);
  if (w.ple_table.present()) b += hp.ple_n_heads() * w.ple_table.row_bytes;
  const double expert_share = static_cast<double>(hp.n_expert_used) / hp.n_expert;
  for (const LayerWeights& L : w.layers) {
    b += hc(L.hc_attn) + hc(L.hc_ffn);
    if (L.recurrent)
      for (const Weight* x : {&L.gdn.qkv, &L.gdn.gate, &L.gdn.alpha, &L.gdn.beta, &L.gdn.ssm_a, &L.gdn.dt_bias,
                              &L.gdn.conv, &L.gdn.norm, &L.gdn.out})
        b += weight_bytes(*x);
    else
      for (const Weight* x : {&L.qsa.q, &L.qsa.k, &L.qsa.v, &L.qsa.out, &L.qsa.q_norm, &L.qsa.k_norm, &L.qsa.index_q,
                              &L.qsa.index_k, &L.qsa.index_q_norm, &L.qsa.index_k_norm})
        b += weight_bytes(*x);
    const MoeWeights& e = L.moe;
    b += weight_bytes(e.router) + weight_bytes(e.shared_gate_inp) + weight_bytes(e.shared_gate) + weight_bytes(e.shared_up) +
         weight_bytes(e.shared_down);
    b += static_cast<uint64_t>(expert_share * (weight_bytes(e.gate_exps) + weight_bytes(e.up_exps) + weight_bytes(e.down_exps)));
    if (L.has_ple)
      for (const Weight* x : {&L.ple.key, &L.ple.value, &L.ple.norm_key, &L.ple.norm_query, &L.ple.norm_conv, &L.ple.conv})
        b += weight_bytes(*x);
  }
  return b;
}

}  // namespace regolith
