// regolith-bench-cpu: times the CPU backend against ref (a benchmark, not a test).
//   ops     each op of ops.h at the tiny or medium geometry, one token count (bench_ops.cpp)
//   decode  whole decode steps of a GGUF: ms/token, GB/s of the weight bytes a token reads, and
//           that as a share of the measured copy bandwidth; also the prompt's prefill rate
//   model   writes a random GGUF of the tiny or medium geometry for `decode`
//   sample  the sampler on one row of logits (the host's share of every generated token)
//   json    the server's JSON-mode token masks on a GGUF's vocabulary (bench_json.cpp)
// Speed is accounted in bytes (style.md practice 8): a decode step reads every dense weight once,
// k of E experts per MoE layer, one embedding row and the PLE rows.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "bench_json.h"
#include "bench_ops.h"
#include "convert/random_model.h"
#include "core/error.h"
#include "runtime/session.h"
#include "sample/sampler.h"

namespace regolith::bench {
namespace {

struct DecodeOptions {
  std::string model;
  std::vector<std::string> backends{"ref", "cpu"};
  int n_threads = 0, prompt = 32, n_decode = 16, n_decode_ref = 3;
};

void bench_decode(const DecodeOptions& o) {
  auto model = Qwen4ExpModel::load(o.model);
  uint64_t bytes = decode_weight_bytes(model->hparams(), model->weights());
  double copy_gbs = copy_bandwidth_gbs(o.n_threads > 0 ? o.n_threads : static_cast<int>(std::thread::hardware_concurrency()));
  std::printf("# decode: %s, %.1f MB of weights per token, copy bandwidth %.1f GB/s\n", o.model.c_str(), bytes / 1e6,
              copy_gbs);
  int n_same = std::min(o.n_decode, o.n_decode_ref);
  std::printf("%-10s %7s %7s %12s %16s %9s %7s  %s\n", "backend", "threads", "prompt", "prefill t/s", "decode ms/tok",
              "GB/s", "% copy", cat("greedy ids 1..", n_same).c_str());
  std::vector<int32_t> prompt(o.prompt);
  for (int i = 0; i < o.prompt; ++i) prompt[i] = static_cast<int32_t>((i * 7919 + 11) % model->hparams().n_vocab);
  for (const std::string& name : o.backends) {
    auto be = make_bench_backend(name, o.n_threads);
    std::string threads = name.rfind("cpu", 0) == 0 ? cat(static_cast<CpuBackend&>(*be).n_threads()) : "-";
    auto engine = std::make_shared<Engine>(model, std::move(be));
    Session s(engine);
    auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = s.eval(prompt, {.all_logits = false});
    double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int n = name == "ref" ? o.n_decode_ref : o.n_decode;
    std::vector<double> step;
    std::string ids;
    for (int i = 0; i < n; ++i) {
      int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (i < n_same) ids += cat(i ? "," : "", next);
      auto t1 = std::chrono::steady_clock::now();
      logits = s.eval(std::vector<int32_t>{next}, {.all_logits = false});
      step.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
    }
    double mean = 0, sd = 0;
    for (double v : step) mean += v / n;
    for (double v : step) sd += (v - mean) * (v - mean) / std::max(1, n - 1);
    sd = std::sqrt(sd);
    double gbs = bytes / mean / 1e9;
    std::printf("%-10s %7s %7d %12.1f %9.2f ± %5.2f %9.2f %6.1f%%  %s\n", name.c_str(), threads.c_str(), o.prompt,
                o.prompt / prefill_s, mean * 1e3, sd * 1e3, gbs, 100 * gbs / copy_gbs, ids.c_str());
    std::fflush(stdout);
  }
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (size_t e; (e = s.find(',', b)) != std::string::npos; b = e + 1) out.push_back(s.substr(b, e - b));
  out.push_back(s.substr(b));
  return out;
}

GgmlType parse_type(const std::string& s) {
  auto t = type_from_name(s);
  if (!t) fail("unknown type '", s, "'");
  return *t;
}

// Sampler::sample on V logits, flat (normal, sd 3) and peaked (sd 2, five far ahead), for run's
// and the server's usual settings: ms per token, median of 5 timings of 10 draws each.
void bench_sample(int64_t V) {
  std::mt19937 gen(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> flat(static_cast<size_t>(V)), peaked(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) flat[i] = 3.0f * nd(gen), peaked[i] = 2.0f * nd(gen) + (i % (V / 5) == 7 ? 18.0f : 0.0f);
  const std::pair<const char*, SamplerParams> settings[] = {
      {"greedy", {.temp = 0}},
      {"run (temp 0.8, top-k 40, top-p 0.95, min-p 0.05)", {}},
      {"top-p 0.9 alone", {.temp = 1, .top_k = 0, .top_p = 0.9f, .min_p = 0}},
      {"no filter (server default)", {.temp = 1, .top_k = 0, .top_p = 1, .min_p = 0}}};
  std::printf("# sampler on %lld logits, ms/token\n%-52s %8s %8s\n", (long long)V, "settings", "flat", "peaked");
  for (const auto& [name, params] : settings) {
    double ms[2];
    for (int k = 0; k < 2; ++k) {
      Sampler s(params);
      std::vector<double> runs;
      for (int r = 0; r < 5; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 10; ++i) s.sample(k == 0 ? flat : peaked);
        runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 100.0);
      }
      std::sort(runs.begin(), runs.end());
      ms[k] = runs[2];
    }
    std::printf("%-52s %8.3f %8.3f\n", name, ms[0], ms[1]);
  }
}

}  // namespace
}  // namespace regolith::bench

