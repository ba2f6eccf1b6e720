// Byte layouts of ggml's block formats (ggml/src/ggml-common.h, llama.cpp v0.5.0). These are
// file-format data: field order, widths and padding must match ggml exactly, which the
// static_asserts against core/ggml_type.cpp's sizes check. Scales stored as fp16 are kept as
// raw uint16_t bits; the meaning of every field is documented where it is decoded.
#pragma once

#include <cstdint>

namespace regolith::quant {

constexpr int kSuperBlock = 256;  // values per block of the K- and 256-wide I-quants (ggml QK_K)

struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };                       // x = d·(q − 8)
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };                    // x = d·q + m
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };        // x = d·(q − 16)
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };     // x = d·q + m
struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };                        // x = d·q
struct BlockQ8_1 { uint16_t d, s; int8_t qs[32]; };                     // s = d·Σq (activations)
struct BlockQ2_0 { uint16_t d; uint8_t qs[16]; };                       // 64 values, x = d·(q − 1)
struct BlockMxfp4 { uint8_t e; uint8_t qs[16]; };                       // E8M0 scale, E2M1 codes

// Nibble order in the 32-value formats above: byte j holds value j (low) and j+16 (high).

struct BlockQ2_K {
  uint8_t scales[16];  // low nibble: scale, high nibble: min, per 16 values
  uint8_t qs[64];      // 2-bit codes
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];   // third bit of each code
  uint8_t qs[64];      // low two bits
  uint8_t scales[12];  // sixteen 6-bit scales, biased by 32
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];  // eight 6-bit scales and eight 6-bit mins
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
struct BlockQ8_K {      // activations only: float scale and per-16 sums of the codes
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

struct BlockIq2Xxs { uint16_t d; uint16_t qs[32]; };
struct BlockIq2Xs { uint16_t d; uint16_t qs[32]; uint8_t scales[8]; };
struct BlockIq2S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t scales[8]; };  // qs: 32 grid ids, 32 sign bytes
struct BlockIq3Xxs { uint16_t d; uint8_t qs[96]; };                   // 64 grid ids, 8 × (scale, signs) words
struct BlockIq3S { uint16_t d; uint8_t qs[64]; uint8_t qh[8]; uint8_t signs[32]; uint8_t scales[4]; };
struct BlockIq4Nl { uint16_t d; uint8_t qs[16]; };
struct BlockIq4Xs { uint16_t d; uint16_t scales_h; uint8_t scales_l[4]; uint8_t qs[128]; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_0) == 18 && sizeof(BlockMxfp4) == 17);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIq2Xxs) == 66 && sizeof(BlockIq2Xs) == 74 && sizeof(BlockIq2S) == 82);
static_assert(sizeof(BlockIq3Xxs) == 98 && sizeof(BlockIq3S) == 110);
static_assert(sizeof(BlockIq4Nl) == 18 && sizeof(BlockIq4Xs) == 136);

}  // namespace regolith::quant
