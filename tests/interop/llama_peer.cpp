// llama_peer: runs a GGUF through llama.cpp (the shared libraries shipped in npm
// `@node-llama-cpp/linux-x64`, llama.cpp v0.5.0) on the CPU and writes its logits.
//
// Compiled at test time by tests/interop/run_interop.sh against the llama.cpp headers of the same
// release; it uses only the public llama.h / ggml-backend.h API.
//
//   llama_peer logits -m FILE.gguf --tokens 1,2,3 [--out FILE.f32] [--chunk N] [--threads N]
//                     [--backend-dir DIR] [--cpu-variant NAME] [--extra-bufts] [--kv-f16] [--verbose]
//       Loads FILE on the CPU, evaluates the tokens as one sequence (whole prompt in one batch, or
//       in chunks of N tokens; N = 1 is token-by-token decode) with logits requested at every
//       position, writes them as float32 [positions x vocab] (row-major, little-endian) and prints
//       a JSON summary on stdout. Exit 0 when every logit is finite, 3 when some are not, 2 when
//       llama.cpp refuses the file or the evaluation fails, 1 on bad usage.
//
//   llama_peer quantize IN.gguf OUT.gguf TYPE [--imatrix FILE.gguf] [--threads N] [--backend-dir DIR] [--verbose]
//       llama.cpp's own quantizer (llama_model_quantize, with llama.cpp's default per-tensor type
//       choices for the llama_ftype TYPE): TYPE is one of q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m,
//       q4_k_s, q4_k_m, q5_k_m, q6_k, iq4_nl, iq4_xs. --imatrix reads an imatrix GGUF the way
//       llama-quantize v0.5.0 does (libcommon is not shipped, so this is our reading of its rules:
//       the three imatrix.* keys required, "<name>.in_sum2" / "<name>.counts" F32 pairs, sums
//       divided by their matrix's count, 1 where the count is 0). Exit 0 on success, 2 when llama.cpp
//       fails or the imatrix is unreadable, 1 on bad usage.
//
//   Defaults chosen for a reference, not for speed: one thread; F32 K/V caches (llama.cpp's default
//   F16 cache rounds at about the size of the comparison tolerance; --kv-f16 restores it); no
//   "extra" weight buffer types (the AMX / repacked-weight matmuls: --extra-bufts enables them; on
//   a Sapphire Rapids CPU, v0.5.0's AMX Q8_0 path gives wrong logits for batches of >= 32 tokens on
//   the tiny models); the best CPU variant of --backend-dir unless --cpu-variant NAME picks
//   libggml-cpu-NAME.so. Comparisons live in regolith_interop_tool (no llama.cpp needed).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "ggml-backend.h"
#include "gguf.h"
#include "llama.h"

namespace {

bool g_verbose = false;

void log_callback(enum ggml_log_level level, const char* text, void*) {
  // llama.cpp's loader explains a refusal at ERROR (and WARN) level; keep those, drop the rest
  // unless --verbose.
  if (g_verbose || level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
}

[[noreturn]] void usage_error(const char* msg) {
  std::fprintf(stderr,
               "llama_peer: %s\n"
               "usage: llama_peer logits -m FILE.gguf --tokens 1,2,3 [--out FILE.f32] [--chunk N] [--threads N]\n"
               "                         [--backend-dir DIR] [--cpu-variant NAME] [--extra-bufts] [--kv-f16] [--verbose]\n"
               "       llama_peer quantize IN.gguf OUT.gguf TYPE [--imatrix FILE.gguf] [--threads N] [--backend-dir DIR] [--verbose]\n",
               msg);
  std::exit(1);
}

std::vector<llama_token> parse_tokens(const std::string& s) {
  std::vector<llama_token> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 0 || v > INT32_MAX) usage_error("--tokens wants comma-separated ids");
    out.push_back(static_cast<llama_token>(v));
    i = j + 1;
  }
  if (out.empty()) usage_error("--tokens is empty");
  return out;
}

std::string meta(const llama_model* model, const char* key) {
  char buf[256];
  int n = llama_model_meta_val_str(model, key, buf, sizeof buf);
  return n < 0 ? std::string("?") : std::string(buf);
}

