// `regolith bench`: prefill and decode speed of a GGUF on a backend, in the style of llama-bench.
// For each context depth the session is filled once (untimed) and snapshotted; every repetition
// restores the snapshot outside the timed window, then times a prefill of P tokens (logits of the
// last token only) or N single-token decode steps. Tokens are random ids (tokenization and
// sampling are not timed). Decode is also accounted in bytes: the weight bytes one token reads
// (dense weights once, k of E experts, embedding and n-gram rows) times tokens/s, and that as a
// share of the backend's measured device-to-device copy bandwidth (bytes read + written). "issue
// ms/token" is the host's time to issue a decode step: on the GPU, a value near ms/token means
// decode is bound by launching work, not by the device. Decode steps run as `regolith run`
// decodes (Session::queue_step): step t+1 is issued before step t's logits are read, and gets its
// token once they are on the host. With --serial a second row issues each step only after the last
// one's logits are read; with --queued another issues the steps back to back and reads logits only
// after the last: no real decoding works that way (a step's token comes from the last one's
// logits), but the difference between the rows is what the wait between steps costs. With --batch,
// rows "tgN xB" decode B sequences at the depth together, one eval_batch pass a token each (as the
// server decodes several replies): t/s counts the tokens of all B. With --draft K, rows
// "tgN draft K" decode speculatively (spec/speculative.h) with K drafts a round — the MTP head's
// when the model has one, else the next K random ids — and a forced choice that keeps every draft
// ("all kept") or none ("none kept"): the bounds of what verification costs, whatever the drafts'
// quality (K drafts every round: `run` and `serve` draft fewer after rejections); t/s counts the
// tokens emitted.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/token_list.h"
#include "core/error.h"
#include "runtime/session.h"
#include "spec/speculative.h"

