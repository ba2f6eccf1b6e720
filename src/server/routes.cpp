#include "server/routes.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "core/error.h"
#include "server/api_error.h"
#include "server/stream.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {
namespace {

using Clock = std::chrono::steady_clock;
using Handler = std::function<int(const HttpRequest&, HttpResponder&)>;  // returns the status sent

void send_json(HttpResponder& res, int status, const Json& body) { res.send(status, "application/json", json_text(body)); }

int send_error(HttpResponder& res, const ApiError& e) {
  send_json(res, e.status, error_json(e.status, e.what(), e.param, e.code));
  return e.status;
}

bool same_secret(const std::string& a, const std::string& b) {  // time independent of where they differ
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string random_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  const char* alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += alphabet[rng() % 62];
  return id;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Nesting depth of JSON text (brackets outside strings). Deeply nested values would reach
// recursive code later (copies, the template's tojson), so they are refused before parsing.
size_t json_depth(std::string_view s) {
  size_t depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max_depth;
}

Json parse_body(const HttpRequest& req) {
  constexpr size_t kMaxDepth = 64;
  if (req.body.empty()) throw invalid_request("the request body is empty; expected a JSON object", "body", "invalid_json");
  if (json_depth(req.body) > kMaxDepth)
    throw invalid_request(cat("the request body nests deeper than ", kMaxDepth, " levels"), "body", "invalid_json");
  try {
    return Json::parse(req.body);
  } catch (const Json::parse_error& e) {
    throw invalid_request(std::string("the request body is not valid JSON: ") + e.what(), "body", "invalid_json");
  }
}

// Wraps a handler with authentication, error shaping, CORS and response counting.
HttpHandler guarded(ServerContext& ctx, Endpoint endpoint, bool needs_auth, Handler handler) {
  return [&ctx, endpoint, needs_auth, handler = std::move(handler)](const HttpRequest& req, HttpResponder& res) {
    res.add_header("Access-Control-Allow-Origin", "*");
    int status;
    try {
      if (needs_auth && !ctx.api_key.empty()) {
        std::string auth = req.header("Authorization");
        if (!auth.starts_with("Bearer ") || !same_secret(auth.substr(7), ctx.api_key))
          throw ApiError(401, "Incorrect or missing API key (send 'Authorization: Bearer KEY').", {}, "invalid_api_key");
      }
      status = handler(req, res);
    } catch (const ApiError& e) {
      status = send_error(res, e);
    } catch (const Error& e) {
      status = send_error(res, ApiError(400, e.what()));
    } catch (const std::exception& e) {
      status = send_error(res, ApiError(500, std::string("internal error: ") + e.what()));
    }
    ctx.metrics->count_response(endpoint, status);
  };
}

// Submits the tasks, then writes the response from the result channel. A client that goes away
// (seen on the socket, or a failed write) cancels the request, which frees its slots at once.
int run_generation(ServerContext& ctx, HttpResponder& res, std::vector<GenerationTask> tasks,
                   std::unique_ptr<ResponseWriter> writer, Clock::time_point t0) {
  if (ctx.http->stopping()) throw ApiError(503, "the server is shutting down", {}, "shutting_down");
  auto results = std::make_shared<ResultChannel>();
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  switch (ctx.scheduler->submit({std::move(tasks), results, cancelled, Clock::now()})) {
    case Scheduler::Admission::accepted: break;
    case Scheduler::Admission::queue_full:
      ++ctx.metrics->rejected_queue_full;
      res.add_header("Retry-After", "1");
      throw ApiError(503, "the server is busy: the request queue is full; retry later", {}, "queue_full");
    case Scheduler::Admission::stopping: throw ApiError(503, "the server is shutting down", {}, "shutting_down");
  }
  writer->begin();
  auto last_check = Clock::now();
  while (true) {
    std::optional<ResultEvent> e = results->pop(std::chrono::milliseconds(20));
    if (e && !writer->feed(*e)) break;
    auto now = Clock::now();
    if (res.broken() || (now - last_check > std::chrono::milliseconds(10) && res.peer_closed())) {
      cancelled->store(true);
      ++ctx.metrics->client_disconnects;
      res.set_keep_alive(false);
      if (!res.responded()) res.send(499, "application/json", "");
      return 499;  // nginx's "client closed request", for the counters
    }
    if (now - last_check > std::chrono::milliseconds(10)) last_check = now;
  }
  ctx.metrics->observe_latency(std::chrono::duration<double>(Clock::now() - t0).count());
  return writer->status();
}

int chat_completions(ServerContext& ctx, const HttpRequest& req, HttpResponder& res) {
  auto t0 = Clock::now();
  Json body = parse_body(req);
  ChatRequest r = parse_chat_request(body, ctx.model);
  ResponseMeta meta{random_id("chatcmpl-"), unix_now(), ctx.model.id, r.stream, r.include_usage, r.task.n_choices, 1};
  auto writer = std::make_unique<ChatResponseWriter>(meta, *ctx.model.tokenizer, res, r);
  return run_generation(ctx, res, {r.task}, std::move(writer), t0);
}

int completions(ServerContext& ctx, const HttpRequest& req, HttpResponder& res) {
  auto t0 = Clock::now();
  Json body = parse_body(req);
  CompletionRequest r = parse_completion_request(body, ctx.model);
  int n_choices = static_cast<int>(r.tasks.size()) * r.tasks.front().n_choices;
  ResponseMeta meta{random_id("cmpl-"), unix_now(), ctx.model.id, r.stream, r.include_usage, n_choices,
                    static_cast<int>(r.tasks.size())};
  auto writer = std::make_unique<CompletionResponseWriter>(meta, *ctx.model.tokenizer, res, r);
  return run_generation(ctx, res, r.tasks, std::move(writer), t0);
}

Json model_object(const ServerContext& ctx) {
  return {{"id", ctx.model.id},
          {"object", "model"},
          {"created", ctx.started},
          {"owned_by", "regolith"},
          {"meta", {{"n_ctx", ctx.model.n_ctx}, {"n_vocab", ctx.model.n_vocab}}}};
}

int tokenize(ServerContext& ctx, const HttpRequest& req, HttpResponder& res) {
  Json body = parse_body(req);
  if (!body.is_object() || !body.contains("content") || !body["content"].is_string())
    throw invalid_request("expected {\"content\": string}", "content");
  bool add_special = body.value("add_special", false);
  std::vector<int32_t> ids = ctx.model.tokenizer->encode(body["content"].get<std::string>(), {.add_special = add_special});
  send_json(res, 200, {{"tokens", ids}});
  return 200;
}

int detokenize(ServerContext& ctx, const HttpRequest& req, HttpResponder& res) {
  Json body = parse_body(req);
  if (!body.is_object() || !body.contains("tokens") || !body["tokens"].is_array())
    throw invalid_request("expected {\"tokens\": [ids]}", "tokens");
  std::vector<int32_t> ids;
  for (const Json& v : body["tokens"]) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= ctx.model.n_vocab)
      throw invalid_request("tokens must be ids of this model's vocabulary", "tokens", "invalid_token_id");
    ids.push_back(v.get<int32_t>());
  }
  send_json(res, 200, {{"content", ctx.model.tokenizer->decode(ids)}});
  return 200;
}

