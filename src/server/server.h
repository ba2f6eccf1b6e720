// `regolith serve`: wires the engine, tokenizer, scheduler, prefix cache (and its disk store) and
// the HTTP routes together, then serves until SIGINT or SIGTERM. Shutdown is graceful: stop
// accepting, let requests in flight finish (up to a grace period), stop the scheduler, persist the
// prefix cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backend/ops.h"

namespace regolith::server {

struct ServerOptions {
  std::string model_path;
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (printed at startup)
  int64_t n_ctx = 0;           // 0: the model's training context
  int n_parallel = 4;
  std::string api_key;
  std::string alias;           // the model id clients use; default: the file name without .gguf
  BackendOptions backend;
  std::string chat_template_file;  // overrides the GGUF's template
  int64_t chunk = 256;
  int64_t batch = 512;
  int max_queue = 64;
  size_t cache_ram_mib = 1024;
  std::string cache_dir;
  int cache_save_every_s = 60;  // also written this often while serving (a crash loses less)
  size_t max_body_bytes = 8 * 1024 * 1024;
  int timeout_s = 30;          // to receive a whole request; also the write timeout
  int max_connections = 128;
  int shutdown_grace_s = 10;
  int64_t draft = 0;               // speculative decoding of a reply running alone: drafts a round
  std::string draft_from = "mtp";  // mtp or lookup
};

int run_server(const ServerOptions& options);  // blocks; returns the process exit code

}  // namespace regolith::server
