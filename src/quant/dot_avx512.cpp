// AVX-512 kernels (compiled with AVX-512 F/BW/VL/VNNI): unscaled byte dot products by vpdpbusd;
// scaled ones keep vpmaddubsw/vpmaddwd, which beats vpdpbusd + vpmulld.
#include "quant/dot_simd.h"

namespace regolith::quant {
namespace {

struct Avx512 {
  static __m256i dot(__m256i w, __m256i a) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, a); }
  static __m256i dot_scaled(__m256i w, __m256i a, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), s); }
};

constexpr DotTable kTable = make_simd_table<Avx512>();

}  // namespace

const DotTable& avx512_dot_table() { return kTable; }

}  // namespace regolith::quant
