#include "quant/rows.h"

#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "quant/formats.h"

namespace regolith {
namespace {

struct Codec {
  void (*dequantize)(const void* in, int64_t n, float* y);
  void (*quantize)(const float* x, int64_t n, void* out, const float* importance);
};

void dequantize_f32(const void* in, int64_t n, float* y) { std::memcpy(y, in, static_cast<size_t>(n) * 4); }
void quantize_f32(const float* x, int64_t n, void* out, const float*) { std::memcpy(out, x, static_cast<size_t>(n) * 4); }

void dequantize_f16(const void* in, int64_t n, float* y) {
  const auto* p = static_cast<const uint8_t*>(in);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    y[i] = f16_to_f32(h);
  }
}
void quantize_f16(const float* x, int64_t n, void* out, const float*) {
  auto* p = static_cast<uint8_t*>(out);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h = f32_to_f16(x[i]);
    std::memcpy(p + 2 * i, &h, 2);
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
void quantize_bf16(const float* x, int64_t n, void* out, const float*) {
  auto* p = static_cast<uint8_t*>(out);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h = f32_to_bf16(x[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

Codec codec(GgmlType type) {
  using namespace quant;
  switch (type) {
    case GgmlType::F32: return {dequantize_f32, quantize_f32};
    case GgmlType::F16: return {dequantize_f16, quantize_f16};
    case GgmlType::BF16: return {dequantize_bf16, quantize_bf16};
    case GgmlType::Q4_0: return {dequantize_q4_0, quantize_q4_0};
    case GgmlType::Q4_1: return {dequantize_q4_1, quantize_q4_1};
    case GgmlType::Q5_0: return {dequantize_q5_0, quantize_q5_0};
    case GgmlType::Q5_1: return {dequantize_q5_1, quantize_q5_1};
    case GgmlType::Q8_0: return {dequantize_q8_0, quantize_q8_0};
    case GgmlType::Q8_1: return {dequantize_q8_1, quantize_q8_1};
    case GgmlType::Q2_0: return {dequantize_q2_0, quantize_q2_0};
    case GgmlType::MXFP4: return {dequantize_mxfp4, quantize_mxfp4};
    case GgmlType::Q2_K: return {dequantize_q2_k, quantize_q2_k};
    case GgmlType::Q3_K: return {dequantize_q3_k, quantize_q3_k};
    case GgmlType::Q4_K: return {dequantize_q4_k, quantize_q4_k};
    case GgmlType::Q5_K: return {dequantize_q5_k, quantize_q5_k};
    case GgmlType::Q6_K: return {dequantize_q6_k, quantize_q6_k};
    case GgmlType::Q8_K: return {dequantize_q8_k, quantize_q8_k};
    case GgmlType::IQ4_NL: return {dequantize_iq4_nl, quantize_iq4_nl};
    case GgmlType::IQ4_XS: return {dequantize_iq4_xs, quantize_iq4_xs};
    case GgmlType::IQ2_XXS: return {dequantize_iq2_xxs, quantize_iq2_xxs};
    case GgmlType::IQ2_XS: return {dequantize_iq2_xs, quantize_iq2_xs};
    case GgmlType::IQ2_S: return {dequantize_iq2_s, quantize_iq2_s};
    case GgmlType::IQ3_XXS: return {dequantize_iq3_xxs, quantize_iq3_xxs};
    case GgmlType::IQ3_S: return {dequantize_iq3_s, quantize_iq3_s};
    default: return {nullptr, nullptr};
  }
}

}  // namespace

bool can_quantize(GgmlType type) { return codec(type).quantize != nullptr; }
bool can_dequantize(GgmlType type) { return codec(type).dequantize != nullptr; }

void check_row_length(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = traits(type);
  if (n <= 0 || n % t.block_size != 0) {
    const char* hint = t.block_size == 256 ? " (rows such as ffn_down_exps' 640 or per_layer_token_embd's 160 need a"
                                             " 32-value type: q8_0, q5_1, q4_1, q4_0, iq4_nl, mxfp4)"
                                           : "";
    fail("a row of ", n, " values cannot be stored as ", t.name, ": it needs a positive multiple of ",
         t.block_size, " values", hint);
  }
}

void quantize_row(GgmlType type, const float* x, int64_t n, uint8_t* out, const float* importance) {
  Codec c = codec(type);
  if (!c.quantize) fail("quantizing to ", type_name(type), " is not supported");
  check_row_length(type, n);
  c.quantize(x, n, out, importance);
}

void dequantize_row(GgmlType type, const uint8_t* in, int64_t n, float* y) {
  Codec c = codec(type);
  if (!c.dequantize) fail("reading ", type_name(type), " tensors is not supported");
  check_row_length(type, n);
  c.dequantize(in, n, y);
}

}  // namespace regolith
