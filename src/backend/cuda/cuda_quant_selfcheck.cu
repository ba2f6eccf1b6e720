// Host check of the MXFP4 and grid I-quant decoders of cuda_quant.cuh (their __host__ __device__
// bodies, given the host grids) against quant::dequantize_row, bit for bit, on random bytes and
// on quantized random rows. Needs no GPU: run regolith_cuda_quant_selfcheck; exit status 0 = pass.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/cuda_quant.cuh"
#include "core/half.h"
#include "quant/rows.h"

namespace regolith::cuda {
namespace {

void decode_host(GgmlType type, const uint8_t* row, int64_t K, float* y) {
  for (int64_t c = 0; c < K / 32; ++c) {
    float* v = y + 32 * c;
    switch (type) {
      case GgmlType::MXFP4: mxfp4_chunk(row, c, v); break;
      case GgmlType::IQ2_XXS: iq2_xxs_chunk(row, c, quant::kIq2XxsGrid, v); break;
      case GgmlType::IQ2_XS: iq2_xs_chunk(row, c, quant::kIq2XsGrid, v); break;
      case GgmlType::IQ2_S: iq2_s_chunk(row, c, quant::kIq2SGrid, v); break;
      case GgmlType::IQ3_XXS: iq3_xxs_chunk(row, c, quant::kIq3XxsGrid, v); break;
      case GgmlType::IQ3_S: iq3_s_chunk(row, c, quant::kIq3SGrid, v); break;
      default: break;
    }
  }
}

bool same(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y || (std::isnan(a) && std::isnan(b));
}

int check_type(GgmlType type) {
  const int64_t K = 1024;
  const uint64_t bytes = row_bytes(type, K), block_bytes = traits(type).block_bytes;
  std::mt19937 rng(static_cast<uint32_t>(type));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<uint8_t> row(bytes + 16);
  std::vector<float> want(K), got(K), x(K);
  int bad = 0;
  for (int it = 0; it < 3000; ++it) {
    const int mode = it % 3;  // 0: random bytes, 1: random bytes with finite scales, 2: a quantized row
    if (mode < 2) {
      for (uint64_t i = 0; i < bytes; ++i) row[i] = static_cast<uint8_t>(byte(rng));
      if (mode == 1 && type != GgmlType::MXFP4)
        for (uint64_t b = 0; b < bytes; b += block_bytes) {
          const uint16_t d = f32_to_f16(value(rng) * 0.01f);
          std::memcpy(row.data() + b, &d, 2);
        }
    } else {
      for (float& v : x) v = value(rng) * (1.0f + it % 7);
      quantize_row(type, x.data(), K, row.data());
    }
    dequantize_row(type, row.data(), K, want.data());
    decode_host(type, row.data(), K, got.data());
    for (int64_t i = 0; i < K; ++i)
      if (!same(want[i], got[i]) && bad++ < 5)
        std::printf("%s: value %lld: cpu %.9g, decoder %.9g (mode %d)\n", std::string(type_name(type)).c_str(),
                    static_cast<long long>(i), want[i], got[i], mode);
  }
  std::printf("%-8s %s\n", std::string(type_name(type)).c_str(), bad ? "MISMATCH" : "ok (3000 rows, bit-exact)");
  return bad;
}

}  // namespace
}  // namespace regolith::cuda

int main() {
  using regolith::GgmlType;
  int bad = 0;
  for (GgmlType t : {GgmlType::MXFP4, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS,
                     GgmlType::IQ3_S})
    bad += regolith::cuda::check_type(t);
  return bad ? 1 : 0;
}
