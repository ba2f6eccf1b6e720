// `regolith serve`: the OpenAI-compatible HTTP server (src/server/). Flags follow llama-server's
// where the meaning is the same.

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/default_model.h"
#include "core/error.h"
#include "server/server.h"

namespace regolith::cli {

void add_serve(CLI::App& app) {
  static server::ServerOptions o;
  static int exit_code = 0;
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, SSE, prefix cache)");
  cmd->add_option("-m,--model", o.model_path, "Model GGUF (default: the embedded tiny random model)");
  cmd->add_option("--host", o.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o.port, "Port (0: any free port, printed at startup)")->capture_default_str();
  cmd->add_option("-c,--ctx-size", o.n_ctx, "Tokens per sequence, prompt and reply (0: the model's training context)")
      ->capture_default_str();
  cmd->add_option("--parallel", o.n_parallel, "Sequences decoded together")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_option("--draft", o.draft,
                  "Speculative decoding of a reply running alone: tokens drafted a round, verified in one pass (0: off)")
      ->capture_default_str();
  cmd->add_option("--draft-from", o.draft_from, "Draft source: mtp (the model's MTP head) or lookup (earlier text)")
      ->capture_default_str();
  cmd->add_option("--api-key", o.api_key, "Require 'Authorization: Bearer KEY' (all endpoints but /health)");
  cmd->add_option("-a,--alias", o.alias, "Model name clients use (default: the file name without .gguf)");
  cmd->add_option("--chat-template-file", o.chat_template_file, "Jinja chat template to use instead of the GGUF's");
  cmd->add_option("--chunk", o.chunk, "Prompt tokens per forward call; cache snapshots land on its multiples")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-b,--batch-size", o.batch, "Tokens one scheduler step may process over all sequences")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--queue", o.max_queue, "Requests that may wait for a slot (more: 503)")->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--cache-ram", o.cache_ram_mib, "Prefix cache memory in MiB (0: off)")->capture_default_str();
  cmd->add_option("--cache-dir", o.cache_dir, "Keep the prefix cache across restarts in this directory");
  cmd->add_option("--cache-save-every", o.cache_save_every_s, "Seconds between writes of --cache-dir while serving")
      ->capture_default_str()->check(CLI::Range(1, 86400));
  cmd->add_option("--max-body", o.max_body_bytes, "Largest request body in bytes (more: 413)")->capture_default_str();
  cmd->add_option("--timeout", o.timeout_s, "Seconds to receive a whole request (408) and to write to a client")
      ->capture_default_str()->check(CLI::Range(1, 86400));
  cmd->add_option("--max-connections", o.max_connections, "Open connections (more: 503)")->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--shutdown-grace", o.shutdown_grace_s, "Seconds in-flight requests get on SIGINT/SIGTERM")
      ->capture_default_str()->check(CLI::Range(0, 3600));
  add_backend_options(cmd, o.backend);
  cmd->callback([] {
    o.model_path = model_or_default(o.model_path);
    exit_code = server::run_server(o);
    if (exit_code != 0) fail("the server stopped with an error");
  });
}

}  // namespace regolith::cli
