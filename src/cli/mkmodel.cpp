// `regolith mkmodel`: writes a random-weight qwen4exp GGUF (see convert/random_model.h).

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "convert/random_model.h"
#include "core/error.h"

namespace regolith::cli {
namespace {

struct MkmodelArgs {
  std::string out, preset = "tiny", type = "f32", name;
  std::vector<std::string> tensor_types;
  int64_t experts = 0;
  uint64_t seed = 42, ngram_base = 0;
  bool mtp = false, repeat_experts = false;
};

GgmlType parse_type(const std::string& s) {
  auto t = type_from_name(s);
  if (!t) fail("unknown tensor type '", s, "'");
  return *t;
}

TensorClass parse_class(const std::string& s) {
  for (int c = 0; c <= static_cast<int>(TensorClass::MtpProj); ++c)
    if (tensor_class_name(static_cast<TensorClass>(c)) == s) return static_cast<TensorClass>(c);
  fail("unknown tensor class '", s, "'");
}

void run_mkmodel(const MkmodelArgs& a) {
  RandomModelOptions o;
  o.hparams = preset_hparams(a.preset, a.experts);
  o.hparams.n_layer_nextn = a.mtp ? 1 : 0;
  o.seed = a.seed;
  // The real table (base 20,000,000) is 51 G values; the flash-next preset keeps the per-token
  // geometry but a 200,000 base unless asked, since the table is read 16 rows per token.
  o.ngram_vocab_size_base = a.ngram_base ? a.ngram_base : (a.preset == "tiny" ? 100 : 200000);
  o.default_type = parse_type(a.type);
  for (const std::string& spec : a.tensor_types) {
    auto eq = spec.find('=');
    if (eq == std::string::npos) fail("--tensor-type wants CLASS=TYPE, got '", spec, "'");
    o.class_types[parse_class(spec.substr(0, eq))] = parse_type(spec.substr(eq + 1));
  }
  o.repeat_experts = a.repeat_experts;
  o.name = a.name.empty() ? "regolith-random-" + a.preset : a.name;
  write_random_model(a.out, o);
  std::printf("wrote %s (preset %s, %lld experts, seed %llu, random weights)\n", a.out.c_str(), a.preset.c_str(),
              (long long)o.hparams.n_expert, (unsigned long long)a.seed);
}

}  // namespace

void add_mkmodel(CLI::App& app) {
  static MkmodelArgs a;
  auto* cmd = app.add_subcommand("mkmodel", "Write a random-weight qwen4exp GGUF (tests, demos, benchmarks)");
  cmd->add_option("-o,--output", a.out, "Output GGUF path")->required();
  cmd->add_option("--preset", a.preset, "Geometry: tiny | flash-next")->capture_default_str();
  cmd->add_option("--experts", a.experts, "Routed experts (default: 8 for tiny, 512 for flash-next)");
  cmd->add_option("--type", a.type, "Type of weight matrices: f32 | f16 | bf16 | q8_0")->capture_default_str();
  cmd->add_option("--tensor-type", a.tensor_types,
                  "Per-class type override CLASS=TYPE (classes: token_embedding, output, hyper_connection, "
                  "attention, indexer, gdn, router, expert_gate_up, expert_down, shared_expert, ple, ngram_table, mtp, ...)");
  cmd->add_option("--seed", a.seed, "Random seed")->capture_default_str();
  cmd->add_option("--ngram-base", a.ngram_base, "Rows per n-gram hash head (~); default 100 (tiny), 200000 (flash-next)");
  cmd->add_flag("--mtp", a.mtp, "Include an MTP draft block as a trailing layer");
  cmd->add_flag("--repeat-experts", a.repeat_experts,
                "Give every routed expert of a layer the first one's weights (encoded once): a quick file for speed "
                "measurements");
  cmd->add_option("--name", a.name, "general.name to record");
  cmd->callback([] { run_mkmodel(a); });
}

}  // namespace regolith::cli
