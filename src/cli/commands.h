// Each subcommand registers itself on the top-level CLI11 app; one file per subcommand.
#pragma once

#include <CLI/CLI.hpp>

namespace regolith::cli {

void add_inspect(CLI::App& app);
void add_convert(CLI::App& app);
void add_mkmodel(CLI::App& app);
void add_run(CLI::App& app);
void add_logits(CLI::App& app);
void add_tokenize(CLI::App& app);  // also registers `detokenize`
void add_serve(CLI::App& app);
void add_quantize(CLI::App& app);
void add_bench(CLI::App& app);
void add_imatrix(CLI::App& app);
void add_kld(CLI::App& app);

}  // namespace regolith::cli
