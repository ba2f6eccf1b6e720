// `regolith run`: evaluates a prompt and streams generated token ids (text once the tokenizer is wired).

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/token_list.h"
#include "core/error.h"
#include "runtime/session.h"
#include "sample/sampler.h"

namespace regolith::cli {
namespace {

struct RunArgs {
  std::string model, prompt, tokens, backend = "ref";
  int64_t n_predict = 32, chunk = 0;
  SamplerParams sampling;
};

void run_run(const RunArgs& a) {
  if (!a.prompt.empty()) fail("text prompts need the tokenizer (not wired into `run` yet); pass --tokens 1,2,3");
  if (a.tokens.empty()) fail("give a prompt: -p TEXT or --tokens 1,2,3");
  std::vector<int32_t> prompt = parse_token_list(a.tokens);
  auto engine = Engine::open(a.model, a.backend);
  Session session(engine);
  Sampler sampler(a.sampling);
  std::vector<float> logits = session.eval(prompt, {.chunk = a.chunk, .all_logits = false});
  for (int64_t i = 0; i < a.n_predict; ++i) {
    int32_t next = sampler.sample(logits);
    std::printf(i ? " %d" : "%d", next);
    std::fflush(stdout);
    if (i + 1 < a.n_predict) logits = session.eval(std::span<const int32_t>(&next, 1), {.all_logits = false});
  }
  std::printf("\n");
}

}  // namespace

void add_run(CLI::App& app) {
  static RunArgs a;
  auto* cmd = app.add_subcommand("run", "Generate from a prompt (streams the generated token ids)");
  cmd->add_option("-m,--model", a.model, "Model GGUF")->required();
  cmd->add_option("-p,--prompt", a.prompt, "Prompt text (needs the tokenizer)");
  cmd->add_option("--tokens", a.tokens, "Prompt as token ids: 1,2,3");
  cmd->add_option("-n,--n-predict", a.n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temp", a.sampling.temp, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", a.sampling.top_k, "Top-k filter (0: off)")->capture_default_str();
  cmd->add_option("--top-p", a.sampling.top_p, "Top-p filter (1: off)")->capture_default_str();
  cmd->add_option("--min-p", a.sampling.min_p, "Min-p filter (0: off)")->capture_default_str();
  cmd->add_option("--seed", a.sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--chunk", a.chunk, "Prompt tokens per forward call (0: all at once)")->capture_default_str();
  cmd->add_option("--backend", a.backend, "Op backend")->capture_default_str();
  cmd->callback([] { run_run(a); });
}

}  // namespace regolith::cli
