#include "quant/dot.h"

#include <cpuid.h>

#include "core/error.h"
#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/rows.h"

namespace regolith::quant {
namespace {

// clang 14's __builtin_cpu_supports does not know "f16c"; ask cpuid (leaf 1, ECX bit 29).
bool cpu_has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
}

const DotTable& table(Isa isa) {
  switch (isa) {
    case Isa::avx512: return avx512_dot_table();
    case Isa::avx2: return avx2_dot_table();
    case Isa::scalar: break;
  }
  return scalar_dot_table();
}

int slot(GgmlType type) {
  int id = static_cast<int>(type);
  if (id < 0 || id >= kTypeSlots || !scalar_dot_table()[id]) fail("no dot-product kernel for ", type_name(type), " weights");
  return id;
}

}  // namespace

// Asked once: CPUID is slow under a hypervisor, and backends look kernels up on every product.
bool isa_supported(Isa isa) {
  static const bool avx512 = cpu_has_avx512(), avx2 = cpu_has_avx2();
  switch (isa) {
    case Isa::avx512: return avx512;
    case Isa::avx2: return avx2;
    case Isa::scalar: break;
  }
  return true;
}

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

bool has_vec_dot(GgmlType weight_type) {
  int id = static_cast<int>(weight_type);
  return id >= 0 && id < kTypeSlots && scalar_dot_table()[id] != nullptr;
}

GgmlType activation_type(GgmlType weight_type) {
  slot(weight_type);
  switch (weight_type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16:
      return GgmlType::F32;
    default:
      return traits(weight_type).block_size == 256 ? GgmlType::Q8_K : GgmlType::Q8_0;
  }
}

uint64_t activation_bytes(GgmlType weight_type, int64_t n) {
  check_row_length(weight_type, n);
  return row_bytes(activation_type(weight_type), n);
}

void quantize_activations(GgmlType weight_type, const float* x, int64_t n, void* out) {
  check_row_length(weight_type, n);
  quantize_row(activation_type(weight_type), x, n, static_cast<uint8_t*>(out));
}

VecDot vec_dot_kernel(GgmlType weight_type, Isa isa) {
  int id = slot(weight_type);
  if (!isa_supported(isa)) fail("this CPU cannot run the ", isa_name(isa), " kernels");
  VecDot fn = table(isa)[id];
  return fn ? fn : scalar_dot_table()[id];
}

VecDot vec_dot_kernel(GgmlType weight_type) { return vec_dot_kernel(weight_type, best_isa()); }

float vec_dot(GgmlType weight_type, int64_t n, const void* row, const void* activations) {
  check_row_length(weight_type, n);
  return vec_dot_kernel(weight_type)(n, row, activations);
}

}  // namespace regolith::quant
