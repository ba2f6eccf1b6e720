#include "bench_common.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "quant/recipe.h"
#include "quant/rows.h"

namespace regolith::bench {

Geometry geometry(const std::string& name) {
  if (name == "tiny")
    return {.name = "tiny", .H = 128, .S = 4, .r = 32, .nh = 4, .nkv = 2, .hd = 32, .n_rot = 8, .di = 32, .nh_idx = 2,
            .ratio = 4, .top_k = 16, .nk = 2, .nv = 4, .dk = 32, .dv = 32, .E = 8, .k_used = 2, .F = 32, .F_sh = 32,
            .vocab = 512, .ctx = 256};
  if (name == "medium")
    return {.name = "medium", .H = 2560, .S = 4, .r = 320, .nh = 24, .nkv = 2, .hd = 256, .n_rot = 64, .di = 128,
            .nh_idx = 4, .ratio = 4, .top_k = 2048, .nk = 16, .nv = 48, .dk = 128, .dv = 128, .E = 32, .k_used = 10,
            .F = 640, .F_sh = 640, .vocab = 32768, .ctx = 8192};
  fail("unknown geometry '", name, "' (known: tiny, medium)");
}

Qwen4ExpHparams medium_hparams() {
  Geometry g = geometry("medium");
  Qwen4ExpHparams hp;
  hp.n_vocab = g.vocab;
  hp.n_embd = g.H;
  hp.n_layer = 4;
  hp.n_head = g.nh, hp.n_head_kv = g.nkv, hp.head_dim = g.hd, hp.n_rot = g.n_rot;
  hp.rope_sections = {11, 11, 10, 0};
  hp.indexer_n_head = g.nh_idx, hp.indexer_head_dim = g.di, hp.indexer_top_k = g.top_k;
  hp.ssm_conv_kernel = 4, hp.ssm_k_head_dim = g.dk, hp.ssm_v_head_dim = g.dv, hp.ssm_n_k_heads = g.nk,
  hp.ssm_n_v_heads = g.nv;
  hp.n_expert = g.E, hp.n_expert_used = g.k_used, hp.n_ff_exp = g.F, hp.n_ff_shexp = g.F_sh;
  hp.hc_count = g.S, hp.hc_low_rank = g.r;
  hp.ple_heads_per_ngram = 8, hp.ple_row_dim = 160;
  hp.ple_eos_token_id = g.vocab - 3;
  hp.n_ctx_train = 262144;
  hp.rms_eps = 1e-6;
  hp.rope_theta = 1e7;
  for (int64_t il = 0; il < hp.n_layer; ++il) {
    hp.is_recurrent.push_back((il + 1) % 4 != 0);
    hp.compress_ratios.push_back(hp.is_recurrent.back() ? 0 : g.ratio);
  }
  hp.ple_layers = {1};
  hp.ple_ngram_size = 3;
  hp.ple_conv_kernel = 4;
  return hp;
}

Timing time_it(const std::function<void()>& fn, int min_reps, double min_seconds) {
  using clock = std::chrono::steady_clock;
  fn();
  std::vector<double> t;
  auto start = clock::now();
  while (static_cast<int>(t.size()) < min_reps || std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    auto t0 = clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(clock::now() - t0).count());
  }
  Timing r;
  r.reps = static_cast<int>(t.size());
  for (double v : t) r.mean_s += v / r.reps;
  for (double v : t) r.sd_s += (v - r.mean_s) * (v - r.mean_s) / std::max(1, r.reps - 1);
  r.sd_s = std::sqrt(r.sd_s);
  return r;
}

std::unique_ptr<Backend> make_bench_backend(const std::string& name, int n_threads) {
  if (name == "cpu") return std::make_unique<CpuBackend>(CpuOptions{.n_threads = n_threads});
  if (name == "cpu-avx2") return std::make_unique<CpuBackend>(CpuOptions{.n_threads = n_threads, .isa = cpu::Isa::avx2});
  if (name == "cpu-scalar")
    return std::make_unique<CpuBackend>(CpuOptions{.n_threads = n_threads, .isa = cpu::Isa::scalar});
  return make_backend(name);
}

std::vector<float> random_values(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

std::unique_ptr<BenchWeight> random_weight(const std::string& name, GgmlType type, std::array<int64_t, 4> ne,
                                           uint32_t seed, float scale) {
  auto o = std::make_unique<BenchWeight>();
  o->w.name = name;
  // Rows that a 256-value type does not divide (the HC up's 320, the expert down's 640) take the
  // type regolith quantize would give them.
  if (ne[0] % traits(type).block_size != 0) type = row_fallback_type(type);
  o->w.type = type;
  o->w.ne = ne;
  o->w.row_bytes = row_bytes(type, ne[0]);
  o->bytes.resize(o->w.row_bytes * o->w.n_rows());
  // One random row block, repeated: the values do not matter for timing, only their type.
  constexpr int64_t kDistinctRows = 64;
  int64_t distinct = std::min(kDistinctRows, o->w.n_rows());
  std::vector<float> v = random_values(static_cast<size_t>(distinct * ne[0]), seed, scale);
  for (int64_t r = 0; r < distinct; ++r) quantize_row(type, v.data() + r * ne[0], ne[0], o->bytes.data() + r * o->w.row_bytes);
  for (int64_t r = distinct; r < o->w.n_rows(); ++r)
    std::memcpy(o->bytes.data() + r * o->w.row_bytes, o->bytes.data() + (r % distinct) * o->w.row_bytes, o->w.row_bytes);
  o->w.data = o->bytes.data();
  return o;
}

double copy_bandwidth_gbs(int n_threads) {
  size_t n = size_t(1) << 28;  // 256 MiB each way
  std::vector<uint8_t> src(n, 1), dst(n, 0);
  auto copy = [&] {
    std::vector<std::thread> th;
    for (int i = 0; i < n_threads; ++i)
      th.emplace_back([&, i] {
        size_t b = n * i / n_threads, e = n * (i + 1) / n_threads;
        std::memcpy(dst.data() + b, src.data() + b, e - b);
      });
    for (auto& t : th) t.join();
  };
  Timing t = time_it(copy, 3, 0.5);
  return 2.0 * n / t.mean_s / 1e9;
}

}  // namespace regolith::bench
