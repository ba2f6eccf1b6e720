// Server counters for GET /metrics (Prometheus text format 0.0.4). Written by the scheduler and the
// HTTP workers with relaxed atomics; rendered on demand.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace regolith::server {

struct PrefixCacheStats;

enum class Endpoint : int { chat, completions, models, health, metrics, tokenize, other, count };
const char* endpoint_name(Endpoint e);

struct Metrics {
  // HTTP responses by endpoint and status class (2xx, 4xx, 5xx).
  std::array<std::array<std::atomic<int64_t>, 3>, static_cast<size_t>(Endpoint::count)> responses{};
  std::atomic<int64_t> rejected_queue_full{0}, client_disconnects{0};

  // Generation (written by the scheduler).
  std::atomic<int64_t> requests_started{0}, requests_finished{0}, requests_cancelled{0};
  std::atomic<int64_t> prompt_tokens{0}, cached_tokens{0}, prefilled_tokens{0}, generated_tokens{0};
  std::atomic<int64_t> prefill_ns{0}, decode_ns{0}, steps{0};
  std::atomic<int64_t> batched_steps{0}, batched_tokens{0};  // decode steps of several sequences in one pass
  std::atomic<int64_t> draft_rounds{0}, drafted_tokens{0}, accepted_drafts{0};  // speculative decoding
  std::atomic<int64_t> queue_depth{0}, active_sequences{0}, slots_total{0}, slots_busy{0};
  std::atomic<int64_t> snapshots_taken{0}, snapshot_restores{0};

  // End-to-end latency of generation requests, seconds.
  static constexpr std::array<double, 12> kLatencyBuckets{0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                          0.5,   1,    2.5,   5,    10,  30};
  std::array<std::atomic<int64_t>, kLatencyBuckets.size() + 1> latency_counts{};
  std::atomic<int64_t> latency_us_sum{0};

  void count_response(Endpoint e, int status);
  void observe_latency(double seconds);
};

std::string render_prometheus(const Metrics& m, const PrefixCacheStats& cache, int64_t cache_budget_bytes,
                              int http_connections);

}  // namespace regolith::server