int run_logits(int argc, char** argv) {
  std::string model_path, tokens_arg, out_path, backend_dir;
  int chunk = 0, threads = 1;  // tiny models; ggml's spinning pool crawls on busy cores
  bool kv_f16 = false, extra_bufts = false;
  std::string cpu_variant;
  for (int i = 2; i < argc; ++i) {
    std::string_view a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) usage_error("missing value");
      return argv[++i];
    };
    if (a == "-m") model_path = next();
    else if (a == "--tokens") tokens_arg = next();
    else if (a == "--out") out_path = next();
    else if (a == "--chunk") chunk = std::atoi(next());
    else if (a == "--threads") threads = std::atoi(next());
    else if (a == "--backend-dir") backend_dir = next();
    else if (a == "--kv-f16") kv_f16 = true;
    else if (a == "--cpu-variant") cpu_variant = next();
    else if (a == "--extra-bufts") extra_bufts = true;
    else if (a == "--verbose") g_verbose = true;
    else usage_error(("unknown argument " + std::string(a)).c_str());
  }
  if (model_path.empty() || tokens_arg.empty()) usage_error("logits needs -m and --tokens");
  const std::vector<llama_token> tokens = parse_tokens(tokens_arg);
  const int n_tok = static_cast<int>(tokens.size());
  if (chunk <= 0 || chunk > n_tok) chunk = n_tok;
  if (threads <= 0) threads = 1;

  llama_log_set(log_callback, nullptr);
  // The CPU backend ships as several libggml-cpu-<variant>.so; the registry picks the best one the
  // machine supports from this directory (by default it would search next to the executable).
  if (!cpu_variant.empty()) {
    const std::string lib = (backend_dir.empty() ? std::string(".") : backend_dir) + "/libggml-cpu-" + cpu_variant + ".so";
    if (!ggml_backend_load(lib.c_str())) {
      std::fprintf(stderr, "llama_peer: cannot load the CPU backend %s (does this CPU support it?)\n", lib.c_str());
      return 2;
    }
  } else if (!backend_dir.empty()) {
    ggml_backend_load_all_from_path(backend_dir.c_str());
  }
  llama_backend_init();
  if (!ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)) {
    std::fprintf(stderr, "llama_peer: no CPU backend found (looked in %s)\n",
                 backend_dir.empty() ? "the default paths" : backend_dir.c_str());
    return 2;
  }

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  mp.use_extra_bufts = extra_bufts;
  ggml_backend_dev_t cpu_only[2] = {ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU), nullptr};
  mp.devices = cpu_only;
  llama_model* model = llama_model_load_from_file(model_path.c_str(), mp);
  if (!model) {
    std::fprintf(stderr, "llama_peer: llama.cpp failed to load %s (see its messages above)\n", model_path.c_str());
    return 2;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  for (llama_token t : tokens)
    if (t >= n_vocab) {
      std::fprintf(stderr, "llama_peer: token %d outside the vocabulary (%d)\n", t, n_vocab);
      llama_model_free(model);
      return 1;
    }

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(n_tok < 256 ? 256 : n_tok + 64);
  cp.n_batch = static_cast<uint32_t>(n_tok);
  cp.n_ubatch = static_cast<uint32_t>(n_tok);
  cp.n_seq_max = 1;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.no_perf = true;
  // F32 caches: the default F16 K/V (and indexer key) cache rounds activations at ~1e-3, the size of
  // the tolerance the comparisons use.
  cp.type_k = kv_f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
  cp.type_v = kv_f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) {
    std::fprintf(stderr, "llama_peer: llama.cpp failed to create a context for %s\n", model_path.c_str());
    llama_model_free(model);
    return 2;
  }

  std::vector<float> logits(static_cast<size_t>(n_tok) * n_vocab);
  llama_batch batch = llama_batch_init(chunk, 0, 1);
  const int64_t t0 = ggml_time_us();
  for (int start = 0; start < n_tok; start += chunk) {
    const int n = std::min(chunk, n_tok - start);
    batch.n_tokens = n;
    for (int j = 0; j < n; ++j) {
      batch.token[j] = tokens[start + j];
      batch.pos[j] = start + j;
      batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = 0;
      batch.logits[j] = 1;
    }
    const int rc = llama_decode(ctx, batch);
    if (rc != 0) {
      std::fprintf(stderr, "llama_peer: llama_decode failed (%d) at positions %d..%d\n", rc, start, start + n - 1);
      llama_batch_free(batch);
      llama_free(ctx);
      llama_model_free(model);
      return 2;
    }
    for (int j = 0; j < n; ++j) {
      const float* row = llama_get_logits_ith(ctx, j);
      if (!row) {
        std::fprintf(stderr, "llama_peer: no logits for batch row %d\n", j);
        return 2;
      }
      std::memcpy(&logits[static_cast<size_t>(start + j) * n_vocab], row, sizeof(float) * n_vocab);
    }
  }
  const double ms = (ggml_time_us() - t0) / 1000.0;

  size_t n_bad = 0;
  float max_abs = 0.0f;
  for (float v : logits) {
    if (!std::isfinite(v)) ++n_bad;
    else max_abs = std::max(max_abs, std::fabs(v));
  }
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "wb");
    if (!f || std::fwrite(logits.data(), sizeof(float), logits.size(), f) != logits.size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "llama_peer: cannot write %s\n", out_path.c_str());
      return 1;
    }
  }

  char desc[256];
  llama_model_desc(model, desc, sizeof desc);
  std::printf("{\"llama_version\": \"%s\", \"model\": \"%s\", \"arch\": \"%s\", \"desc\": \"%s\", \"n_vocab\": %d, "
              "\"positions\": %d, \"chunk\": %d, \"threads\": %d, \"decode_ms\": %.2f, \"max_abs_logit\": %.6g, "
              "\"non_finite\": %zu, \"all_finite\": %s,\n \"argmax\": [",
              llama_version(), model_path.c_str(), meta(model, "general.architecture").c_str(), desc, n_vocab, n_tok, chunk,
              threads, ms, max_abs, n_bad, n_bad == 0 ? "true" : "false");
  for (int p = 0; p < n_tok; ++p) {
    const float* row = &logits[static_cast<size_t>(p) * n_vocab];
    int best = 0;
    for (int v = 1; v < n_vocab; ++v)
      if (row[v] > row[best]) best = v;
    std::printf("%s%d", p ? ", " : "", best);
  }
  std::printf("],\n \"logits_head\": [");
  // The first few logits of the first and last position, to eyeball in a log.
  for (int p : {0, n_tok - 1}) {
    std::printf("%s[", p ? ", " : "");
    for (int v = 0; v < std::min(n_vocab, 6); ++v) std::printf("%s%.5g", v ? ", " : "", logits[static_cast<size_t>(p) * n_vocab + v]);
    std::printf("]");
    if (n_tok == 1) break;
  }
  std::printf("]}\n");

  llama_batch_free(batch);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return n_bad == 0 ? 0 : 3;
}

