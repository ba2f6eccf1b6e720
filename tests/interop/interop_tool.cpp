// regolith_interop_tool: the parts of the llama.cpp interoperability test that need no llama.cpp
// (built with the project; the llama.cpp peer itself is compiled at test time, see run_interop.sh).
//
//   info FILE.gguf
//       One "key value" pair per line: vocab, eos (the PLE cut token), qsa_budget (the longest
//       prompt on which llama.cpp v0.5.0's QSA selection equals the reference: min over QSA layers
//       of indexer.top_k + ratio - 1), and llama_unsupported (a reason, or "-") for geometries
//       llama.cpp v0.5.0's qwen4exp cannot represent although the file is a valid qwen4exp GGUF.
//   prompts REFERENCE.safetensors
//       One line per prompt of a fixture's reference outputs: "NAME LENGTH t0,t1,...".
//   ref-logits REFERENCE.safetensors NAME ROWS OUT.f32
//       Writes the first ROWS rows of NAME.logits (the whole-prompt transformers logits) as float32.
//   compare REF.f32 OTHER.f32 --vocab V [--rows N] [--rel-tol 1e-3]
//       method.md's tolerance: max |REF-OTHER| <= rel_tol * max|REF| and the same argmax at every
//       position (the first N rows only, when given). Exit 0 when they agree, 4 when not.
//   types FILE.gguf
//       One "name type" line per tensor, in file order (to check that two quantizers chose the
//       same per-tensor types).
//   diff-stats A.f32 B.f32 --vocab V
//       Prints "max_abs_diff D rms_diff R positions N" (to 9 digits) for two logit files of the
//       same size: the numbers run_interop.sh's `quantized` mode compares.
// Exit 1 on bad usage or unreadable input.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/safetensors.h"

