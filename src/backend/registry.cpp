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
  std::unique_ptr<Backend> (*make)();
};

// New backends add one line here.
const BackendEntry kBackends[] = {
    {"ref", [] { return std::unique_ptr<Backend>(new RefBackend()); }},
    {"cpu", [] { return std::unique_ptr<Backend>(new CpuBackend()); }},
#ifdef REGOLITH_HAS_CUDA
    {"cuda", make_cuda_backend},
#endif
};

}  // namespace

std::unique_ptr<Backend> make_backend(std::string_view name) {
  for (const BackendEntry& e : kBackends)
    if (name == e.name) return e.make();
  std::string known;
  for (const BackendEntry& e : kBackends) known += (known.empty() ? "" : ", ") + std::string(e.name);
  fail("unknown backend '", name, "' (known: ", known, ")");
}

std::vector<std::string> backend_names() {
  std::vector<std::string> out;
  for (const BackendEntry& e : kBackends) out.emplace_back(e.name);
  return out;
}

}  // namespace regolith
