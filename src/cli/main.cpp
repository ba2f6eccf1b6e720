// The `regolith` command: dispatches to subcommands; turns errors into a message and exit code 1.

#include <cstdio>
#include <exception>

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
  try {
    app.parse(argc, argv);
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
