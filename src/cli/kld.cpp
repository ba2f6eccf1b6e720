// `regolith kld -m QUANT.gguf [QUANT2.gguf ...] --base BASE.gguf (--tokens FILE | --text FILE)
//  [--chunk N] [--json] [--kl-out FILE]`: mean KL divergence (± standard error), median, 99th percentile and maximum,
// top-1 agreement and perplexities of quantized models against their base model, all evaluated
// on the same chunks (runtime/kl_divergence.h; the base once). The text is tokenized with the base
// model's tokenizer.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/eval_input.h"
#include "core/error.h"
#include "runtime/kl_divergence.h"

namespace regolith::cli {
namespace {

struct KldArgs {
  std::vector<std::string> models;
  std::string base, tokens, text, kl_out;
  BackendOptions backend;
  int64_t chunk = 512;
  bool json = false;
};

void print_text(const std::string& model, const KldStats& s) {
  std::printf("%s\n", model.c_str());
  std::printf("  mean KL      %.6g ± %.3g\n", s.kl_mean, s.kl_stderr);
  std::printf("  median KL    %.6g\n", s.kl_median);
  std::printf("  99%% KL       %.6g\n", s.kl_p99);
  std::printf("  max KL       %.6g\n", s.kl_max);
  std::printf("  top-1 agree  %.3f %%\n", 100.0 * s.top1);
  std::printf("  PPL          %.6g\n", s.ppl_model);
}

// One line per position, one column per model.
void write_kl_values(const std::string& path, const std::vector<KldAccumulator>& acc) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) fail(path, ": cannot open for writing");
  for (size_t i = 0; i < acc[0].kl_values().size(); ++i)
    for (size_t k = 0; k < acc.size(); ++k) std::fprintf(f, "%.9g%c", acc[k].kl_values()[i], k + 1 < acc.size() ? ' ' : '\n');
  if (std::fclose(f) != 0) fail(path, ": write failed");
}

void run_kld(const KldArgs& a) {
  auto base = Engine::open(a.base, a.backend);
  std::vector<std::shared_ptr<Engine>> models;
  for (const std::string& m : a.models) models.push_back(Engine::open(m, a.backend));
  const std::vector<int32_t> tokens = read_eval_tokens(a.tokens, a.text, base->model().file());
  const int64_t n = static_cast<int64_t>(tokens.size()), n_chunks = a.chunk > 0 ? (n + a.chunk - 1) / a.chunk : 0;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<KldAccumulator> acc = kl_divergence(base, models, tokens, a.chunk, [&](int64_t done) {
    show_chunk_progress("kld", (done + a.chunk - 1) / a.chunk, n_chunks, done, n,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
  std::vector<KldStats> stats;
  for (const KldAccumulator& m : acc) stats.push_back(m.stats());
  if (!a.kl_out.empty()) write_kl_values(a.kl_out, acc);
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (size_t k = 0; k < stats.size(); ++k) {
      const KldStats& s = stats[k];
      list.push_back({{"model", a.models[k]},
                      {"kl", {{"mean", s.kl_mean}, {"stderr", s.kl_stderr}, {"median", s.kl_median}, {"p99", s.kl_p99},
                              {"max", s.kl_max}}},
                      {"top1_percent", 100.0 * s.top1},
                      {"ppl", s.ppl_model}});
    }
    nlohmann::json j = {{"base", a.base},          {"n_tokens", n},       {"chunk", a.chunk},
                        {"ppl_base", stats[0].ppl_base}, {"n_next", stats[0].n_next}, {"models", list}};
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("kld against %s: %lld tokens in chunks of %lld; base PPL %.6g (%lld next tokens)\n", a.base.c_str(),
              static_cast<long long>(n), static_cast<long long>(a.chunk), stats[0].ppl_base,
              static_cast<long long>(stats[0].n_next));
  for (size_t k = 0; k < stats.size(); ++k) print_text(a.models[k], stats[k]);
}

}  // namespace

void add_kld(CLI::App& app) {
  static KldArgs a;
  auto* cmd = app.add_subcommand("kld", "KL divergence and top-1 agreement of (quantized) models against their base model");
  cmd->add_option("-m,--model", a.models, "The quantized model GGUF(s)")->required();
  cmd->add_option("--base", a.base, "The base (F32/BF16) model GGUF")->required();
  auto* tokens = cmd->add_option("--tokens", a.tokens, "Token file: ids separated by commas or whitespace");
  cmd->add_option("--text", a.text, "Text file, tokenized with the base model's tokenizer")->excludes(tokens);
  cmd->add_option("--chunk", a.chunk, "Tokens per chunk (a fresh session each)")->capture_default_str();
  add_backend_options(cmd, a.backend, "Op backend (every model)");
  cmd->add_flag("--json", a.json, "Print the results as JSON");
  cmd->add_option("--kl-out", a.kl_out, "Write each position's KL: one line per position, one column per model");
  cmd->callback([] { run_kld(a); });
}

}  // namespace regolith::cli
