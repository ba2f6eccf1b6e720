#include "ggml_ref.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#ifndef REGOLITH_GGML_REF_DIR
#error "REGOLITH_GGML_REF_DIR must name the fixture's directory"
#endif

namespace regolith::test {
namespace {

template <typename F>
bool bind(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) error = std::string("libggml has no symbol ") + name;
  return fn != nullptr;
}

// The most capable CPU variant this machine runs, as ggml's own loader would choose.
std::string cpu_variant() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bf16")) return "sapphirerapids";
  if (__builtin_cpu_supports("avx512vnni")) return "icelake";
  if (__builtin_cpu_supports("avx512bw")) return "skylakex";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "haswell";
  return "x64";
}

GgmlRef* load_once(std::string& error) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(REGOLITH_GGML_REF_DIR) / "package" / "bins" / "linux-x64";
  fs::path base = dir / "libggml-base.so";
  if (!fs::exists(base)) {
    error = "llama.cpp's libggml is not at " + base.string() +
            " (the fetch fixture needs npm and network: npm pack @node-llama-cpp/linux-x64@3.22.1)";
    return nullptr;
  }
  void* lib = dlopen(base.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    error = std::string("dlopen failed: ") + dlerror();
    return nullptr;
  }
  auto* ref = new GgmlRef;
  if (!bind(lib, "ggml_get_type_traits", ref->type_traits, error) ||
      !bind(lib, "ggml_quantize_chunk", ref->quantize_chunk, error))
    return nullptr;
  ref->cpu_variant = cpu_variant();
  fs::path cpu = dir / ("libggml-cpu-" + ref->cpu_variant + ".so");
  if (void* cpu_lib = dlopen(cpu.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    void (*init)() = nullptr;
    std::string ignored;
    if (bind(cpu_lib, "ggml_get_type_traits_cpu", ref->type_traits_cpu, ignored) && bind(cpu_lib, "ggml_cpu_init", init, ignored))
      init();
  }
  return ref;
}

}  // namespace

const GgmlRef* GgmlRef::load(std::string& error) {
  static std::mutex mutex;
  static GgmlRef* ref = nullptr;
  static std::string first_error;
  std::lock_guard<std::mutex> lock(mutex);
  static bool tried = false;
  if (!tried) {
    tried = true;
    ref = load_once(first_error);
  }
  error = first_error;
  return ref;
}

}  // namespace regolith::test