int apply_template(ServerContext& ctx, const HttpRequest& req, HttpResponder& res) {
  Json body = parse_body(req);
  ChatRequest r = parse_chat_request(body, ctx.model);
  send_json(res, 200, {{"prompt", r.prompt_text}, {"tokens", r.task.prompt}});
  return 200;
}

}  // namespace

void register_routes(HttpServer& http, ServerContext& ctx) {
  auto post = [&](const char* path, Endpoint e, int (*fn)(ServerContext&, const HttpRequest&, HttpResponder&)) {
    http.route("POST", path, guarded(ctx, e, true, [&ctx, fn](const HttpRequest& q, HttpResponder& r) { return fn(ctx, q, r); }));
  };
  post("/v1/chat/completions", Endpoint::chat, chat_completions);
  post("/chat/completions", Endpoint::chat, chat_completions);
  post("/v1/completions", Endpoint::completions, completions);
  post("/completions", Endpoint::completions, completions);
  post("/tokenize", Endpoint::tokenize, tokenize);
  post("/detokenize", Endpoint::tokenize, detokenize);
  post("/apply-template", Endpoint::tokenize, apply_template);

  Handler models = [&ctx](const HttpRequest&, HttpResponder& res) {
    send_json(res, 200, {{"object", "list"}, {"data", Json::array({model_object(ctx)})}});
    return 200;
  };
  Handler one_model = [&ctx](const HttpRequest&, HttpResponder& res) {
    send_json(res, 200, model_object(ctx));
    return 200;
  };
  for (const char* p : {"/v1/models", "/models"}) http.route("GET", p, guarded(ctx, Endpoint::models, true, models));
  for (const char* p : {"/v1/models/", "/models/"})
    http.route("GET", p + ctx.model.id, guarded(ctx, Endpoint::models, true, one_model));

  Handler health = [&ctx](const HttpRequest&, HttpResponder& res) {
    bool stopping = ctx.http->stopping();
    send_json(res, stopping ? 503 : 200, {{"status", stopping ? "shutting down" : "ok"}});
    return stopping ? 503 : 200;
  };
  http.route("GET", "/health", guarded(ctx, Endpoint::health, false, health));
  http.route("GET", "/v1/health", guarded(ctx, Endpoint::health, false, health));

  http.route("GET", "/metrics", guarded(ctx, Endpoint::metrics, true, [&ctx](const HttpRequest&, HttpResponder& res) {
               res.send(200, "text/plain; version=0.0.4; charset=utf-8",
                        render_prometheus(*ctx.metrics, ctx.scheduler->cache_stats(),
                                          static_cast<int64_t>(ctx.scheduler->cache_budget()),
                                          ctx.http->active_connections()));
               return 200;
             }));

  http.set_fallback(guarded(ctx, Endpoint::other, false, [](const HttpRequest& req, HttpResponder& res) {
    if (req.method == "OPTIONS") {  // CORS preflight
      res.add_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.add_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.send(204, "", "");
      return 204;
    }
    throw ApiError(404, cat("Unknown request URL: ", req.method, " ", req.path, ". Please check the URL."), {},
                   "unknown_url");
  }));
  http.set_error_writer([&ctx](HttpResponder& res, int status, const std::string& message) {
    send_json(res, status, error_json(status, message));
    ctx.metrics->count_response(Endpoint::other, status);
  });
}

}  // namespace regolith::server
