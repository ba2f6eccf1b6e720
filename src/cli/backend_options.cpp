#include "cli/backend_options.h"

namespace regolith::cli {

void add_backend_options(CLI::App* cmd, BackendOptions& options, const std::string& backend_help) {
  cmd->add_option("--backend,--device", options.name,
                  backend_help + ": auto (cuda when a GPU is usable, else cpu), cpu, cuda or ref")
      ->capture_default_str();
  cmd->add_option("-t,--threads", options.n_threads, "Threads of the cpu backend (0: every core)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
}

}  // namespace regolith::cli
