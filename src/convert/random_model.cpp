#include "convert/random_model.h"

#include <cmath>
#include <vector>

#include "convert/synthetic_vocab.h"
#include "core/error.h"
#include "convert/tensor_stream.h"
#include "gguf/gguf.h"
#include "model/ple_hash.h"

namespace regolith {
namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A counter-based approximately normal value (sum of four 16-bit uniforms, unit variance):
// any element can be generated independently, so rows are produced in parallel.
float normal_at(uint64_t stream, uint64_t index) {
  uint64_t r = splitmix64(stream ^ (index * 0xD1B54A32D192ED03ull));
  float sum = 0;
  for (int k = 0; k < 4; ++k) sum += static_cast<float>((r >> (16 * k)) & 0xffff) * (1.0f / 65536.0f);
  return (sum - 2.0f) * 1.7320508f;  // Irwin-Hall(4) has variance 1/3
}

float value_for(TensorClass cls, int64_t fan_in, float z) {
  switch (cls) {
    case TensorClass::TokenEmbedding:
    case TensorClass::NgramTable: return z;
    case TensorClass::NormOffset:
    case TensorClass::NormPlain: return 1.0f + 0.1f * z;
    case TensorClass::GdnDecay: return -std::exp(0.5f * z);    // ssm_a = -exp(A_log)
    case TensorClass::GdnDtBias: return 0.5f * z;
    case TensorClass::Conv: return 0.5f * z;
    default: return z / std::sqrt(static_cast<float>(fan_in));
  }
}

}  // namespace

GgmlType random_model_tensor_type(const TensorSpec& spec, const RandomModelOptions& options) {
  auto it = options.class_types.find(spec.cls);
  if (it != options.class_types.end()) return it->second;
  return storage_type(spec, options.default_type);
}

Qwen4ExpHparams preset_hparams(const std::string& preset, int64_t n_expert) {
  Qwen4ExpHparams hp;
  if (preset == "tiny") {
    hp.n_vocab = 512;
    hp.n_embd = 128;
    hp.n_layer = 4;
    hp.n_head = 4, hp.n_head_kv = 2, hp.head_dim = 32, hp.n_rot = 8;
    hp.rope_sections = {2, 1, 1, 0};
    hp.indexer_n_head = 2, hp.indexer_head_dim = 32, hp.indexer_top_k = 16;
    hp.ssm_conv_kernel = 4, hp.ssm_k_head_dim = 32, hp.ssm_v_head_dim = 32, hp.ssm_n_k_heads = 2, hp.ssm_n_v_heads = 4;
    hp.n_expert = n_expert > 0 ? n_expert : 8, hp.n_expert_used = 2, hp.n_ff_exp = 32, hp.n_ff_shexp = 32;
    hp.hc_count = 4, hp.hc_low_rank = 32;
    hp.ple_heads_per_ngram = 2, hp.ple_row_dim = 32;
    hp.ple_eos_token_id = 500;
    hp.n_ctx_train = 4096;
  } else if (preset == "flash-next") {  // model-spec §1
    hp.n_vocab = 248320;
    hp.n_embd = 2560;
    hp.n_layer = 48;
    hp.n_head = 24, hp.n_head_kv = 2, hp.head_dim = 256, hp.n_rot = 64;
    hp.rope_sections = {11, 11, 10, 0};
    hp.indexer_n_head = 4, hp.indexer_head_dim = 128, hp.indexer_top_k = 2048;
    hp.ssm_conv_kernel = 4, hp.ssm_k_head_dim = 128, hp.ssm_v_head_dim = 128, hp.ssm_n_k_heads = 16, hp.ssm_n_v_heads = 48;
    hp.n_expert = n_expert > 0 ? n_expert : 512, hp.n_expert_used = 10, hp.n_ff_exp = 640, hp.n_ff_shexp = 640;
    hp.hc_count = 4, hp.hc_low_rank = 320;
    hp.ple_heads_per_ngram = 8, hp.ple_row_dim = 160;
    hp.ple_eos_token_id = 248044;
    hp.ple_image_token_id = 248056;
    hp.n_ctx_train = 262144;
  } else {
    fail("unknown preset '", preset, "' (known: tiny, flash-next)");
  }
  hp.rms_eps = 1e-6;
  hp.rope_theta = 1e7;
  const int64_t interval = 4;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    hp.is_recurrent.push_back((il + 1) % interval != 0);
    hp.compress_ratios.push_back(hp.is_recurrent.back() ? 0 : 4);
  }
  hp.ple_layers = {1};
  hp.ple_ngram_size = 3;
  hp.ple_conv_kernel = 4;
  return hp;
}

void write_random_model(const std::string& path, const RandomModelOptions& o) {
  Qwen4ExpHparams hp = o.hparams;
  int64_t ple_rows = 0;
  if (!hp.ple_layers.empty()) {
    PleHashConstants c = ple_hash_constants({.seed = 1234,
                                             .ple_layer_index = 0,
                                             .vocab_size = static_cast<uint64_t>(hp.n_vocab),
                                             .ngram_size = static_cast<uint64_t>(hp.ple_ngram_size),
                                             .heads_per_ngram = static_cast<uint64_t>(hp.ple_heads_per_ngram),
                                             .ngram_vocab_size_base = o.ngram_vocab_size_base});
    hp.ple_multipliers = c.multipliers;
    hp.ple_head_offsets = c.head_offsets;
    hp.ple_head_vocab = c.head_vocab;
    ple_rows = static_cast<int64_t>(c.n_rows);
  }
  hp.compress_ratios.resize(hp.n_layer_total(), 0);  // an MTP block attends densely (ratio 0)
  hp.validate(path);

  GgufWriter w(path);
  write_hparams(w, hp);
  w.set("general.name", o.name);
  w.set("general.description", std::string("random weights made by `regolith mkmodel` (not a trained model)"));
  w.set("regolith.random_seed", o.seed);
  write_synthetic_vocab(w, {.n_vocab = hp.n_vocab, .eos_id = hp.ple_eos_token_id >= 0 ? hp.ple_eos_token_id : hp.n_vocab - 3});
  w.set("tokenizer.chat_template", std::string(
      "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
      "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"));

  std::vector<PlannedTensor> plan;
  for (const TensorSpec& spec : qwen4exp_tensor_specs(hp, ple_rows)) {
    uint64_t stream = fnv1a(spec.name) ^ splitmix64(o.seed);
    const bool routed = spec.cls == TensorClass::ExpertGateUp || spec.cls == TensorClass::ExpertDown;
    plan.push_back({spec.name, random_model_tensor_type(spec, o), spec.ne,
                    [stream, spec](int64_t first_row, int64_t n_rows, float* out) {
                      uint64_t base = static_cast<uint64_t>(first_row * spec.ne[0]);
                      for (int64_t i = 0; i < n_rows * spec.ne[0]; ++i)
                        out[i] = value_for(spec.cls, spec.fan_in(), normal_at(stream, base + i));
                    },
                    o.repeat_experts && routed ? spec.ne[1] : 0});
  }
  write_planned_tensors(w, plan, "mkmodel " + path);
}

}  // namespace regolith
