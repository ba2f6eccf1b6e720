// Random-weight qwen4exp GGUFs of any geometry, for tests, the default demo model and
// benchmarks. Weights are deterministic in (seed, tensor name) and scaled so activations stay
// in a realistic range (matrices ~ N(0, 1/fan_in), norm gammas near 1, decays in (0, 1)).
// Written as a stream: memory stays bounded whatever the file size.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "core/ggml_type.h"
#include "model/qwen4exp_hparams.h"
#include "model/qwen4exp_tensors.h"

namespace regolith {

struct RandomModelOptions {
  Qwen4ExpHparams hparams;
  uint64_t seed = 42;
  uint64_t ngram_vocab_size_base = 100;  // rows per hash head ~ this; sets the table size
  GgmlType default_type = GgmlType::F32; // matrices; 1-D tensors and convs stay F32
  std::map<TensorClass, GgmlType> class_types;  // overrides per tensor class
  // Every routed expert of a layer gets the first expert's weights (made and encoded once, then
  // copied): a file for speed measurements that writes in seconds at any expert count and type.
  bool repeat_experts = false;
  std::string name = "random";
};

// Presets: "tiny" (tests, the default model) and "flash-next" (the real per-token geometry of
// Qwen3.8-Flash-Next with n_expert routed experts).
Qwen4ExpHparams preset_hparams(const std::string& preset, int64_t n_expert);

void write_random_model(const std::string& path, const RandomModelOptions& options);

// The type a tensor gets under the options (after the per-class overrides).
GgmlType random_model_tensor_type(const TensorSpec& spec, const RandomModelOptions& options);

}  // namespace regolith