namespace {

using regolith::GgufFile;
using regolith::SafetensorsFile;
using regolith::StTensor;

constexpr std::string_view kArch = "qwen4exp.";

int64_t meta_int(const GgufFile& f, std::string_view key) {
  return f.get(std::string(kArch) + std::string(key)).as_int(key);
}

int run_info(const std::string& path) {
  GgufFile f = GgufFile::open(path);
  const int64_t vocab = f.tensor("token_embd.weight").ne.at(1);

  int64_t budget = -1;
  const int64_t top_k = meta_int(f, "attention.indexer.top_k");
  for (int64_t r : f.get("qwen4exp.attention.compress_ratios").as_int_array("attention.compress_ratios"))
    if (r > 0) budget = budget < 0 ? top_k + r - 1 : std::min(budget, top_k + r - 1);

  // llama.cpp v0.5.0 (src/models/qwen4exp.cpp, load_arch_tensors and build_layer_attn_linear) sizes
  // both GDN head widths by ssm.state_size; the qwen4exp GGUF records the value width only through
  // ssm.inner_size = v_heads * v_head_dim, so a checkpoint with linear_key_head_dim !=
  // linear_value_head_dim converts to a valid file that llama.cpp cannot run.
  std::string unsupported = "-";
  const int64_t d_state = meta_int(f, "ssm.state_size"), n_v = meta_int(f, "ssm.time_step_rank");
  const int64_t inner = meta_int(f, "ssm.inner_size");
  if (inner != d_state * n_v)
    unsupported = "GDN value head width " + std::to_string(n_v ? inner / n_v : 0) + " != key head width " +
                  std::to_string(d_state) + " (ssm.inner_size " + std::to_string(inner) + " != ssm.state_size " +
                  std::to_string(d_state) + " * ssm.time_step_rank " + std::to_string(n_v) +
                  "); llama.cpp v0.5.0 qwen4exp uses ssm.state_size for both widths";
  const int64_t key_len = meta_int(f, "attention.key_length"), value_len = meta_int(f, "attention.value_length");
  if (key_len != value_len) {
    std::string why = "attention.key_length " + std::to_string(key_len) + " != attention.value_length " +
                      std::to_string(value_len) + "; llama.cpp v0.5.0 qwen4exp asserts they are equal";
    unsupported = unsupported == "-" ? why : unsupported + "; " + why;
  }

  const regolith::GgufValue* eos = f.find("qwen4exp.ple.eos_token_id");
  std::printf("vocab %lld\n", static_cast<long long>(vocab));
  std::printf("eos %lld\n", eos ? static_cast<long long>(eos->as_int("ple.eos_token_id")) : -1LL);
  std::printf("qsa_budget %lld\n", static_cast<long long>(budget));
  std::printf("llama_unsupported %s\n", unsupported.c_str());
  return 0;
}

const StTensor& find_tensor(const SafetensorsFile& f, const std::string& name) {
  for (const StTensor& t : f.tensors())
    if (t.name == name) return t;
  regolith::fail("no tensor '", name, "' in the reference file");
}

int run_prompts(const std::string& path) {
  SafetensorsFile f = SafetensorsFile::open(path);
  for (const StTensor& t : f.tensors()) {
    const std::string suffix = ".tokens";
    if (t.name.size() <= suffix.size() || t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    std::vector<int64_t> ids = t.to_i64();
    std::printf("%s %zu ", t.name.substr(0, t.name.size() - suffix.size()).c_str(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%lld", i ? "," : "", static_cast<long long>(ids[i]));
    std::printf("\n");
  }
  return 0;
}

int run_ref_logits(const std::string& path, const std::string& name, long rows, const std::string& out) {
  SafetensorsFile f = SafetensorsFile::open(path);
  const StTensor& t = find_tensor(f, name + ".logits");
  if (t.shape.size() != 2) regolith::fail(name, ".logits is not 2-D");
  rows = std::min<long>(rows, static_cast<long>(t.shape[0]));
  std::vector<float> v(static_cast<size_t>(rows * t.shape[1]));
  t.to_f32(0, static_cast<int64_t>(v.size()), v.data());
  FILE* o = std::fopen(out.c_str(), "wb");
  if (!o || std::fwrite(v.data(), sizeof(float), v.size(), o) != v.size() || std::fclose(o) != 0)
    regolith::fail("cannot write ", out);
  return 0;
}

std::vector<float> read_f32(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) regolith::fail("cannot open ", path);
  std::vector<float> out;
  float buf[4096];
  size_t n;
  while ((n = std::fread(buf, sizeof(float), 4096, f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  return out;
}

int run_compare(const std::vector<std::string>& files, long vocab, long rows, double rel_tol) {
  std::vector<float> a = read_f32(files[0]), b = read_f32(files[1]);
  if (a.size() % vocab != 0 || b.size() % vocab != 0) {
    std::fprintf(stderr, "compare: %zu / %zu values are not whole rows of %ld\n", a.size(), b.size(), vocab);
    return 4;
  }
  long n_pos = static_cast<long>(std::min(a.size(), b.size()) / vocab);
  if (rows > 0) {
    if (rows > n_pos) {
      std::fprintf(stderr, "compare: wanted %ld rows, the files hold %zu and %zu\n", rows, a.size() / vocab,
                   b.size() / vocab);
      return 4;
    }
    n_pos = rows;
  } else if (a.size() != b.size()) {
    std::fprintf(stderr, "compare: the files hold %zu and %zu rows\n", a.size() / vocab, b.size() / vocab);
    return 4;
  }
  double max_ref = 0.0, max_diff = 0.0;
  long worst_pos = 0, worst_tok = 0, mismatches = 0;
  bool finite = true;
  for (long p = 0; p < n_pos; ++p) {
    const float* ra = &a[static_cast<size_t>(p * vocab)];
    const float* rb = &b[static_cast<size_t>(p * vocab)];
    long ia = 0, ib = 0;
    for (long v = 0; v < vocab; ++v) {
      if (!std::isfinite(ra[v]) || !std::isfinite(rb[v])) finite = false;
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(ra[v])));
      const double d = std::fabs(static_cast<double>(ra[v]) - rb[v]);
      if (d > max_diff) max_diff = d, worst_pos = p, worst_tok = v;
      if (ra[v] > ra[ia]) ia = v;
      if (rb[v] > rb[ib]) ib = v;
    }
    if (ia != ib) {
      ++mismatches;
      std::fprintf(stderr, "compare: position %ld: argmax %ld (%.6g) vs %ld (%.6g)\n", p, ia, ra[ia], ib, rb[ib]);
    }
  }
  const double bound = rel_tol * max_ref;
  const bool ok = finite && max_diff <= bound && mismatches == 0;
  std::printf("positions %ld, max|ref| %.5g, max|diff| %.4g (bound %.4g, rel %.3g) at [%ld, %ld], argmax mismatches %ld%s: %s\n",
              n_pos, max_ref, max_diff, bound, max_ref > 0 ? max_diff / max_ref : 0.0, worst_pos, worst_tok,
              mismatches, finite ? "" : ", NON-FINITE values", ok ? "agree" : "DIFFER");
  return ok ? 0 : 4;
}

int run_types(const std::string& path) {
  GgufFile f = GgufFile::open(path);
  for (const regolith::GgufTensor& t : f.tensors())
    std::printf("%s %s\n", t.name.c_str(), std::string(regolith::type_name(t.type)).c_str());
  return 0;
}

int run_diff_stats(const std::string& a_path, const std::string& b_path, long vocab) {
  const std::vector<float> a = read_f32(a_path), b = read_f32(b_path);
  if (a.size() != b.size() || a.empty() || a.size() % vocab != 0) {
    std::fprintf(stderr, "diff-stats: %zu and %zu values are not the same whole rows of %ld\n", a.size(), b.size(), vocab);
    return 1;
  }
  double max_diff = 0, sum_sq = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      std::fprintf(stderr, "diff-stats: non-finite value at %zu\n", i);
      return 1;
    }
    const double d = static_cast<double>(a[i]) - b[i];
    max_diff = std::max(max_diff, std::fabs(d));
    sum_sq += d * d;
  }
  std::printf("max_abs_diff %.9g rms_diff %.9g positions %zu\n", max_diff, std::sqrt(sum_sq / static_cast<double>(a.size())),
              a.size() / vocab);
  return 0;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: regolith_interop_tool info FILE.gguf\n"
               "       regolith_interop_tool prompts REFERENCE.safetensors\n"
               "       regolith_interop_tool ref-logits REFERENCE.safetensors NAME ROWS OUT.f32\n"
               "       regolith_interop_tool compare REF.f32 OTHER.f32 --vocab V [--rows N] [--rel-tol 1e-3]\n"
               "       regolith_interop_tool types FILE.gguf\n"
               "       regolith_interop_tool diff-stats A.f32 B.f32 --vocab V\n");
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  const std::string_view cmd = argv[1];
  try {
    if (cmd == "info" && argc == 3) return run_info(argv[2]);
    if (cmd == "prompts" && argc == 3) return run_prompts(argv[2]);
    if (cmd == "ref-logits" && argc == 6) return run_ref_logits(argv[2], argv[3], std::atol(argv[4]), argv[5]);
    if (cmd == "types" && argc == 3) return run_types(argv[2]);
    if (cmd == "diff-stats" && argc == 6 && std::string_view(argv[4]) == "--vocab")
      return run_diff_stats(argv[2], argv[3], std::atol(argv[5]));
    if (cmd == "compare") {
      std::vector<std::string> files;
      long vocab = 0, rows = 0;
      double rel_tol = 1e-3;
      for (int i = 2; i < argc; ++i) {
        const std::string_view a = argv[i];
        if (a == "--vocab" && i + 1 < argc) vocab = std::atol(argv[++i]);
        else if (a == "--rows" && i + 1 < argc) rows = std::atol(argv[++i]);
        else if (a == "--rel-tol" && i + 1 < argc) rel_tol = std::atof(argv[++i]);
        else files.emplace_back(a);
      }
      if (files.size() != 2 || vocab <= 0) usage();
      return run_compare(files, vocab, rows, rel_tol);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regolith_interop_tool: %s\n", e.what());
    return 1;
  }
  usage();
}
