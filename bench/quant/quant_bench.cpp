// Matvec throughput per weight type: regolith's best dot kernel against llama.cpp v0.5.0's
// vec_dot (libggml's CPU library for this machine, loaded as in tests/quant), on the same
// weight bytes, single- and multi-threaded. A benchmark, not a test: prints a markdown table.
//   regolith_quant_bench [--rows R] [--cols N] [--threads T] [--reps K] [--type NAME]... [--quantize]
// With --quantize it measures quantization instead: rows per second of regolith's quantize_row
// against ggml_quantize_chunk, one thread, with an importance row (Mvalues/s).
// Weights are random Gaussian rows quantized by regolith (256 distinct rows tiled to R), so the
// matrix streams from memory like a real one; activations are quantized once outside timing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/ggml_type.h"
#include "ggml_ref.h"
#include "quant/dot.h"
#include "quant/rows.h"

using namespace regolith;

namespace {

struct Options {
  int64_t rows = 16384, cols = 2560;
  int threads = 2, reps = 7;
  bool quantize = false;
  std::vector<GgmlType> types;
};

using RowDot = float (*)(int64_t n, const void* row, const void* act);

// Seconds for one matvec over all rows, split into contiguous ranges over `threads` threads.
template <typename Dot>
double time_matvec(const Options& o, uint64_t row_bytes, const uint8_t* w, Dot dot, std::vector<float>& y) {
  auto run = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) y[r] = dot(w + r * row_bytes);
  };
  auto t0 = std::chrono::steady_clock::now();
  if (o.threads == 1) {
    run(0, o.rows);
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < o.threads; ++t) pool.emplace_back(run, o.rows * t / o.threads, o.rows * (t + 1) / o.threads);
    for (auto& th : pool) th.join();
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rows") o.rows = std::atoll(next());
    else if (a == "--cols") o.cols = std::atoll(next());
    else if (a == "--threads") o.threads = std::atoi(next());
    else if (a == "--reps") o.reps = std::atoi(next());
    else if (a == "--quantize") o.quantize = true;
    else if (a == "--type") {
      auto t = type_from_name(next());
      if (!t) {
        std::fprintf(stderr, "unknown type %s\n", argv[i]);
        std::exit(2);
      }
      o.types.push_back(*t);
    } else {
      std::fprintf(stderr, "usage: %s [--rows R] [--cols N] [--threads T] [--reps K] [--type NAME]... [--quantize]\n", argv[0]);
      std::exit(2);
    }
  }
  if (o.types.empty())
    o.types = {GgmlType::F32,  GgmlType::F16,    GgmlType::BF16,  GgmlType::Q8_0,   GgmlType::Q4_0,   GgmlType::Q4_1,
               GgmlType::Q5_0, GgmlType::Q5_1,   GgmlType::Q2_0,  GgmlType::MXFP4,  GgmlType::IQ4_NL, GgmlType::Q2_K,
               GgmlType::Q3_K, GgmlType::Q4_K,   GgmlType::Q5_K,  GgmlType::Q6_K,   GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
               GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ4_XS};
  return o;
}

