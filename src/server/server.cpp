#include "server/server.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/text_file.h"
#include "gguf/gguf.h"
#include "runtime/session.h"
#include "server/cache_store.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/routes.h"
#include "server/scheduler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace regolith::server {
namespace {

std::optional<ChatTemplate> load_template(const ServerOptions& o, const Tokenizer& tok, std::string& source) {
  if (!o.chat_template_file.empty()) {
    source = read_text_file(o.chat_template_file);
    auto text = [&](int32_t id) { return id == kNoToken ? std::string() : tok.token_text(id); };
    return ChatTemplate(source, text(tok.bos_id()), text(tok.eos_id()));
  }
  if (tok.chat_template().empty()) return std::nullopt;
  source = tok.chat_template();
  return ChatTemplate::from_tokenizer(tok);
}

}  // namespace

int run_server(const ServerOptions& o) {
  // Only the sigwait below sees SIGINT/SIGTERM: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  auto engine = Engine::open(o.model_path, o.backend);
  const GgufFile& gguf = engine->model().file();
  const Qwen4ExpHparams& hp = engine->model().hparams();
  Tokenizer tokenizer = Tokenizer::from_gguf(gguf);
  std::string template_source;
  std::optional<ChatTemplate> chat_template = load_template(o, tokenizer, template_source);

  const int64_t n_ctx = o.n_ctx > 0 ? o.n_ctx : hp.n_ctx_train;
  if (n_ctx < 2) fail("-c: the context must hold at least 2 tokens");
  if (n_ctx > hp.n_ctx_train)
    std::fprintf(stderr, "warning: context %lld is longer than the model's training context %lld\n",
                 static_cast<long long>(n_ctx), static_cast<long long>(hp.n_ctx_train));

  ModelInfo info;
  info.tokenizer = &tokenizer;
  info.chat_template = chat_template ? &*chat_template : nullptr;
  info.xml_tool_calls = template_source.find("<function=") != std::string::npos ||
                        template_source.find("<tool_call>") == std::string::npos;
  info.id = o.alias.empty() ? std::filesystem::path(o.model_path).stem().string() : o.alias;
  info.n_ctx = n_ctx;
  info.n_vocab = hp.n_vocab;
  const JsonVocabulary::Lazy json_vocabulary(tokenizer);
  info.json_vocabulary = &json_vocabulary;

  Metrics metrics;
  Scheduler scheduler(engine, tokenizer,
                      SchedulerOptions{.n_slots = o.n_parallel,
                                       .n_ctx = n_ctx,
                                       .chunk = o.chunk,
                                       .step_tokens = o.batch,
                                       .max_queue = o.max_queue,
                                       .cache_bytes = o.cache_ram_mib << 20,
                                       .draft = o.draft,
                                       .draft_from = o.draft_from},
                      metrics);
  HttpLimits limits;
  limits.max_body_bytes = o.max_body_bytes;
  limits.max_connections = o.max_connections;
  limits.request_deadline = std::chrono::seconds(o.timeout_s);
  limits.write_timeout = std::chrono::seconds(o.timeout_s);
  HttpServer http(limits);
  ServerContext ctx;
  ctx.model = info;
  ctx.scheduler = &scheduler;
  ctx.metrics = &metrics;
  ctx.http = &http;
  ctx.api_key = o.api_key;
  ctx.started = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  register_routes(http, ctx);
  const int port = http.bind(o.host, o.port);

  std::optional<CacheStore> store;
  if (!o.cache_dir.empty()) {
    store.emplace(o.cache_dir, model_identity(o.model_path, gguf.data_offset()), hp.n_vocab, n_ctx);
    std::vector<std::string> warnings;
    auto prefixes = store->load(warnings);
    for (const std::string& w : warnings) std::fprintf(stderr, "warning: prefix cache %s\n", w.c_str());
    if (!prefixes.empty())
      std::fprintf(stderr, "prefix cache: %zu prefixes from %s, rebuilt while idle\n", prefixes.size(), o.cache_dir.c_str());
    scheduler.warm_up(std::move(prefixes));
  }

  scheduler.start();
  std::thread http_thread([&] { http.serve(); });
  std::printf("regolith serve: model '%s' (%s), context %lld, %d slots, prefix cache %zu MiB\n", info.id.c_str(),
              o.model_path.c_str(), static_cast<long long>(n_ctx), o.n_parallel, o.cache_ram_mib);
  std::printf("listening on http://%s:%d\n", o.host.c_str(), port);
  std::fflush(stdout);

  // Wait for SIGINT/SIGTERM; with a cache directory, write it every cache_save_every_s meanwhile.
  int sig = 0;
  std::vector<std::vector<int32_t>> saved;
  while (true) {
    if (!store) {
      sigwait(&signals, &sig);
      break;
    }
    timespec every{std::max(1, o.cache_save_every_s), 0};
    sig = sigtimedwait(&signals, nullptr, &every);
    if (sig == SIGINT || sig == SIGTERM) break;
    auto keys = scheduler.persistent_cache_keys();
    std::sort(keys.begin(), keys.end());
    if (keys == saved) continue;
    try {
      store->save(keys);
      saved = std::move(keys);
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: prefix cache not saved: %s\n", e.what());
    }
  }
  std::fprintf(stderr, "%s: shutting down (in-flight requests get up to %d s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
               o.shutdown_grace_s);
  http.stop(std::chrono::seconds(o.shutdown_grace_s));
  http_thread.join();
  scheduler.stop();
  if (store) {
    auto keys = scheduler.persistent_cache_keys();
    try {
      store->save(keys);
      std::fprintf(stderr, "prefix cache: %zu prefixes saved to %s\n", keys.size(), o.cache_dir.c_str());
    } catch (const Error& e) {
      std::fprintf(stderr, "warning: prefix cache not saved: %s\n", e.what());
    }
  }
  std::fprintf(stderr, "stopped\n");
  return 0;
}

}  // namespace regolith::server
