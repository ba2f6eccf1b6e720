#include "server/metrics.h"

#include <cstdio>

#include "server/prefix_cache.h"

namespace regolith::server {
namespace {

void line(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void value(std::string& out, const std::string& series, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " %.17g\n", v);
  out += series;
  out += buf;
}

void metric(std::string& out, const char* name, const char* type, const char* help, double v) {
  line(out, name, type, help);
  value(out, name, v);
}

}  // namespace

const char* endpoint_name(Endpoint e) {
  switch (e) {
    case Endpoint::chat: return "chat_completions";
    case Endpoint::completions: return "completions";
    case Endpoint::models: return "models";
    case Endpoint::health: return "health";
    case Endpoint::metrics: return "metrics";
    case Endpoint::tokenize: return "tokenize";
    default: return "other";
  }
}

void Metrics::count_response(Endpoint e, int status) {
  int cls = status >= 500 ? 2 : status >= 400 ? 1 : 0;
  responses[static_cast<size_t>(e)][static_cast<size_t>(cls)].fetch_add(1, std::memory_order_relaxed);
}

void Metrics::observe_latency(double seconds) {
  size_t i = 0;
  while (i < kLatencyBuckets.size() && seconds > kLatencyBuckets[i]) ++i;
  latency_counts[i].fetch_add(1, std::memory_order_relaxed);
  latency_us_sum.fetch_add(static_cast<int64_t>(seconds * 1e6), std::memory_order_relaxed);
}

std::string render_prometheus(const Metrics& m, const PrefixCacheStats& cache, int64_t cache_budget_bytes,
                              int http_connections) {
  std::string out;
  line(out, "regolith_http_responses_total", "counter", "HTTP responses by endpoint and status class.");
  const char* classes[] = {"2xx", "4xx", "5xx"};
  for (int e = 0; e < static_cast<int>(Endpoint::count); ++e)
    for (int c = 0; c < 3; ++c)
      value(out,
            std::string("regolith_http_responses_total{endpoint=\"") + endpoint_name(static_cast<Endpoint>(e)) +
                "\",code=\"" + classes[c] + "\"}",
            static_cast<double>(m.responses[e][c].load()));
  metric(out, "regolith_http_connections", "gauge", "Open HTTP connections.", http_connections);
  metric(out, "regolith_requests_rejected_queue_full_total", "counter", "Requests refused because the queue was full.",
         m.rejected_queue_full.load());
  metric(out, "regolith_client_disconnects_total", "counter", "Requests whose client went away before the end.",
         m.client_disconnects.load());
  metric(out, "regolith_requests_started_total", "counter", "Generation requests admitted by the scheduler.",
         m.requests_started.load());
  metric(out, "regolith_requests_finished_total", "counter", "Generation requests completed.", m.requests_finished.load());
  metric(out, "regolith_requests_cancelled_total", "counter", "Generation requests cancelled before completion.",
         m.requests_cancelled.load());
  metric(out, "regolith_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", m.prompt_tokens.load());
  metric(out, "regolith_prompt_tokens_cached_total", "counter", "Prompt tokens restored from the prefix cache.",
         m.cached_tokens.load());
  metric(out, "regolith_prompt_tokens_prefilled_total", "counter", "Prompt tokens run through the model.",
         m.prefilled_tokens.load());
  metric(out, "regolith_generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens.load());
  double prefill_s = m.prefill_ns.load() * 1e-9, decode_s = m.decode_ns.load() * 1e-9;
  metric(out, "regolith_prefill_seconds_total", "counter", "Engine time spent on prompt chunks.", prefill_s);
  metric(out, "regolith_decode_seconds_total", "counter", "Engine time spent on decode steps.", decode_s);
  metric(out, "regolith_prefill_tokens_per_second", "gauge", "Prompt tokens per second of prefill engine time.",
         prefill_s > 0 ? m.prefilled_tokens.load() / prefill_s : 0);
  metric(out, "regolith_decode_tokens_per_second", "gauge", "Generated tokens per second of decode engine time.",
         decode_s > 0 ? m.generated_tokens.load() / decode_s : 0);
  metric(out, "regolith_scheduler_steps_total", "counter", "Scheduler steps run.", m.steps.load());
  metric(out, "regolith_batched_decode_steps_total", "counter",
         "Forward passes that decoded several sequences at once.", m.batched_steps.load());
  metric(out, "regolith_batched_decode_tokens_total", "counter", "Tokens decoded by those passes.",
         m.batched_tokens.load());
  metric(out, "regolith_speculative_rounds_total", "counter", "Speculative rounds (drafts verified in one pass).",
         m.draft_rounds.load());
  metric(out, "regolith_speculative_drafted_tokens_total", "counter", "Tokens drafted.", m.drafted_tokens.load());
  metric(out, "regolith_speculative_accepted_tokens_total", "counter", "Drafted tokens that were kept.",
         m.accepted_drafts.load());
  metric(out, "regolith_queue_depth", "gauge", "Requests waiting for a slot.", m.queue_depth.load());
  metric(out, "regolith_active_sequences", "gauge", "Sequences being prefilled or decoded.", m.active_sequences.load());
  metric(out, "regolith_slots_total", "gauge", "Sessions the scheduler runs at once (--parallel).", m.slots_total.load());
  metric(out, "regolith_slots_busy", "gauge", "Sessions in use.", m.slots_busy.load());
  metric(out, "regolith_prefix_cache_hits_total", "counter", "Requests that restored a cached prefix.", cache.hits.load());
  metric(out, "regolith_prefix_cache_misses_total", "counter", "Requests with no usable cached prefix.",
         cache.misses.load());
  metric(out, "regolith_prefix_cache_hit_tokens_total", "counter", "Tokens restored from cached prefixes.",
         cache.hit_tokens.load());
  metric(out, "regolith_prefix_cache_entries", "gauge", "Snapshots in the prefix cache.", cache.entries.load());
  metric(out, "regolith_prefix_cache_bytes", "gauge", "Bytes held by the prefix cache.", cache.bytes.load());
  metric(out, "regolith_prefix_cache_budget_bytes", "gauge", "Prefix cache memory budget.",
         static_cast<double>(cache_budget_bytes));
  metric(out, "regolith_prefix_cache_evictions_total", "counter", "Snapshots evicted to stay in budget.",
         cache.evictions.load());
  metric(out, "regolith_snapshots_taken_total", "counter", "Session snapshots taken.", m.snapshots_taken.load());
  line(out, "regolith_request_duration_seconds", "histogram", "End-to-end latency of generation requests.");
  int64_t cumulative = 0;
  for (size_t i = 0; i <= Metrics::kLatencyBuckets.size(); ++i) {
    cumulative += m.latency_counts[i].load();
    char le[32];
    if (i < Metrics::kLatencyBuckets.size()) std::snprintf(le, sizeof le, "%g", Metrics::kLatencyBuckets[i]);
    else std::snprintf(le, sizeof le, "+Inf");
    value(out, std::string("regolith_request_duration_seconds_bucket{le=\"") + le + "\"}", static_cast<double>(cumulative));
  }
  value(out, "regolith_request_duration_seconds_sum", m.latency_us_sum.load() * 1e-6);
  value(out, "regolith_request_duration_seconds_count", static_cast<double>(cumulative));
  return out;
}

}  // namespace regolith::server
