// Per-type row codecs behind the public API of rows.h, one family per source file:
// legacy.cpp (32/64-value blocks), kquants.cpp (256-value K-quants and Q8_K), iq4.cpp (IQ4_NL,
// IQ4_XS), iq_grid_quants.cpp (IQ2_*, IQ3_*). n is always a whole number of blocks (checked by
// the caller); importance, when given, holds one weight per value of the row (an importance
// matrix row: mean squared activation of each input column).
#pragma once

#include <cstdint>

namespace regolith::quant {

#define REGOLITH_ROW_CODEC(name)                                       \
  void dequantize_##name(const void* in, int64_t n, float* y);        \
  void quantize_##name(const float* x, int64_t n, void* out, const float* importance)

REGOLITH_ROW_CODEC(q4_0);
REGOLITH_ROW_CODEC(q4_1);
REGOLITH_ROW_CODEC(q5_0);
REGOLITH_ROW_CODEC(q5_1);
REGOLITH_ROW_CODEC(q8_0);
REGOLITH_ROW_CODEC(q8_1);
REGOLITH_ROW_CODEC(q2_0);
REGOLITH_ROW_CODEC(mxfp4);
REGOLITH_ROW_CODEC(q2_k);
REGOLITH_ROW_CODEC(q3_k);
REGOLITH_ROW_CODEC(q4_k);
REGOLITH_ROW_CODEC(q5_k);
REGOLITH_ROW_CODEC(q6_k);
REGOLITH_ROW_CODEC(q8_k);
REGOLITH_ROW_CODEC(iq4_nl);
REGOLITH_ROW_CODEC(iq4_xs);
REGOLITH_ROW_CODEC(iq2_xxs);
REGOLITH_ROW_CODEC(iq2_xs);
REGOLITH_ROW_CODEC(iq2_s);
REGOLITH_ROW_CODEC(iq3_xxs);
REGOLITH_ROW_CODEC(iq3_s);

#undef REGOLITH_ROW_CODEC

// MXFP4's shared exponent: 2^(e−127), halved because the E2M1 table is stored doubled
// (ggml's GGML_E8M0_TO_FP32_HALF, including its two subnormal cases).
float e8m0_to_f32_half(uint8_t e);

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K scale field.
inline void k4_scale_min(int j, const uint8_t* s, uint8_t& scale, uint8_t& min) {
  if (j < 4) {
    scale = s[j] & 63;
    min = s[j + 4] & 63;
  } else {
    scale = static_cast<uint8_t>((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
    min = static_cast<uint8_t>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// The sixteen 6-bit codes (0..63, biased by 32) of a Q3_K scale field.
void q3k_scale_codes(const uint8_t* s, int8_t* codes);

}  // namespace regolith::quant
