#include "cli/default_model.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "convert/random_model.h"

namespace regolith::cli {
namespace {

std::filesystem::path cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::filesystem::path(xdg) / "regolith";
  if (const char* home = std::getenv("HOME"); home && *home) return std::filesystem::path(home) / ".cache" / "regolith";
  return std::filesystem::temp_directory_path() / "regolith";
}

}  // namespace

std::string model_or_default(const std::string& requested) {
  if (!requested.empty()) return requested;
  std::filesystem::path path = cache_dir() / "default-tiny-random-q8_0.gguf";
  std::fprintf(stderr, "no -m given: using the built-in default model %s\n"
                       "  (tiny geometry, random weights from `regolith mkmodel --preset tiny --type q8_0`; not a "
                       "trained model, its text is noise)\n", path.c_str());
  if (!std::filesystem::exists(path)) {
    std::filesystem::create_directories(path.parent_path());
    RandomModelOptions o;
    o.hparams = preset_hparams("tiny", 0);
    o.default_type = GgmlType::Q8_0;
    o.name = "regolith-default-tiny-random";
    write_random_model(path.string(), o);
  }
  return path.string();
}

}  // namespace regolith::cli
