// `regolith convert HF_DIR -o OUT.gguf [--outtype f32|f16|bf16|q8_0]`

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "convert/hf_to_gguf.h"
#include "core/error.h"

namespace regolith::cli {

void add_convert(CLI::App& app) {
  static std::string hf_dir, out, outtype;
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face qwen4_exp checkpoint to a qwen4exp GGUF");
  cmd->add_option("hf_dir", hf_dir, "Checkpoint directory (config.json + safetensors)")->required();
  cmd->add_option("-o,--output", out, "Output GGUF path")->required();
  cmd->add_option("--outtype", outtype, "f32 | f16 | bf16 | q8_0 (default: the checkpoint's float type)");
  cmd->callback([] {
    ConvertOptions o{hf_dir, out, std::nullopt};
    if (!outtype.empty()) {
      auto t = type_from_name(outtype);
      if (!t || (*t != GgmlType::F32 && *t != GgmlType::F16 && *t != GgmlType::BF16 && *t != GgmlType::Q8_0))
        fail("--outtype must be one of f32, f16, bf16, q8_0 (got '", outtype, "')");
      o.outtype = *t;
    }
    convert_hf_to_gguf(o);
    std::printf("wrote %s\n", out.c_str());
  });
}

}  // namespace regolith::cli
