// Format constants of the I-quants and FP4 (the grids defined in iq_grids.cpp), copied as data
// from ggml-common.h of llama.cpp v0.5.0, plus the sign-parity rule the 7-bit sign fields use.
#pragma once

#include <bit>
#include <cstdint>

namespace regolith::quant {

extern const uint64_t kIq2XxsGrid[256];
extern const uint64_t kIq2XsGrid[512];
extern const uint64_t kIq2SGrid[1024];
extern const uint32_t kIq3XxsGrid[256];
extern const uint32_t kIq3SGrid[512];
// ggml-common.h kvalues_iq4nl and kvalues_fp4 (E2M1 values, doubled so that they are integers).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
inline constexpr int8_t kFp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// IQ2_XXS, IQ2_XS and IQ3_XXS store 7 sign bits per 8 values; the eighth makes the number of
// negative values even (ggml's ksigns_iq2xs table is exactly this function).
inline uint8_t signs_from_seven(uint32_t seven) {
  seven &= 127;
  return static_cast<uint8_t>(seven | ((std::popcount(seven) & 1u) << 7));
}

}  // namespace regolith::quant
