// `regolith logits`: float32 logits [positions × vocab] of a token list, evaluated whole, in chunks
// or token by token, plus a JSON summary (argmax and top 5 per position) on stdout.

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/token_list.h"
#include "core/error.h"
#include "runtime/session.h"

namespace regolith::cli {
namespace {

struct LogitsArgs {
  std::string model, tokens, out, trace_dir;
  BackendOptions backend;
  int64_t chunk = 0;
  bool decode = false;
};

void run_logits(const LogitsArgs& a) {
  std::vector<int32_t> tokens = parse_token_list(a.tokens);
  auto engine = Engine::open(a.model, a.backend);
  Session session(engine);
  nlohmann::json trace_index = nlohmann::json::array();
  int64_t trace_seq = 0;
  if (!a.trace_dir.empty()) {
    std::filesystem::create_directories(a.trace_dir);
    // Every named intermediate as raw float32/int32 (ne order) in forward order, with an index.
    session.set_trace([&](std::string_view name, int64_t layer, const Tensor& t) {
      std::string file = cat(a.trace_dir, "/", trace_seq++, ".", layer < 0 ? std::string("model") : cat("L", layer), ".",
                             name, t.dtype() == DType::F32 ? ".f32" : ".i32");
      std::vector<float> data(t.n_elements());
      engine->backend().read(t, data.data(), data.size() * 4);
      FILE* f = std::fopen(file.c_str(), "wb");
      if (!f || std::fwrite(data.data(), 4, data.size(), f) != data.size() || std::fclose(f) != 0)
        fail(file, ": write failed");
      trace_index.push_back({{"name", std::string(name)}, {"layer", layer}, {"file", file},
                             {"ne", std::vector<int64_t>(t.ne().begin(), t.ne().end())}});
    });
  }
  int64_t chunk = a.decode ? 1 : a.chunk;
  std::vector<float> logits = session.eval(tokens, {.chunk = chunk, .all_logits = true});
  int64_t V = engine->n_vocab();
  if (!a.out.empty()) {
    FILE* f = std::fopen(a.out.c_str(), "wb");
    if (!f) fail(a.out, ": cannot open for writing");
    size_t n = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
    if (std::fclose(f) != 0 || n != logits.size()) fail(a.out, ": write failed");
  }
  nlohmann::json summary;
  summary["n_tokens"] = tokens.size();
  summary["n_vocab"] = V;
  summary["mode"] = a.decode ? "decode" : chunk > 0 ? "chunk" : "whole";
  if (chunk > 0) summary["chunk"] = chunk;
  if (!a.out.empty()) summary["out"] = a.out;
  nlohmann::json positions = nlohmann::json::array();
  std::vector<int32_t> order(V);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const float* row = logits.data() + t * V;
    std::iota(order.begin(), order.end(), 0);
    int64_t k = std::min<int64_t>(5, V);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t x, int32_t y) {
      return row[x] > row[y] || (row[x] == row[y] && x < y);
    });
    nlohmann::json top = nlohmann::json::array();
    for (int64_t j = 0; j < k; ++j) top.push_back({{"id", order[j]}, {"logit", row[order[j]]}});
    positions.push_back({{"pos", t}, {"token", tokens[t]}, {"argmax", order[0]}, {"top5", top}});
  }
  summary["positions"] = positions;
  if (!a.trace_dir.empty()) {
    std::string index = a.trace_dir + "/index.json";
    FILE* f = std::fopen(index.c_str(), "w");
    std::string text = trace_index.dump(1);
    if (!f || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0)
      fail(index, ": write failed");
    summary["trace"] = index;
  }
  std::printf("%s\n", summary.dump(1).c_str());
}

}  // namespace

void add_logits(CLI::App& app) {
  static LogitsArgs a;
  auto* cmd = app.add_subcommand("logits", "Write the logits of a token list (float32 [positions x vocab])");
  cmd->add_option("-m,--model", a.model, "Model GGUF")->required();
  cmd->add_option("--tokens", a.tokens, "Token ids: 1,2,3")->required();
  cmd->add_option("--out", a.out, "Write the logits here (raw float32, row-major)");
  auto* chunk = cmd->add_option("--chunk", a.chunk, "Evaluate in chunks of N tokens");
  cmd->add_flag("--decode", a.decode, "Evaluate token by token")->excludes(chunk);
  cmd->add_option("--trace", a.trace_dir, "Dump every named intermediate into this folder (raw + index.json)");
  add_backend_options(cmd, a.backend);
  cmd->callback([] { run_logits(a); });
}

}  // namespace regolith::cli
