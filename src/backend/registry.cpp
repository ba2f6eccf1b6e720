// The registry of backends by name.
#include "backend/cpu/cpu_backend.h"
#ifdef REGOLITH_HAS_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "backend/ops.h"
#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace regolith {

namespace {

struct BackendEntry {
  const char* name;
  std::unique_ptr<Backend> (*make)(const BackendOptions&);
};

// New backends add one line here.
const BackendEntry kBackends[] = {
    {"ref", [](const BackendOptions&) { return std::unique_ptr<Backend>(new RefBackend()); }},
    {"cpu",
     [](const BackendOptions& o) { return std::unique_ptr<Backend>(new CpuBackend({.n_threads = o.n_threads})); }},
#ifdef REGOLITH_HAS_CUDA
    {"cuda", [](const BackendOptions& options) { return make_cuda_backend(options); }},
#endif
};

}  // namespace

std::unique_ptr<Backend> make_backend(std::string_view name) { return make_backend(BackendOptions{.name = std::string(name)}); }

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.n_threads < 0) fail("backend threads: ", options.n_threads, " (0 means every core)");
  if (options.name == "auto") {
#ifdef REGOLITH_HAS_CUDA
    try {
      return make_cuda_backend(options);
    } catch (const Error&) {
      // No usable GPU (no driver, no device): the CPU backend.
    }
#endif
    BackendOptions cpu = options;
    cpu.name = "cpu";
    return make_backend(cpu);
  }
  const std::string& name = options.name;
  for (const BackendEntry& e : kBackends)
    if (name == e.name) return e.make(options);
  std::string known;
  for (const BackendEntry& e : kBackends) known += (known.empty() ? "" : ", ") + std::string(e.name);
  fail("unknown backend '", name, "' (known: auto, ", known, ")");
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const BackendEntry& e : kBackends) out.emplace_back(e.name);
  return out;
}

}  // namespace regolith