// Quantization speed: `rows` Gaussian rows of `cols` values with a log-normal importance row.
void bench_quantize(const Options& o, const test::GgmlRef& ref) {
  std::printf("quantization, %lld rows x %lld values, 1 thread, with importance (Mvalues/s)\n\n",
              static_cast<long long>(o.rows), static_cast<long long>(o.cols));
  std::printf("| type | regolith | llama.cpp | ratio |\n|---|---:|---:|---:|\n");
  std::mt19937 rng(2);
  std::normal_distribution<float> gauss(0, 1);
  std::vector<float> x(o.rows * o.cols), imp(o.cols);
  for (float& v : x) v = gauss(rng);
  for (float& v : imp) v = std::exp(1.5f * gauss(rng));
  for (GgmlType t : o.types) {
    if (traits(t).block_size == 1 || o.cols % traits(t).block_size != 0) continue;
    const uint64_t rb = row_bytes(t, o.cols);
    std::vector<uint8_t> out(rb * o.rows);
    quantize_row(t, x.data(), o.cols, out.data(), imp.data());  // one-time tables, both sides
    ref.quantize_chunk(static_cast<int>(t), x.data(), out.data(), 0, 1, o.cols, imp.data());
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t r = 0; r < o.rows; ++r) quantize_row(t, x.data() + r * o.cols, o.cols, out.data() + r * rb, imp.data());
    auto t1 = std::chrono::steady_clock::now();
    ref.quantize_chunk(static_cast<int>(t), x.data(), out.data(), 0, o.rows, o.cols, imp.data());
    auto t2 = std::chrono::steady_clock::now();
    const double mv = static_cast<double>(o.rows * o.cols) / 1e6;
    const double a = mv / std::chrono::duration<double>(t1 - t0).count(), b = mv / std::chrono::duration<double>(t2 - t1).count();
    std::printf("| %s | %.2f | %.2f | %.2f |\n", std::string(type_name(t)).c_str(), a, b, a / b);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::string error;
  const test::GgmlRef* ref = test::GgmlRef::load(error);
  if (!ref || !ref->type_traits_cpu) {
    std::fprintf(stderr, "llama.cpp's CPU library is unavailable (%s); run the quant tests' fetch fixture first\n", error.c_str());
    return 1;
  }
  if (o.quantize) {
    bench_quantize(o, *ref);
    return 0;
  }
  std::printf("regolith %s kernels vs llama.cpp v0.5.0 libggml-cpu-%s; %lld x %lld matvec, %d thread(s), median of %d\n\n",
              quant::isa_name(quant::best_isa()), ref->cpu_variant.c_str(), static_cast<long long>(o.rows),
              static_cast<long long>(o.cols), o.threads, o.reps);
  std::printf("| type | bytes/row | regolith GB/s | llama.cpp GB/s | ratio |\n|---|---:|---:|---:|---:|\n");
  std::mt19937 rng(1);
  std::normal_distribution<float> gauss(0, 1);
  for (GgmlType t : o.types) {
    const int64_t n = o.cols;
    try {
      check_row_length(t, n);
    } catch (const std::exception& e) {
      std::printf("| %s | — | %s | | |\n", std::string(type_name(t)).c_str(), e.what());
      continue;
    }
    const uint64_t rb = row_bytes(t, n);
    const int64_t distinct = std::min<int64_t>(256, o.rows);
    std::vector<uint8_t> w(rb * o.rows);
    std::vector<float> x(n);
    for (int64_t r = 0; r < distinct; ++r) {
      for (float& v : x) v = gauss(rng);
      quantize_row(t, x.data(), n, w.data() + r * rb);
    }
    for (int64_t r = distinct; r < o.rows; ++r) std::memcpy(w.data() + r * rb, w.data() + (r % distinct) * rb, rb);
    for (float& v : x) v = gauss(rng);

    std::vector<uint8_t> act(quant::activation_bytes(t, n));
    quant::quantize_activations(t, x.data(), n, act.data());
    const quant::VecDot ours = quant::vec_dot_kernel(t);

    const auto* cpu = ref->type_traits_cpu(static_cast<int>(t));
    const auto* act_traits = ref->type_traits(cpu->vec_dot_type);
    std::vector<uint8_t> ggml_act(static_cast<size_t>(n / act_traits->blck_size * act_traits->type_size));
    if (cpu->vec_dot_type == 0)
      std::memcpy(ggml_act.data(), x.data(), n * 4);
    else
      ref->type_traits_cpu(cpu->vec_dot_type)->from_float(x.data(), ggml_act.data(), n);

    std::vector<float> y_ours(o.rows), y_ggml(o.rows);
    auto dot_ours = [&](const uint8_t* row) { return ours(n, row, act.data()); };
    auto dot_ggml = [&](const uint8_t* row) {
      float s;
      cpu->vec_dot(static_cast<int>(n), &s, 0, row, 0, ggml_act.data(), 0, 1);
      return s;
    };
    std::vector<double> t_ours, t_ggml;
    time_matvec(o, rb, w.data(), dot_ours, y_ours);  // warm-up
    time_matvec(o, rb, w.data(), dot_ggml, y_ggml);
    for (int k = 0; k < o.reps; ++k) {  // interleaved, so that machine noise hits both alike
      t_ours.push_back(time_matvec(o, rb, w.data(), dot_ours, y_ours));
      t_ggml.push_back(time_matvec(o, rb, w.data(), dot_ggml, y_ggml));
    }
    const double gb = static_cast<double>(rb) * o.rows / 1e9;
    const double a = gb / median(t_ours), b = gb / median(t_ggml);
    std::printf("| %s | %llu | %.2f | %.2f | %.2f |\n", std::string(type_name(t)).c_str(), static_cast<unsigned long long>(rb), a, b, a / b);
    std::fflush(stdout);
  }
  return 0;
}
