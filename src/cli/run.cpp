// `regolith run`: evaluates a prompt (text, a chat turn, or token ids) and streams the generated
// text (or ids) to stdout; timings go to stderr.

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/default_model.h"
#include "cli/token_list.h"
#include "core/error.h"
#include "core/text_file.h"
#include "runtime/session.h"
#include "sample/sampler.h"
#include "server/json_schema.h"
#include "spec/speculative.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace regolith::cli {
namespace {

struct RunArgs {
  std::string model, prompt, system, tokens, json_schema, draft_from = "mtp";
  BackendOptions backend;
  int64_t n_predict = 64, chunk = 0, draft = 0;
  bool chat = false, ids = false, ignore_eos = false, no_think = false, json = false;
  SamplerParams sampling;
};

std::vector<int32_t> prompt_tokens(const RunArgs& a, const Tokenizer& tok) {
  if (!a.tokens.empty()) {
    if (!a.prompt.empty() || a.chat) fail("give either --tokens or a text prompt, not both");
    std::vector<int32_t> ids = parse_token_list(a.tokens);
    for (int32_t id : ids)
      if (id >= tok.n_vocab()) fail("token id ", id, " is outside the vocabulary (", tok.n_vocab(), " tokens)");
    return ids;
  }
  if (a.prompt.empty()) fail("give a prompt: -p TEXT (with --chat for a chat turn) or --tokens 1,2,3");
  if (!a.chat && a.system.empty()) return tok.encode(a.prompt);
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  messages.push_back({{"role", "user"}, {"content", a.prompt}});
  ChatOptions options;
  if (a.no_think) options.extra["enable_thinking"] = false;
  std::string text = ChatTemplate::from_tokenizer(tok).apply(messages, options);
  // The reply is JSON alone: a reasoning block the template opened is closed empty, as the server does.
  if ((a.json || !a.json_schema.empty()) && ends_in_open_reasoning(text)) text += "</think>\n\n";
  return tok.encode(text, {.add_special = false, .parse_special = true});
}

nlohmann::ordered_json read_json_file(const std::string& path) {
  try {
    return nlohmann::ordered_json::parse(read_text_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, ": not JSON (", e.what(), ")");
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void run_run(const RunArgs& a) {
  auto engine = Engine::open(model_or_default(a.model), a.backend);
  Tokenizer tok = Tokenizer::from_gguf(engine->model().file());
  std::vector<int32_t> prompt = prompt_tokens(a, tok);
  if (prompt.empty()) fail("the prompt has no tokens");
  const int64_t n_ctx = engine->model().hparams().n_ctx_train;
  if (static_cast<int64_t>(prompt.size()) + a.n_predict > n_ctx)
    fail("prompt (", prompt.size(), " tokens) plus -n ", a.n_predict, " exceeds the context of ", n_ctx, " tokens");

  if (a.json && !a.json_schema.empty()) fail("give --json or --json-schema, not both");
  std::shared_ptr<const server::JsonGrammar> schema;
  if (!a.json_schema.empty()) schema = server::JsonGrammar::compile(read_json_file(a.json_schema));
  std::optional<server::JsonVocabulary> json_vocabulary;
  if (a.json || schema) json_vocabulary.emplace(tok);
  server::JsonReplyConstraint json =
      json_vocabulary ? server::JsonReplyConstraint(*json_vocabulary, schema.get()) : server::JsonReplyConstraint();

  if (a.draft < 0) fail("--draft ", a.draft, ": give a number of drafts a round, or 0 for none");

  Session session(engine);
  Sampler sampler(a.sampling);
  std::unique_ptr<Speculator> speculator;
  if (a.draft > 0) speculator = make_speculator(session, a.draft_from, a.draft);
  StreamingDetokenizer detok(tok, /*skip_special=*/true);
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<float> prompt_logits = session.eval(prompt, {.chunk = a.chunk, .all_logits = false});
  double prefill_s = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  int64_t generated = 0;
  // Prints a generated token; false once generation ends at it.
  auto emit = [&](int32_t next) {
    if (!a.ignore_eos && tok.is_end_of_generation(next)) return false;
    if (a.ids)
      std::printf(generated ? " %d" : "%d", next);
    else
      std::fputs(detok.push(next).c_str(), stdout);
    std::fflush(stdout);
    ++generated;
    return true;
  };
  // The next token from a row of logits, within the JSON constraint (which it advances) when there
  // is one. A speculative round calls it once per emitted token, in order, as plain decoding does.
  std::vector<float> masked;
  const ChooseToken choose = [&](std::span<const float> logits) {
    if (json.active()) {
      masked.assign(logits.begin(), logits.end());
      json.mask(masked);
      logits = masked;
    }
    const int32_t next = sampler.sample(logits);
    if (json.active()) json.accept(next, tok.token_bytes(next));
    return next;
  };
  if (speculator) {
    int32_t next = choose(prompt_logits);
    bool going = a.n_predict > 0 && emit(next);
    while (going && generated < a.n_predict)
      for (int32_t t : speculator->round(next, choose, a.n_predict - generated))
        if (!(going = emit(next = t))) break;
  } else {
    std::span<const float> logits = prompt_logits;
    // Each step is issued while the device still runs the one before (Session::queue_step).
    if (a.n_predict > 1) session.queue_step();
    while (generated < a.n_predict) {
      const int32_t next = choose(logits);
      if (!emit(next)) break;
      if (generated < a.n_predict) {
        session.give_token(next);
        if (generated + 1 < a.n_predict) session.queue_step();
        logits = session.step_logits();
      }
    }
  }
  if (!a.ids) std::fputs(detok.finish().c_str(), stdout);
  std::printf("\n");
  std::fflush(stdout);  // the text before the timings, also when both go to one pipe
  double decode_s = seconds_since(t1);
  std::fprintf(stderr, "prompt %zu tokens in %.3f s (%.1f tok/s); generated %lld tokens in %.3f s (%.1f tok/s)",
               prompt.size(), prefill_s, prompt.size() / prefill_s, (long long)generated, decode_s,
               generated ? generated / decode_s : 0.0);
  if (speculator) {
    const SpeculativeStats& st = speculator->stats();
    std::fprintf(stderr, "; %s drafts accepted %lld of %lld (%.1f%%) in %lld rounds", a.draft_from.c_str(),
                 (long long)st.accepted, (long long)st.drafted, st.drafted ? 100.0 * st.accepted / st.drafted : 0.0,
                 (long long)st.rounds);
  }
  std::fprintf(stderr, "\n");
}

}  // namespace

void add_run(CLI::App& app) {
  static RunArgs a;
  auto* cmd = app.add_subcommand("run", "Generate text from a prompt");
  cmd->add_option("-m,--model", a.model, "Model GGUF (default: the built-in tiny random model)");
  cmd->add_option("-p,--prompt", a.prompt, "Prompt text");
  cmd->add_flag("--chat", a.chat, "Format the prompt as a user turn with the model's chat template");
  cmd->add_option("--system", a.system, "System prompt (implies --chat; -sys also works)");
  cmd->add_flag("--no-think", a.no_think, "Chat template variable enable_thinking = false");
  cmd->add_option("--tokens", a.tokens, "Prompt as token ids: 1,2,3");
  cmd->add_flag("--ids", a.ids, "Print generated token ids instead of text");
  cmd->add_flag("--ignore-eos", a.ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_option("-n,--n-predict", a.n_predict, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temp", a.sampling.temp, "Temperature (0: greedy)")->capture_default_str();
  cmd->add_option("--top-k", a.sampling.top_k, "Top-k filter (0: off)")->capture_default_str();
  cmd->add_option("--top-p", a.sampling.top_p, "Top-p filter (1: off)")->capture_default_str();
  cmd->add_option("--min-p", a.sampling.min_p, "Min-p filter (0: off)")->capture_default_str();
  cmd->add_option("--seed", a.sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--chunk", a.chunk, "Prompt tokens per forward call (0: all at once)")->capture_default_str();
  cmd->add_option("--draft", a.draft,
                  "Speculative decoding: tokens drafted a round, verified in one pass (0: off)")
      ->capture_default_str();
  cmd->add_option("--draft-from", a.draft_from, "Draft source: mtp (the model's MTP head) or lookup (earlier text)")
      ->capture_default_str();
  cmd->add_flag("--json", a.json, "The reply is one JSON object (the server's response_format json_object)");
  cmd->add_option("--json-schema", a.json_schema, "The reply is a value of the JSON Schema in this file (json_schema)")
      ->check(CLI::ExistingFile);
  add_backend_options(cmd, a.backend);
  cmd->callback([] { run_run(a); });
}

}  // namespace regolith::cli
