// The `regolith` command: dispatches to subcommands; turns errors into a message and exit code 1.

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"regolith: inference engine for the Qwen3.8-Flash-Next model family (qwen4exp)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "regolith 0.1.0");
  regolith::cli::add_inspect(app);
  regolith::cli::add_convert(app);
  regolith::cli::add_mkmodel(app);
  regolith::cli::add_run(app);
  regolith::cli::add_logits(app);
  regolith::cli::add_tokenize(app);
  regolith::cli::add_serve(app);
  regolith::cli::add_quantize(app);
  regolith::cli::add_bench(app);
  regolith::cli::add_imatrix(app);
  regolith::cli::add_kld(app);
  // llama.cpp spells the system prompt `-sys`; CLI11 takes only one letter after a single dash.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::string& arg : args)
    if (arg == "-sys") arg = "--system";
  std::reverse(args.begin(), args.end());  // CLI11 consumes a reversed vector
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const regolith::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