namespace regolith::cli {
namespace {

struct BenchArgs {
  std::string model, prompts = "512", depths = "0", batches;
  BackendOptions backend;
  int64_t n_gen = 128, reps = 5, fill_chunk = 2048, draft = 0;
  bool serial = false, queued = false;
  uint32_t seed = 1;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Median bytes/s of a 1 GiB device-to-device copy, counting bytes read plus bytes written.
double copy_bandwidth(Backend& be) {
  const int64_t n = int64_t{1} << 28;  // floats
  Tensor a = be.alloc_f32(n), b = be.alloc_f32(n);
  float probe = 0;
  std::vector<double> rates;
  for (int i = 0; i < 6; ++i) {
    be.read(b, &probe, sizeof probe);  // drains the queue before the clock starts
    auto t0 = Clock::now();
    be.copy(a, 0, b, 0, n);
    be.read(b, &probe, sizeof probe);
    if (i > 0) rates.push_back(2.0 * 4 * n / seconds_since(t0));
  }
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

struct Stats {
  double median = 0, stddev = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double mean = 0, var = 0;
  for (double x : v) mean += x / v.size();
  for (double x : v) var += (x - mean) * (x - mean) / std::max<size_t>(1, v.size() - 1);
  return {v[v.size() / 2], std::sqrt(var)};
}

std::vector<int32_t> random_tokens(int64_t n, int64_t n_vocab, std::mt19937& rng) {
  std::vector<int32_t> out(n);
  for (int32_t& t : out) t = static_cast<int32_t>(rng() % n_vocab);
  return out;
}

// The --draft rows at one depth (at least one token: a draft follows an evaluated token).
void speculative_rows(const BenchArgs& a, const std::shared_ptr<Engine>& engine, int32_t depth, std::mt19937& rng) {
  const int64_t V = engine->n_vocab();
  const bool mtp = engine->model().has_mtp();
  Session s(engine);
  if (mtp) s.enable_mtp();
  s.eval(random_tokens(std::max(depth, 1), V, rng), {.chunk = a.fill_chunk, .all_logits = false});
  const SessionSnapshot start = s.snapshot();
  for (bool keep_all : {true, false}) {
    std::vector<double> rates;
    SpeculativeStats last;
    for (int64_t r = 0; r < a.reps + 1; ++r) {
      s.restore(start);
      const std::vector<int32_t> ids = random_tokens(a.n_gen + a.draft + 1, V, rng);
      int64_t emitted = 0;
      std::vector<int32_t> drafts;
      size_t chosen = 0;  // choices made in this round
      const Drafter drafter = [&](int32_t next, int64_t k) {
        const auto from = ids.begin() + emitted + 1;
        drafts = mtp ? s.draft_mtp(next, k) : std::vector<int32_t>(from, from + k);
        chosen = 0;
        return drafts;
      };
      // Keeps each draft, or refuses the first; past the drafts, the next random id.
      const ChooseToken choose = [&](std::span<const float>) {
        const size_t j = chosen++;
        if (j >= drafts.size()) return ids[static_cast<size_t>(emitted) + j + 1];
        return keep_all ? drafts[j] : static_cast<int32_t>((drafts[j] + 1) % V);
      };
      Speculator spec(s, drafter, a.draft, DraftCount::Fixed);  // bounds: every round drafts K
      int32_t next = ids[0];
      auto t0 = Clock::now();
      while (emitted < a.n_gen) {
        const std::vector<int32_t> out = spec.round(next, choose, a.n_gen - emitted);
        emitted += static_cast<int64_t>(out.size());
        next = out.back();
      }
      if (r > 0) rates.push_back(static_cast<double>(a.n_gen) / seconds_since(t0));
      last = spec.stats();
    }
    Stats st = stats(rates);
    std::printf("| tg%lld draft %lld %s %s | %d | %.1f ± %.1f | %.3f | | | |\n", (long long)a.n_gen, (long long)a.draft,
                mtp ? "mtp" : "ids", keep_all ? "all kept" : "none kept", depth, st.median, st.stddev, 1e3 / st.median);
    std::fprintf(stderr, "  (%lld rounds, %lld drafts, %lld kept)\n", (long long)last.rounds, (long long)last.drafted,
                 (long long)last.accepted);
    std::fflush(stdout);
  }
}

void run_bench(const BenchArgs& a) {
  std::vector<int32_t> prompts = parse_token_list(a.prompts), depths = parse_token_list(a.depths);
  std::vector<int32_t> batches = a.batches.empty() ? std::vector<int32_t>{} : parse_token_list(a.batches);
  if (a.reps < 1) fail("-r must be at least 1");
  auto t_load = Clock::now();
  auto engine = Engine::open(a.model, a.backend);
  Backend& be = engine->backend();
  const int64_t V = engine->n_vocab();
  std::mt19937 rng(a.seed);
  {
    Session warm(engine);  // uploads every weight a token touches (first use), outside all timings
    warm.eval(random_tokens(2, V, rng), {.all_logits = false});
  }
  const double load_s = seconds_since(t_load);
  const Qwen4ExpModel& model = engine->model();
  const double token_bytes = static_cast<double>(decode_weight_bytes(model.hparams(), model.weights()));
  const double copy_bw = copy_bandwidth(be);
  std::printf("model %s, backend %s, load + first token %.1f s\n", a.model.c_str(), std::string(be.name()).c_str(),
              load_s);
  std::printf("decode reads %.3f GB of weights per token; measured copy bandwidth %.0f GB/s\n\n", token_bytes / 1e9,
              copy_bw / 1e9);
  std::printf("| test | depth | t/s (median ± sd, %lld runs) | ms/token | issue ms/token | decode GB/s | of copy bw |\n",
              (long long)a.reps);
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  std::fflush(stdout);
  for (int32_t depth : depths) {
    Session s(engine);
    if (depth > 0) s.eval(random_tokens(depth, V, rng), {.chunk = a.fill_chunk, .all_logits = false});
    SessionSnapshot at_depth = s.snapshot();
    for (int32_t P : prompts) {
      if (P <= 0) continue;
      std::vector<double> rates;
      std::vector<int32_t> tokens = random_tokens(P, V, rng);
      for (int64_t r = 0; r < a.reps + 1; ++r) {  // the first run warms caches and scratch buffers
        s.restore(at_depth);
        auto t0 = Clock::now();
        s.eval(tokens, {.chunk = 0, .all_logits = false});
        if (r > 0) rates.push_back(P / seconds_since(t0));
      }
      Stats st = stats(rates);
      std::printf("| pp%d | %d | %.1f ± %.1f | %.3f | | | |\n", P, depth, st.median, st.stddev, 1e3 / st.median);
      std::fflush(stdout);
    }
    enum class Steps { pipelined, serial, queued };
    // Decode steps one token at a time, each given its token once the last one's logits are read
    // (pipelined: issued before that read; serial: after it), or queued without logits but the last.
    auto decode = [&](Steps mode) {
      std::vector<double> rates, issue_ms;
      std::vector<int32_t> tokens = random_tokens(a.n_gen, V, rng);
      for (int64_t r = 0; r < a.reps + 1; ++r) {
        s.restore(at_depth);
        double issue = 0, step_issue = 0;
        auto t0 = Clock::now();
        for (size_t i = 0; i < tokens.size(); ++i) {
          if (mode == Steps::pipelined) {  // issue: queuing the step and giving its token
            auto t_issue = Clock::now();
            s.queue_step();
            issue += seconds_since(t_issue);
            if (i > 0) s.step_logits();
            t_issue = Clock::now();
            s.give_token(tokens[i]);
            issue += seconds_since(t_issue);
            continue;
          }
          s.eval(std::span<const int32_t>(&tokens[i], 1),
                 {.all_logits = false, .issue_seconds = &step_issue,
                  .read_logits = mode == Steps::serial || i + 1 == tokens.size()});
          issue += step_issue;
        }
        if (mode == Steps::pipelined) s.step_logits();
        if (r > 0) rates.push_back(a.n_gen / seconds_since(t0)), issue_ms.push_back(1e3 * issue / a.n_gen);
      }
      Stats st = stats(rates);
      double gbs = token_bytes * st.median / 1e9;
      const char* suffix = mode == Steps::serial ? " serial" : mode == Steps::queued ? " queued" : "";
      std::printf("| tg%lld%s | %d | %.1f ± %.1f | %.3f | %.3f | %.0f | %.1f%% |\n", (long long)a.n_gen, suffix, depth,
                  st.median, st.stddev, 1e3 / st.median, stats(issue_ms).median, gbs, 100.0 * gbs * 1e9 / copy_bw);
      std::fflush(stdout);
    };
    if (a.n_gen > 0) {
      decode(Steps::pipelined);
      if (a.serial) decode(Steps::serial);
      if (a.queued) decode(Steps::queued);
    }
    if (a.draft > 0 && a.n_gen > 0) speculative_rows(a, engine, depth, rng);
    for (int32_t B : batches) {
      if (B < 2 || a.n_gen <= 0) continue;
      std::vector<std::unique_ptr<Session>> owned;
      std::vector<Session*> batch;
      for (int32_t i = 0; i < B; ++i) batch.push_back(owned.emplace_back(std::make_unique<Session>(engine)).get());
      std::vector<double> rates;
      for (int64_t r = 0; r < a.reps + 1; ++r) {
        for (Session* sq : batch) sq->restore(at_depth);
        std::vector<int32_t> tokens = random_tokens(a.n_gen * B, V, rng);
        auto t0 = Clock::now();
        for (int64_t i = 0; i < a.n_gen; ++i) eval_batch(batch, std::span(tokens).subspan(i * B, B));
        if (r > 0) rates.push_back(static_cast<double>(a.n_gen * B) / seconds_since(t0));
      }
      Stats st = stats(rates);
      std::printf("| tg%lld x%d | %d | %.1f ± %.1f | %.3f | | | |\n", (long long)a.n_gen, B, depth, st.median, st.stddev,
                  1e3 / st.median);
      std::fflush(stdout);
    }
  }
}

}  // namespace

void add_bench(CLI::App& app) {
  static BenchArgs a;
  auto* cmd = app.add_subcommand("bench", "Prefill and decode speed at context depths (llama-bench style)");
  cmd->add_option("-m,--model", a.model, "Model GGUF")->required();
  cmd->add_option("-p,--n-prompt", a.prompts, "Prefill lengths, comma-separated")->capture_default_str();
  cmd->add_option("-n,--n-gen", a.n_gen, "Decode steps per run (0: none)")->capture_default_str();
  cmd->add_option("-d,--depth", a.depths, "Context depths, comma-separated")->capture_default_str();
  cmd->add_option("-r,--repetitions", a.reps, "Timed runs per test (median reported)")->capture_default_str();
  add_backend_options(cmd, a.backend);
  cmd->add_option("--fill-chunk", a.fill_chunk, "Tokens per forward call when filling the context to a depth")
      ->capture_default_str();
  cmd->add_option("--seed", a.seed, "Seed of the random token ids")->capture_default_str();
  cmd->add_option("--batch", a.batches,
                  "Also time decode of this many sequences at once, one forward pass a token each "
                  "(comma-separated, e.g. 2,4,8)");
  cmd->add_option("--draft", a.draft,
                  "Also time speculative decode with this many drafts a round, every draft kept and none kept "
                  "(the MTP head drafts when the model has one)");
  cmd->add_flag("--serial", a.serial,
                "Also time decode with each step issued only after the last one's logits are read (no step "
                "issued ahead)");
  cmd->add_flag("--queued", a.queued,
                "Also time decode with the steps queued back to back (no logits read between them): the "
                "device's own time per token, without the wait and the host's work between steps");
  cmd->callback([] { run_bench(a); });
}

}  // namespace regolith::cli
