// `regolith imatrix -m MODEL.gguf (--tokens FILE | --text FILE) -o OUT.imatrix.gguf [--chunk N]`:
// runs the model over the input in chunks of N tokens (a fresh session per chunk, as llama.cpp's
// imatrix does; a shorter last chunk included) through an ImatrixCollector and writes llama.cpp's
// imatrix GGUF, for `regolith quantize --imatrix` (or llama.cpp's llama-quantize).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/eval_input.h"
#include "core/error.h"
#include "runtime/imatrix_collector.h"
#include "runtime/session.h"

namespace regolith::cli {
namespace {

struct ImatrixArgs {
  std::string model, tokens, text, out;
  BackendOptions backend;
  int64_t chunk = 512;
};

void run_imatrix(const ImatrixArgs& a) {
  if (a.chunk < 1) fail("--chunk must be at least 1");
  auto model = Qwen4ExpModel::load(a.model);
  const std::vector<int32_t> tokens = read_eval_tokens(a.tokens, a.text, model->file());
  auto collector_owner = std::make_unique<ImatrixCollector>(make_backend(a.backend));
  const ImatrixCollector& collector = *collector_owner;
  auto engine = std::make_shared<Engine>(model, std::move(collector_owner));

  const int64_t n = static_cast<int64_t>(tokens.size()), n_chunks = (n + a.chunk - 1) / a.chunk;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t begin = c * a.chunk, len = std::min(a.chunk, n - begin);
    Session(engine).eval(std::span(tokens).subspan(begin, len));
    show_chunk_progress("imatrix", c + 1, n_chunks, begin + len, n,
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  const std::string dataset = a.text.empty() ? a.tokens : a.text;
  collector.write_gguf(a.out, {dataset}, static_cast<uint32_t>(n_chunks), static_cast<uint32_t>(a.chunk));
  int64_t partial = 0;
  for (const auto& [name, e] : collector.entries())
    for (int64_t count : e.counts)
      if (count == 0) {
        ++partial;
        break;
      }
  std::printf("imatrix: %zu matrices from %lld tokens in %lld chunks of %lld -> %s\n", collector.entries().size(),
              static_cast<long long>(n), static_cast<long long>(n_chunks), static_cast<long long>(a.chunk), a.out.c_str());
  if (partial > 0)
    std::printf("note: %lld expert tensors have experts no token was routed to (quantize weighs those uniformly)\n",
                static_cast<long long>(partial));
}

}  // namespace

void add_imatrix(CLI::App& app) {
  static ImatrixArgs a;
  auto* cmd = app.add_subcommand("imatrix", "Compute an importance matrix (llama.cpp imatrix GGUF) for regolith quantize --imatrix");
  cmd->add_option("-m,--model", a.model, "Model GGUF (float, ideally)")->required();
  auto* tokens = cmd->add_option("--tokens", a.tokens, "Token file: ids separated by commas or whitespace");
  cmd->add_option("--text", a.text, "Text file, tokenized with the model's tokenizer")->excludes(tokens);
  cmd->add_option("-o,--out", a.out, "Output imatrix GGUF")->required();
  cmd->add_option("--chunk", a.chunk, "Tokens per chunk (a fresh session each)")->capture_default_str();
  add_backend_options(cmd, a.backend);
  cmd->callback([] { run_imatrix(a); });
}

}  // namespace regolith::cli
