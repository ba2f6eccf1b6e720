// Portable kernels (one lane): the fallback on CPUs without AVX2 and the plain path the SIMD
// tables are checked against (tests/ops/cpu_kernels_test.cpp).
#include "backend/cpu/kernels_impl.h"
#include "core/half.h"

namespace regolith::cpu {
namespace {

struct Scalar {
  using V = float;
  static constexpr int W = 1, RB = 4, TB = 4, RB1 = 4;
  static V zero() { return 0.0f; }
  static V set1(float a) { return a; }
  static V load(const float* p) { return *p; }
  static V load_n(const float* p, int) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static void store_n(float* p, V v, int) { *p = v; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static float reduce(V v) { return v; }
  static V load_f16(const uint16_t* p) { return f16_to_f32(*p); }
  static V load_f16_n(const uint16_t* p, int) { return f16_to_f32(*p); }
  static V load_bf16(const uint16_t* p) { return bf16_to_f32(*p); }
  static V load_bf16_n(const uint16_t* p, int) { return bf16_to_f32(*p); }
  static V load_q8(const int8_t* p) { return static_cast<float>(*p); }
  static float f16_scalar(uint16_t h) { return f16_to_f32(h); }
};

double dot_f64(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

constexpr Kernels kTable = make_kernels<Scalar>(Isa::scalar, dot_f64);

}  // namespace

const Kernels& scalar_kernels() { return kTable; }

}  // namespace regolith::cpu
