#include "quant/rows.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace regolith {
namespace {

constexpr int kQ8Block = 32;

// Q8_0: per 32 values an fp16 scale d = max|x| / 127 and 32 int8 codes, x ≈ d·q.
void quantize_q8_0(const float* x, int64_t n, uint8_t* out) {
  for (int64_t b = 0; b < n / kQ8Block; ++b, x += kQ8Block, out += 2 + kQ8Block) {
    float amax = 0;
    for (int j = 0; j < kQ8Block; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    float d = amax / 127.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    uint16_t dh = f32_to_f16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < kQ8Block; ++j) out[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::roundf(x[j] * id)));
  }
}

void dequantize_q8_0(const uint8_t* in, int64_t n, float* y) {
  for (int64_t b = 0; b < n / kQ8Block; ++b, in += 2 + kQ8Block, y += kQ8Block) {
    uint16_t dh;
    std::memcpy(&dh, in, 2);
    float d = f16_to_f32(dh);
    for (int j = 0; j < kQ8Block; ++j) y[j] = d * static_cast<int8_t>(in[2 + j]);
  }
}

}  // namespace

bool can_quantize(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 || type == GgmlType::Q8_0;
}

bool can_dequantize(GgmlType type) { return can_quantize(type); }

void quantize_row(GgmlType type, const float* x, int64_t n, uint8_t* out) {
  row_bytes(type, n);  // validates n against the block size
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out, x, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_f16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = f32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q8_0:
      quantize_q8_0(x, n, out);
      return;
    default:
      fail("quantizing to ", type_name(type), " is not supported yet");
  }
}

void dequantize_row(GgmlType type, const uint8_t* in, int64_t n, float* y) {
  row_bytes(type, n);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(y, in, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        y[i] = f16_to_f32(h);
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, in + 2 * i, 2);
        y[i] = bf16_to_f32(h);
      }
      return;
    case GgmlType::Q8_0:
      dequantize_q8_0(in, n, y);
      return;
    default:
      fail("reading ", type_name(type), " tensors is not supported yet");
  }
}

}  // namespace regolith
