// IEEE binary16 and bfloat16 conversions, bit-exact with the usual round-to-nearest-even.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace regolith {

inline float bf16_to_f32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);  // subnormal or zero
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;            // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;           // rounds to infinity
  if (a < 0x38800000u) {                                 // subnormal result
    if (a < 0x33000000u) return sign;                    // below half the smallest subnormal
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(a >> 23);         // 14..24
    uint32_t half_ulp = 1u << (shift - 1);
    uint32_t rest = mant & ((1u << shift) - 1);
    uint32_t q = mant >> shift;
    if (rest > half_ulp || (rest == half_ulp && (q & 1))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  a += 0xfffu + ((a >> 13) & 1u) - (112u << 23);         // rebias, round to nearest even
  return sign | static_cast<uint16_t>(a >> 13);
}

}  // namespace regolith
