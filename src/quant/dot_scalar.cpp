// Reference dot kernels: dequantize a chunk of the weight row and of the activations with the
// bit-exact codecs, then accumulate the products in double. Obviously correct, and the judge of
// the SIMD kernels; also the fallback on CPUs without AVX2.
#include <cstring>
#include <vector>

#include "core/half.h"
#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/rows.h"

namespace regolith::quant {
namespace {

using Dequantize = void (*)(const void* in, int64_t n, float* y);

void dequantize_f32(const void* in, int64_t n, float* y) { std::memcpy(y, in, static_cast<size_t>(n) * 4); }
void dequantize_f16(const void* in, int64_t n, float* y) {
  const auto* p = static_cast<const uint8_t*>(in);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = f16_to_f32(h);
  }
}
void dequantize_bf16(const void* in, int64_t n, float* y) {
  const auto* p = static_cast<const uint8_t*>(in);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = bf16_to_f32(h);
  }
}

// Chunks of 256 values and a shorter last one: a whole number of blocks of both formats, since
// n is a valid row length (a multiple of 256 for 256-value blocks, of 64 for Q2_0).
constexpr int64_t kChunk = 256;

template <GgmlType W, GgmlType A, Dequantize dequantize_w, Dequantize dequantize_a>
float dot(int64_t n, const void* row, const void* act) {
  const GgmlTypeTraits& tw = traits(W);
  const GgmlTypeTraits& ta = traits(A);
  float w[kChunk], a[kChunk];
  double sum = 0;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t chunk = n - off < kChunk ? n - off : kChunk;
    dequantize_w(static_cast<const uint8_t*>(row) + off / tw.block_size * tw.block_bytes, chunk, w);
    dequantize_a(static_cast<const uint8_t*>(act) + off / ta.block_size * ta.block_bytes, chunk, a);
    for (int64_t i = 0; i < chunk; ++i) sum += static_cast<double>(w[i]) * a[i];
  }
  return static_cast<float>(sum);
}

template <GgmlType W, Dequantize dw>
constexpr VecDot q8_0_dot = dot<W, GgmlType::Q8_0, dw, dequantize_q8_0>;
template <GgmlType W, Dequantize dw>
constexpr VecDot q8_k_dot = dot<W, GgmlType::Q8_K, dw, dequantize_q8_k>;

DotTable make_table() {
  DotTable t{};
  auto set = [&](GgmlType type, VecDot fn) { t[static_cast<int>(type)] = fn; };
  set(GgmlType::F32, dot<GgmlType::F32, GgmlType::F32, dequantize_f32, dequantize_f32>);
  set(GgmlType::F16, dot<GgmlType::F16, GgmlType::F32, dequantize_f16, dequantize_f32>);
  set(GgmlType::BF16, dot<GgmlType::BF16, GgmlType::F32, dequantize_bf16, dequantize_f32>);
  set(GgmlType::Q4_0, q8_0_dot<GgmlType::Q4_0, dequantize_q4_0>);
  set(GgmlType::Q5_0, q8_0_dot<GgmlType::Q5_0, dequantize_q5_0>);
  set(GgmlType::Q8_0, q8_0_dot<GgmlType::Q8_0, dequantize_q8_0>);
  set(GgmlType::Q2_0, q8_0_dot<GgmlType::Q2_0, dequantize_q2_0>);
  set(GgmlType::MXFP4, q8_0_dot<GgmlType::MXFP4, dequantize_mxfp4>);
  set(GgmlType::IQ4_NL, q8_0_dot<GgmlType::IQ4_NL, dequantize_iq4_nl>);
  set(GgmlType::Q4_1, q8_0_dot<GgmlType::Q4_1, dequantize_q4_1>);
  set(GgmlType::Q5_1, q8_0_dot<GgmlType::Q5_1, dequantize_q5_1>);
  set(GgmlType::Q2_K, q8_k_dot<GgmlType::Q2_K, dequantize_q2_k>);
  set(GgmlType::Q3_K, q8_k_dot<GgmlType::Q3_K, dequantize_q3_k>);
  set(GgmlType::Q4_K, q8_k_dot<GgmlType::Q4_K, dequantize_q4_k>);
  set(GgmlType::Q5_K, q8_k_dot<GgmlType::Q5_K, dequantize_q5_k>);
  set(GgmlType::Q6_K, q8_k_dot<GgmlType::Q6_K, dequantize_q6_k>);
  set(GgmlType::IQ2_XXS, q8_k_dot<GgmlType::IQ2_XXS, dequantize_iq2_xxs>);
  set(GgmlType::IQ2_XS, q8_k_dot<GgmlType::IQ2_XS, dequantize_iq2_xs>);
  set(GgmlType::IQ2_S, q8_k_dot<GgmlType::IQ2_S, dequantize_iq2_s>);
  set(GgmlType::IQ3_XXS, q8_k_dot<GgmlType::IQ3_XXS, dequantize_iq3_xxs>);
  set(GgmlType::IQ3_S, q8_k_dot<GgmlType::IQ3_S, dequantize_iq3_s>);
  set(GgmlType::IQ4_XS, q8_k_dot<GgmlType::IQ4_XS, dequantize_iq4_xs>);
  return t;
}

}  // namespace

const float* f16_to_f32_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = f16_to_f32(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

const DotTable& scalar_dot_table() {
  static const DotTable table = make_table();
  return table;
}

}  // namespace regolith::quant
