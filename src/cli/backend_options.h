// The options every model-running command shares: which backend, and its threads.
#pragma once

#include <CLI/CLI.hpp>

#include "backend/ops.h"

namespace regolith::cli {

// Registers --backend (default: options.name as given) and -t/--threads on cmd.
void add_backend_options(CLI::App* cmd, BackendOptions& options, const std::string& backend_help = "Op backend");

}  // namespace regolith::cli
