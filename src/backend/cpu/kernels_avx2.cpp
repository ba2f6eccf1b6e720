// AVX2 + FMA + F16C kernels: 8 lanes, masked float loads/stores for the tails (16-bit tails go
// through a zero-padded copy). Compiled with -mavx2 -mfma -mf16c; runs only when kernels.cpp
// has found them.
#include <immintrin.h>

#include "backend/cpu/kernels_impl.h"

namespace regolith::cpu {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int W = 8, RB = 2, TB = 4, RB1 = 4;
  static __m256i mask(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_n(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, V v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static float reduce(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static __m128i load_u16x8(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static __m128i load_u16x8_n(const uint16_t* p, int n) {
    alignas(16) uint16_t tmp[8] = {};
    __builtin_memcpy(tmp, p, static_cast<unsigned>(n) * 2);
    return _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  static V load_f16(const uint16_t* p) { return _mm256_cvtph_ps(load_u16x8(p)); }
  static V load_f16_n(const uint16_t* p, int n) { return _mm256_cvtph_ps(load_u16x8_n(p, n)); }
  static V widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static V load_bf16(const uint16_t* p) { return widen_bf16(load_u16x8(p)); }
  static V load_bf16_n(const uint16_t* p, int n) { return widen_bf16(load_u16x8_n(p, n)); }
  static V load_q8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
  // exp by 2^n·e^r, r = x − n·ln2 in [−ln2/2, ln2/2] (Cody–Waite split), Cephes' expf polynomial;
  // 2^n is built in the exponent field (n >= −126 after the clamp).
  static V exp(V x) {
    x = _mm256_min_ps(_mm256_max_ps(x, set1(-87.33654f)), set1(88.72283f));
    V n = _mm256_round_ps(_mm256_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    V p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, set1(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
};

double hsum_pd(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

// Products of two floats are exact in FP64, so only the order of the sums differs from a
// sequential loop.
double dot_f64(const float* a, const float* b, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i)), _mm256_cvtps_pd(_mm_loadu_ps(b + i)), s0);
    s1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + i + 4)), _mm256_cvtps_pd(_mm_loadu_ps(b + i + 4)), s1);
  }
  double s = hsum_pd(_mm256_add_pd(s0, s1));
  for (; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

constexpr Kernels kTable = make_kernels<Avx2>(Isa::avx2, dot_f64);

}  // namespace

const Kernels& avx2_kernels() { return kTable; }

}  // namespace regolith::cpu
