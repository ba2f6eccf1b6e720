// Portable kernels: the fallback on CPUs without AVX2, and the plain path the SIMD tables are
// checked against (tests/ops/cpu_kernels_test.cpp). A "vector" is 8 floats in an array, so the
// summation order (8 partial sums) and the tail handling match the AVX2 table, and the compiler
// may map the lane loops onto whatever SIMD the baseline target has.
#include <cmath>

#include "backend/cpu/kernels_impl.h"
#include "core/half.h"

namespace regolith::cpu {
namespace {

struct Lanes {
  float v[8];
};

struct Scalar {
  using V = Lanes;
  static constexpr int W = 8, RB = 4, TB = 4, RB1 = 4;
  static V zero() { return V{}; }
  static V set1(float a) {
    V r;
    for (float& x : r.v) x = a;
    return r;
  }
  static V load(const float* p) { return load_n(p, W); }
  static V load_n(const float* p, int n) {
    V r{};
    for (int i = 0; i < n; ++i) r.v[i] = p[i];
    return r;
  }
  static void store(float* p, V v) { store_n(p, v, W); }
  static void store_n(float* p, V v, int n) {
    for (int i = 0; i < n; ++i) p[i] = v.v[i];
  }
  static V fma(V a, V b, V c) {
    for (int i = 0; i < W; ++i) c.v[i] += a.v[i] * b.v[i];
    return c;
  }
  static V mul(V a, V b) {
    for (int i = 0; i < W; ++i) a.v[i] *= b.v[i];
    return a;
  }
  static V add(V a, V b) {
    for (int i = 0; i < W; ++i) a.v[i] += b.v[i];
    return a;
  }
  static V sub(V a, V b) {
    for (int i = 0; i < W; ++i) a.v[i] -= b.v[i];
    return a;
  }
  // Pairwise, as the AVX2 reduction adds its lanes.
  static float reduce(V a) {
    float s[4];
    for (int i = 0; i < 4; ++i) s[i] = a.v[i] + a.v[i + 4];
    return (s[0] + s[2]) + (s[1] + s[3]);
  }
  static V load_f16(const uint16_t* p) { return load_f16_n(p, W); }
  static V load_f16_n(const uint16_t* p, int n) {
    V r{};
    for (int i = 0; i < n; ++i) r.v[i] = f16_to_f32(p[i]);
    return r;
  }
  static V load_bf16(const uint16_t* p) { return load_bf16_n(p, W); }
  static V load_bf16_n(const uint16_t* p, int n) {
    V r{};
    for (int i = 0; i < n; ++i) r.v[i] = bf16_to_f32(p[i]);
    return r;
  }
  static V load_q8(const int8_t* p) {
    V r;
    for (int i = 0; i < W; ++i) r.v[i] = static_cast<float>(p[i]);
    return r;
  }
  static float f16_scalar(uint16_t h) { return f16_to_f32(h); }
  static V exp(V x) {
    for (float& v : x.v) v = std::exp(v);
    return x;
  }
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
