// `regolith inspect FILE.gguf`: architecture, hyperparameters, metadata, tensor table, totals.

#include <cstdio>
#include <map>
#include <string>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "model/qwen4exp_hparams.h"

namespace regolith::cli {
namespace {

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", b, units[u]);
  return buf;
}

void run_inspect(const std::string& path, bool all_metadata) {
  GgufFile f = GgufFile::open(path);
  std::printf("file:       %s\n", path.c_str());
  std::printf("gguf:       version %u, alignment %llu, data at byte %llu, %s\n", f.version(),
              (unsigned long long)f.alignment(), (unsigned long long)f.data_offset(), human_bytes(f.file_size()).c_str());
  const GgufValue* arch = f.find("general.architecture");
  std::printf("arch:       %s\n", arch ? arch->describe().c_str() : "(none)");
  if (arch && arch->type() == GgufType::STRING && arch->as_string() == kQwen4ExpArch) {
    Qwen4ExpHparams hp = read_hparams(f);
    int n_gdn = 0;
    for (bool r : hp.is_recurrent) n_gdn += r;
    std::printf("model:      vocab %lld, hidden %lld, %lld layers (%d GDN, %lld QSA), %lld MTP block(s)\n",
                (long long)hp.n_vocab, (long long)hp.n_embd, (long long)hp.n_layer, n_gdn,
                (long long)hp.n_layer - n_gdn, (long long)hp.n_layer_nextn);
    std::printf("attention:  %lld heads / %lld kv of %lld, rope %lld dims theta %g, indexer %lld x %lld top %lld tokens\n",
                (long long)hp.n_head, (long long)hp.n_head_kv, (long long)hp.head_dim, (long long)hp.n_rot,
                hp.rope_theta, (long long)hp.indexer_n_head, (long long)hp.indexer_head_dim, (long long)hp.indexer_top_k);
    std::printf("gdn:        %lld k heads of %lld, %lld v heads of %lld, conv %lld\n", (long long)hp.ssm_n_k_heads,
                (long long)hp.ssm_k_head_dim, (long long)hp.ssm_n_v_heads, (long long)hp.ssm_v_head_dim,
                (long long)hp.ssm_conv_kernel);
    std::printf("moe:        %lld experts, top %lld, width %lld, shared %lld\n", (long long)hp.n_expert,
                (long long)hp.n_expert_used, (long long)hp.n_ff_exp, (long long)hp.n_ff_shexp);
    std::printf("hc:         %lld streams, low rank %lld\n", (long long)hp.hc_count, (long long)hp.hc_low_rank);
    if (!hp.ple_layers.empty())
      std::printf("ple:        layer %d, %lld-grams, %lld heads of %lld, eos %lld\n", hp.ple_layers[0],
                  (long long)hp.ple_ngram_size, (long long)hp.ple_n_heads(), (long long)hp.ple_row_dim,
                  (long long)hp.ple_eos_token_id);
  }
  std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
  for (const auto& [key, value] : f.metadata()) {
    bool bulky = key.rfind("tokenizer.ggml.", 0) == 0 || key == "tokenizer.chat_template";
    std::string shown = value.describe(all_metadata || !bulky ? 16 : 3);
    std::printf("  %-52s %-6s %s\n", key.c_str(), std::string(gguf_type_name(value.type())).c_str(), shown.c_str());
  }
  std::printf("\ntensors (%zu):\n", f.tensors().size());
  std::printf("  %-44s %-8s %-28s %12s\n", "name", "type", "shape", "bytes");
  std::map<std::string, std::pair<uint64_t, uint64_t>> per_type;  // bytes, elements
  uint64_t total_bytes = 0, total_elements = 0;
  for (const GgufTensor& t : f.tensors()) {
    std::string type(type_name(t.type));
    std::printf("  %-44s %-8s %-28s %12llu\n", t.name.c_str(), type.c_str(), t.shape_string().c_str(),
                (unsigned long long)t.n_bytes);
    per_type[type].first += t.n_bytes;
    per_type[type].second += static_cast<uint64_t>(t.n_elements());
    total_bytes += t.n_bytes;
    total_elements += static_cast<uint64_t>(t.n_elements());
  }
  std::printf("\ntotals:\n");
  for (const auto& [type, be] : per_type)
    std::printf("  %-8s %14llu values  %s  (%.3f bits/value)\n", type.c_str(), (unsigned long long)be.second,
                human_bytes(be.first).c_str(), 8.0 * be.first / be.second);
  std::printf("  all      %14llu values  %s\n", (unsigned long long)total_elements, human_bytes(total_bytes).c_str());
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "Show a GGUF file's metadata, hyperparameters and tensors");
  static std::string path;
  static bool all_metadata = false;
  cmd->add_option("file", path, "GGUF file")->required();
  cmd->add_flag("--all", all_metadata, "Show long metadata arrays (tokenizer) in full length");
  cmd->callback([] { run_inspect(path, all_metadata); });
}

}  // namespace regolith::cli
