// AVX2 kernels (compiled with -mavx2 -mfma -mf16c): byte dot products by vpmaddubsw/vpmaddwd.
#include "quant/dot_simd.h"

namespace regolith::quant {
namespace {

struct Avx2 {
  static __m256i dot(__m256i w, __m256i a) { return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1)); }
  static __m256i dot_scaled(__m256i w, __m256i a, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), s); }
};

constexpr DotTable kTable = make_simd_table<Avx2>();

}  // namespace

const DotTable& avx2_dot_table() { return kTable; }

}  // namespace regolith::quant