// Mean squared activations per imatrix entry (see the quantize usage above); false when unreadable.
bool load_imatrix(const std::string& path, std::vector<std::string>& names, std::vector<std::vector<float>>& values) {
  ggml_context* ctx = nullptr;
  gguf_context* g = gguf_init_from_file(path.c_str(), {/*no_alloc=*/false, &ctx});
  if (!g) return false;
  bool ok = gguf_find_key(g, "imatrix.datasets") >= 0 && gguf_find_key(g, "imatrix.chunk_count") >= 0 &&
            gguf_find_key(g, "imatrix.chunk_size") >= 0;
  if (!ok) std::fprintf(stderr, "llama_peer: %s lacks the imatrix.* metadata llama-quantize requires\n", path.c_str());
  const std::string suffix = ".in_sum2";
  for (ggml_tensor* t = ggml_get_first_tensor(ctx); ok && t; t = ggml_get_next_tensor(ctx, t)) {
    const std::string name = ggml_get_name(t);
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string base = name.substr(0, name.size() - suffix.size());
    const ggml_tensor* counts = ggml_get_tensor(ctx, (base + ".counts").c_str());
    ok = counts && t->type == GGML_TYPE_F32 && counts->type == GGML_TYPE_F32 && ggml_nelements(counts) > 0 &&
         ggml_nelements(t) % ggml_nelements(counts) == 0;
    if (!ok) {
      std::fprintf(stderr, "llama_peer: %s: %s has no matching F32 %s.counts\n", path.c_str(), name.c_str(), base.c_str());
      break;
    }
    const int64_t n_mat = ggml_nelements(counts), row = ggml_nelements(t) / n_mat;
    const float* sums = static_cast<const float*>(t->data);
    const float* c = static_cast<const float*>(counts->data);
    std::vector<float> v(static_cast<size_t>(ggml_nelements(t)));
    for (int64_t m = 0; m < n_mat; ++m)
      for (int64_t i = 0; i < row; ++i) v[m * row + i] = c[m] > 0 ? sums[m * row + i] / c[m] : 1.0f;
    names.push_back(base);
    values.push_back(std::move(v));
  }
  gguf_free(g);
  ggml_free(ctx);
  return ok && !names.empty();
}

