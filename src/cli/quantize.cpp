// `regolith quantize IN.gguf OUT.gguf (--type T | --recipe NAME | --types-from OTHER.gguf) [--class C=T]...
//  [--tensor-type NAME=T]... [--imatrix FILE] [--dry-run] [--list-recipes]`

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "quant/model_quantize.h"

namespace regolith::cli {

void add_quantize(CLI::App& app) {
  static std::string input, output, type, recipe, types_from, imatrix;
  static std::vector<std::string> class_types, tensor_types;
  static bool dry_run = false, list = false;
  auto* cmd = app.add_subcommand("quantize", "Re-encode a qwen4exp GGUF under a quantization type or recipe");
  cmd->add_option("input", input, "Input GGUF (float or quantized)");
  cmd->add_option("output", output, "Output GGUF");
  cmd->add_option("--type", type, "One type for every weight matrix (q8_0, q4_k, iq2_xxs, ...)");
  cmd->add_option("--recipe", recipe, "A named per-class recipe (see --list-recipes)");
  cmd->add_option("--types-from", types_from,
                  "Give every matrix exactly the type it has in this GGUF (another quantizer's output of the same model)");
  cmd->add_option("--class", class_types, "Override a tensor class: CLASS=TYPE (e.g. expert_down=iq4_nl)");
  cmd->add_option("--tensor-type", tensor_types, "Override one tensor: NAME=TYPE (e.g. output.weight=q6_k)");
  cmd->add_option("--imatrix", imatrix, "Importance matrix (llama.cpp imatrix GGUF)");
  cmd->add_flag("--dry-run", dry_run, "Print the plan and sizes; write nothing");
  cmd->add_flag("--list-recipes", list, "List the named recipes and exit");
  cmd->callback([] {
    if (list) {
      for (const std::string& name : quant_recipe_names())
        std::printf("%-16s %s\n", name.c_str(), quant_recipe_description(name));
      return;
    }
    if (input.empty()) fail("quantize needs an input GGUF");
    if (output.empty() && !dry_run) fail("quantize needs an output path (or --dry-run)");
    if (type.empty() + recipe.empty() + types_from.empty() != 2) fail("give exactly one of --type, --recipe and --types-from");
    QuantizeModelOptions o;
    o.input = input;
    o.output = output;
    o.imatrix = imatrix;
    o.dry_run = dry_run;
    if (!type.empty()) {
      auto t = type_from_name(type);
      if (!t) fail("unknown type '", type, "'");
      o.recipe = single_type_recipe(*t);
    } else if (!recipe.empty()) {
      o.recipe = quant_recipe(recipe);
    } else {
      o.recipe.name = "types from " + types_from;
      o.exact_tensor_types = true;
      const GgufFile other = GgufFile::open(types_from);
      for (const GgufTensor& t : other.tensors())
        if (t.ne.size() >= 2) o.tensor_types[t.name] = t.type;
    }
    for (const std::string& c : class_types) {
      auto [cls, t] = parse_class_override(c);
      o.recipe.types[cls] = t;
    }
    for (const std::string& s : tensor_types) {
      size_t eq = s.rfind('=');
      auto t = eq == std::string::npos ? std::nullopt : type_from_name(s.substr(eq + 1));
      if (!t) fail("expected NAME=TYPE with a known type, got '", s, "'");
      o.tensor_types[s.substr(0, eq)] = *t;
    }
    quantize_model(o, stdout);
    if (!dry_run) std::printf("wrote %s\n", output.c_str());
  });
}

}  // namespace regolith::cli
