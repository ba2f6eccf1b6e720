// Run-time choice of the kernel table: the CPU is asked once, and a table is only handed out
// when the CPU can run it.
#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "core/error.h"

namespace regolith::cpu {

#if defined(__x86_64__) || defined(__i386__)
namespace {

// F16C straight from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
bool cpu_has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

}  // namespace

bool isa_supported(Isa isa) {
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
  switch (isa) {
    case Isa::avx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
    case Isa::avx2: return avx2;
    case Isa::scalar: break;
  }
  return true;
}
#else
bool isa_supported(Isa isa) { return isa == Isa::scalar; }
const Kernels& avx2_kernels() { return scalar_kernels(); }
const Kernels& avx512_kernels() { return scalar_kernels(); }
#endif

Isa best_isa() {
  static const Isa best = isa_supported(Isa::avx512) ? Isa::avx512 : isa_supported(Isa::avx2) ? Isa::avx2 : Isa::scalar;
  return best;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::scalar: break;
  }
  return "scalar";
}

const Kernels& kernels(Isa isa) {
  if (!isa_supported(isa)) fail("cpu backend: this CPU cannot run the ", isa_name(isa), " kernels");
  switch (isa) {
    case Isa::avx512: return avx512_kernels();
    case Isa::avx2: return avx2_kernels();
    case Isa::scalar: break;
  }
  return scalar_kernels();
}

bool direct_wtype(GgmlType type, WType& out) {
  switch (type) {
    case GgmlType::F32: out = WType::F32; return true;
    case GgmlType::F16: out = WType::F16; return true;
    case GgmlType::BF16: out = WType::BF16; return true;
    case GgmlType::Q8_0: out = WType::Q8_0; return true;
    default: return false;
  }
}

}  // namespace regolith::cpu