int run_quantize(int argc, char** argv) {
  struct FileType {
    const char* name;
    llama_ftype ftype;
  };
  static const FileType kTypes[] = {
      {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},     {"q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},
      {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},     {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1},     {"q2_k", LLAMA_FTYPE_MOSTLY_Q2_K},
      {"q3_k_m", LLAMA_FTYPE_MOSTLY_Q3_K_M}, {"q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S}, {"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
      {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},     {"iq4_nl", LLAMA_FTYPE_MOSTLY_IQ4_NL},
      {"iq4_xs", LLAMA_FTYPE_MOSTLY_IQ4_XS},
  };
  if (argc < 5) usage_error("quantize needs IN.gguf OUT.gguf TYPE");
  const std::string in = argv[2], out = argv[3], type = argv[4];
  std::string imatrix_path;
  int threads = 1;
  for (int i = 5; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--imatrix" && i + 1 < argc) imatrix_path = argv[++i];
    else if (a == "--backend-dir" && i + 1 < argc) ++i;  // accepted for symmetry with logits; not needed
    else if (a == "--verbose") g_verbose = true;
    else usage_error(("unknown argument " + std::string(a)).c_str());
  }
  const FileType* ft = nullptr;
  for (const FileType& t : kTypes)
    if (type == t.name) ft = &t;
  if (!ft) usage_error(("unknown quantization type " + type).c_str());

  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<llama_model_imatrix_data> imatrix;
  if (!imatrix_path.empty()) {
    if (!load_imatrix(imatrix_path, names, values)) {
      std::fprintf(stderr, "llama_peer: cannot read the importance matrix %s\n", imatrix_path.c_str());
      return 2;
    }
    for (size_t i = 0; i < names.size(); ++i) imatrix.push_back({names[i].c_str(), values[i].data(), values[i].size()});
    imatrix.push_back({nullptr, nullptr, 0});
  }

  llama_log_set(log_callback, nullptr);
  llama_backend_init();
  llama_model_quantize_params p = llama_model_quantize_default_params();
  p.ftype = ft->ftype;
  p.nthread = threads > 0 ? threads : 1;
  p.imatrix = imatrix.empty() ? nullptr : imatrix.data();
  const uint32_t rc = llama_model_quantize(in.c_str(), out.c_str(), &p);
  llama_backend_free();
  if (rc != 0) {
    std::fprintf(stderr, "llama_peer: llama_model_quantize %s -> %s (%s) failed (%u)\n", in.c_str(), out.c_str(), type.c_str(), rc);
    return 2;
  }
  std::printf("{\"llama_version\": \"%s\", \"quantized\": \"%s\", \"ftype\": \"%s\", \"imatrix_entries\": %zu}\n", llama_version(),
              out.c_str(), type.c_str(), names.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage_error("missing command");
  std::string_view cmd = argv[1];
  if (cmd == "logits") return run_logits(argc, argv);
  if (cmd == "quantize") return run_quantize(argc, argv);
  usage_error("unknown command");
}