int main(int argc, char** argv) {
  using namespace regolith;
  using namespace regolith::bench;
  CLI::App app{"CPU backend benchmark: ref against cpu, per op and per decode step"};
  app.require_subcommand(1);

  OpsOptions ops;
  std::string ops_type = "q8_0", ops_backends = "ref,cpu";
  auto* c_ops = app.add_subcommand("ops", "Time each op at a geometry");
  c_ops->add_option("--geometry", ops.geometry, "tiny | medium")->capture_default_str();
  c_ops->add_option("--type", ops_type, "Weight type of the matrices")->capture_default_str();
  c_ops->add_option("-T,--tokens", ops.T, "Tokens per call (1: decode)")->capture_default_str();
  c_ops->add_option("-t,--threads", ops.n_threads, "cpu threads (0: every core)")->capture_default_str();
  c_ops->add_option("--min-seconds", ops.min_seconds, "Timing window per op and backend")->capture_default_str();
  c_ops->add_option("--backends", ops_backends, "ref, cpu, cpu-avx2, cpu-scalar")->capture_default_str();
  c_ops->add_option("--filter", ops.filter, "Only ops whose name contains this");

  DecodeOptions dec;
  std::string dec_backends = "ref,cpu";
  auto* c_dec = app.add_subcommand("decode", "Time whole decode steps of a GGUF");
  c_dec->add_option("-m,--model", dec.model, "Model GGUF")->required();
  c_dec->add_option("-t,--threads", dec.n_threads, "cpu threads (0: every core)")->capture_default_str();
  c_dec->add_option("--prompt", dec.prompt, "Prompt tokens before decoding")->capture_default_str();
  c_dec->add_option("-n", dec.n_decode, "Decode steps timed (cpu)")->capture_default_str();
  c_dec->add_option("--n-ref", dec.n_decode_ref, "Decode steps timed (ref)")->capture_default_str();
  c_dec->add_option("--backends", dec_backends, "ref, cpu, cpu-avx2, cpu-scalar")->capture_default_str();

  std::string model_out, model_type = "q8_0", model_geometry = "medium";
  auto* c_model = app.add_subcommand("model", "Write a random GGUF of the tiny or medium geometry");
  c_model->add_option("-o,--output", model_out, "Output GGUF")->required();
  c_model->add_option("--geometry", model_geometry, "tiny (= mkmodel --preset tiny) | medium")->capture_default_str();
  c_model->add_option("--type", model_type, "Weight type of the matrices")->capture_default_str();

  int64_t sample_vocab = 248320;
  auto* c_sample = app.add_subcommand("sample", "Time the sampler on one row of logits");
  c_sample->add_option("--vocab", sample_vocab, "Logits per row (the model's vocabulary)")->capture_default_str();

  std::string json_model;
  auto* c_json = app.add_subcommand("json", "Time the server's JSON-mode token masks on a GGUF's vocabulary");
  c_json->add_option("-m,--model", json_model, "GGUF whose tokenizer to use")->required();

  CLI11_PARSE(app, argc, argv);
  try {
    if (*c_ops) {
      ops.type = parse_type(ops_type);
      ops.backends = split_list(ops_backends);
      bench_ops(ops);
    } else if (*c_sample) {
      if (sample_vocab < 5) fail("--vocab: at least 5 logits");
      bench_sample(sample_vocab);
    } else if (*c_json) {
      bench_json(json_model);
    } else if (*c_dec) {
      dec.backends = split_list(dec_backends);
      bench_decode(dec);
    } else if (*c_model) {
      RandomModelOptions o;
      o.hparams = model_geometry == "tiny" ? preset_hparams("tiny", 0) : medium_hparams();
      if (model_geometry != "tiny") geometry(model_geometry);  // rejects unknown names
      o.default_type = parse_type(model_type);
      o.ngram_vocab_size_base = model_geometry == "tiny" ? 100 : 1000;
      o.name = "regolith-bench-" + model_geometry;
      write_random_model(model_out, o);
      std::printf("wrote %s\n", model_out.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
