#include "cli/backend_options.h"

#include <string>

namespace regolith::cli {

void add_backend_options(CLI::App* cmd, BackendOptions& options, const std::string& backend_help) {
  cmd->add_option("--backend,--device", options.name,
                  backend_help + ": auto (cuda when a GPU is usable, else cpu), cpu, cuda or ref")
      ->capture_default_str();
  cmd->add_option("-t,--threads", options.n_threads, "Threads of the cpu backend (0: every core)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--gdn-state", [&options](const std::string& v) { options.gdn_state = v == "bf16" ? DType::BF16 : DType::F32; },
         "GDN recurrent state: f32, or bf16 (half the memory, rounded after every forward call)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->default_str("f32");
  cmd->add_flag("--exact-products", options.exact_products,
                "cuda: prefill products with quantized weights keep FP32 activations (slower; default: "
                "activations rounded to Q8_0/Q8_K for the int8 tensor cores, as llama.cpp rounds them)");
}

}  // namespace regolith::cli
