// `regolith convert`: a Hugging Face qwen4_exp checkpoint (safetensors, sharded or not) to a
// GGUF in llama.cpp's qwen4exp layout, applying every transform of model-spec §6.3. Streams:
// memory does not grow with the checkpoint.
#pragma once

#include <optional>
#include <string>

#include "core/ggml_type.h"

namespace regolith {

struct ConvertOptions {
  std::string hf_dir;
  std::string out_path;
  std::optional<GgmlType> outtype;  // f32 | f16 | bf16 | q8_0; default: the checkpoint's float type
};

void convert_hf_to_gguf(const ConvertOptions& options);

}  // namespace regolith
