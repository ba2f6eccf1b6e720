// AVX-512 (F, BW, VL) kernels: 16 lanes, masked loads and stores for the tails. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c; runs only when kernels.cpp has found them.
// g++ 12's AVX-512 headers build "undefined" vectors by self-initialisation and then warn about
// them wherever they are inlined (GCC bug 105593, fixed in 13); the pragmas cover the header only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "backend/cpu/kernels_impl.h"

namespace regolith::cpu {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int W = 16, RB = 4, TB = 4, RB1 = 8;
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1); }
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, V v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static float reduce(V v) { return _mm512_reduce_add_ps(v); }
  static V load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load_f16_n(const uint16_t* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p)); }
  static V widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static V load_bf16(const uint16_t* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load_bf16_n(const uint16_t* p, int n) { return widen_bf16(_mm256_maskz_loadu_epi16(mask(n), p)); }
  static V load_q8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }
  // exp by 2^n·e^r, r = x − n·ln2 in [−ln2/2, ln2/2] (Cody–Waite split), Cephes' expf polynomial.
  static V exp(V x) {
    x = _mm512_min_ps(_mm512_max_ps(x, set1(-87.33654f)), set1(88.72283f));
    V n = _mm512_roundscale_ps(_mm512_mul_ps(x, set1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, set1(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, set1(-2.12194440e-4f), r);
    V p = set1(1.9875691500e-4f);
    p = fma(p, r, set1(1.3981999507e-3f));
    p = fma(p, r, set1(8.3334519073e-3f));
    p = fma(p, r, set1(4.1665795894e-2f));
    p = fma(p, r, set1(1.6666665459e-1f));
    p = fma(p, r, set1(5.0000001201e-1f));
    p = fma(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, set1(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
};

// Products of two floats are exact in FP64, so only the order of the sums differs from a
// sequential loop.
double dot_f64(const float* a, const float* b, int64_t n) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(a + i)), _mm512_cvtps_pd(_mm256_loadu_ps(b + i)), s0);
    s1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(a + i + 8)), _mm512_cvtps_pd(_mm256_loadu_ps(b + i + 8)), s1);
  }
  for (; i < n; i += 8) {
    __mmask8 m = static_cast<__mmask8>(n - i >= 8 ? 0xFF : (1u << (n - i)) - 1);
    s0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, a + i)), _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, b + i)), s0);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

constexpr Kernels kTable = make_kernels<Avx512>(Isa::avx512, dot_f64);

}  // namespace

const Kernels& avx512_kernels() { return kTable; }

}  // namespace regolith::cpu
