// The endpoints: OpenAI's /v1/chat/completions, /v1/completions and /v1/models, plus /health,
// /metrics (Prometheus), and llama.cpp's /tokenize, /detokenize and /apply-template. Handlers run
// on HTTP worker threads: authenticate, parse and validate, submit a typed task to the scheduler,
// then write the response from its result channel while watching for the client to go away.
#pragma once

#include <cstdint>
#include <string>

#include "server/http.h"
#include "server/metrics.h"
#include "server/openai_request.h"
#include "server/scheduler.h"

namespace regolith::server {

struct ServerContext {
  ModelInfo model;
  Scheduler* scheduler = nullptr;
  Metrics* metrics = nullptr;
  HttpServer* http = nullptr;
  std::string api_key;  // empty: no authentication
  int64_t started = 0;  // unix seconds
};

void register_routes(HttpServer& http, ServerContext& ctx);

}  // namespace regolith::server
