// Shared pieces of the CPU benchmark: the geometries it runs, repeated timing, backends by name
// with a thread count, random weights in any type, and the host's copy bandwidth (the speed of
// light every GB/s figure is set against).
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/ops.h"
#include "model/qwen4exp_hparams.h"

namespace regolith::bench {

// The per-token geometry of the ops (model-spec §1 names in brackets).
struct Geometry {
  std::string name;
  int64_t H, S, r;                 // n_embd, hc_count, hc_low_rank
  int64_t nh, nkv, hd, n_rot;      // attention heads
  int64_t di, nh_idx, ratio, top_k;  // indexer
  int64_t nk, nv, dk, dv;          // GDN
  int64_t E, k_used, F, F_sh;      // MoE
  int64_t vocab, ctx;              // LM head rows; QSA context the select/attend ops see
};

// "tiny": regolith mkmodel --preset tiny. "medium": Qwen3.8-Flash-Next's per-layer shapes (H 2560,
// 48 v heads of 128, 24 attention heads of 256, experts of 640) with fewer experts, a 32768-token
// vocabulary and 4 layers (3 GDN + 1 QSA), sized for a 2-core, 23 GB machine.
Geometry geometry(const std::string& name);
Qwen4ExpHparams medium_hparams();

struct Timing {
  double mean_s = 0, sd_s = 0;
  int reps = 0;
};

// Runs fn at least min_reps times and until min_seconds have passed (after one warm-up call).
Timing time_it(const std::function<void()>& fn, int min_reps, double min_seconds);

// "ref" or "cpu" (n_threads <= 0: every core), "cpu-avx2" / "cpu-scalar" force a kernel set.
std::unique_ptr<Backend> make_bench_backend(const std::string& name, int n_threads);

// A weight with its own bytes (values ~ N(0, scale²) encoded in `type`, or in its 32-value
// fallback where `type` does not divide the rows).
struct BenchWeight {
  std::vector<uint8_t> bytes;
  Weight w;
  uint64_t n_bytes() const { return bytes.size(); }
};
std::unique_ptr<BenchWeight> random_weight(const std::string& name, GgmlType type, std::array<int64_t, 4> ne,
                                           uint32_t seed, float scale = 0.05f);
std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f);

// memcpy bandwidth of one and of all cores over a buffer far larger than the caches, GB/s
// (bytes read + written).
double copy_bandwidth_gbs(int n_threads);

}  // namespace regolith::bench
