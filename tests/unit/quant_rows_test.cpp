// Float conversions and the row encoders the foundation needs (F16, BF16, Q8_0).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "quant/rows.h"

using namespace regolith;

TEST(Half, F16RoundTripsEveryHalfValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(Half, F16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // halfway to the next: rounds to infinity
  EXPECT_EQ(f32_to_f16(1.0f + 1.0f / 2048), 0x3c00);  // tie, even mantissa stays
  EXPECT_EQ(f32_to_f16(1.0f + 3.0f / 2048), 0x3c02);  // tie, odd mantissa rounds up
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);           // half the smallest subnormal: ties to 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(3.0f, -24)), 0x8003);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // tie to even
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(bf16_to_f32(0xc040), -3.0f);
}

TEST(QuantRows, Q8_0MatchesTheFormatDefinition) {
  std::mt19937 rng(1);
  std::normal_distribution<float> n(0, 2);
  std::vector<float> x(96), y(96);
  for (float& v : x) v = n(rng);
  x[5] = 0;
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block
  std::vector<uint8_t> q(row_bytes(GgmlType::Q8_0, 96));
  ASSERT_EQ(q.size(), 3u * 34);
  quantize_row(GgmlType::Q8_0, x.data(), 96, q.data());
  dequantize_row(GgmlType::Q8_0, q.data(), 96, y.data());
  for (int b = 0; b < 3; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    uint16_t dh = static_cast<uint16_t>(q[b * 34] | (q[b * 34 + 1] << 8));
    EXPECT_EQ(dh, f32_to_f16(amax / 127));
    for (int j = 0; j < 32; ++j) EXPECT_NEAR(y[b * 32 + j], x[b * 32 + j], amax / 127 * 0.51 + 1e-3 * amax) << b << "," << j;
  }
  for (int j = 32; j < 64; ++j) EXPECT_EQ(y[j], 0.0f);
  EXPECT_THROW(quantize_row(GgmlType::Q8_0, x.data(), 33, q.data()), Error);
  EXPECT_THROW(quantize_row(GgmlType::IQ1_S, x.data(), 256, q.data()), Error);  // no codec
}
