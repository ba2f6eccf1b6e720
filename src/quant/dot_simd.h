// SIMD dot kernels on 256-bit vectors, written once as templates over an instruction-set policy
// P that supplies the byte dot product:
//   P::dot(w, a)            Σ over each 4 bytes of w[u8]·a[s8] into 8 int32 lanes
//   P::dot_scaled(w, a, s)  Σ over each 2 bytes of w[u8]·a[s8], times the int16 scale of that
//                           pair, into 8 int32 lanes (s from scales16)
// Included only by dot_avx2.cpp and dot_avx512.cpp, each compiled with its target flags; all
// code here has internal linkage so that no instruction of one set can leak into another TU,
// and the tables are constant-initialized so that nothing runs before the CPU check.
//
// Value order: activation blocks hold values in row order; each kernel unpacks its weights into
// 32 bytes in that same order. Legend: w weights, a activations, d scales, isum integer sums.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/blocks.h"
#include "quant/dot_kernels.h"
#include "quant/formats.h"
#include "quant/iq_grids.h"

namespace regolith::quant {
namespace {

// ---- tables: ±1 bytes for 7-bit sign fields (constant data, computed at compile time) --------

struct SignTables {
  uint64_t seven[128];  // 7 stored bits + parity bit → 8 bytes of +1/−1
};

constexpr uint64_t sign_bytes(unsigned bits) {
  uint64_t v = 0;
  for (int j = 0; j < 8; ++j) v |= static_cast<uint64_t>((bits >> j) & 1 ? 0xFF : 0x01) << (8 * j);
  return v;
}

constexpr SignTables make_sign_tables() {
  SignTables t{};
  for (unsigned i = 0; i < 128; ++i) {
    unsigned parity = 0;
    for (unsigned b = i; b; b >>= 1) parity ^= b & 1;
    t.seven[i] = sign_bytes(i | (parity << 7));
  }
  return t;
}

constexpr SignTables kSigns = make_sign_tables();

// ---- helpers ------------------------------------------------------------------------------

inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i load128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m128i load64(const void* p) { return _mm_loadl_epi64(static_cast<const __m128i*>(p)); }
inline float f16(uint16_t h) { return _cvtsh_ss(h); }

// Block scales convert through a table (one load instead of a chain of conversions per block).
struct F16 {
  const float* table = f16_to_f32_table();
  float operator()(uint16_t h) const { return table[h]; }
};

// ---- super-block scales as int16 multipliers for vpmaddwd ----------------------------------

struct ShuffleTables {
  uint8_t pair[4][32];  // int16 lanes 2j, 2j+1 of a half → low and high 128-bit lanes
  uint8_t one[8][32];   // int16 lane k → every lane
};

constexpr ShuffleTables make_shuffle_tables() {
  ShuffleTables t{};
  for (int j = 0; j < 4; ++j)
    for (int b = 0; b < 32; ++b) t.pair[j][b] = static_cast<uint8_t>(4 * j + (b >= 16 ? 2 : 0) + (b & 1));
  for (int k = 0; k < 8; ++k)
    for (int b = 0; b < 32; ++b) t.one[k][b] = static_cast<uint8_t>(2 * k + (b & 1));
  return t;
}

constexpr ShuffleTables kShuffles = make_shuffle_tables();

// Sixteen scales (one per 16 values), from 16 signed bytes.
struct Scales16 {
  __m256i half[2];  // scales 8h..8h+7 as int16, the same in both 128-bit lanes
  explicit Scales16(__m128i bytes) {
    const __m256i s = _mm256_cvtepi8_epi16(bytes);
    const __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
    half[0] = _mm256_set_m128i(lo, lo);
    half[1] = _mm256_set_m128i(hi, hi);
  }
  // Multipliers for the 32 values of sub-blocks 2k (first 16) and 2k+1.
  __m256i pair(int k) const { return _mm256_shuffle_epi8(half[k >> 2], load256(kShuffles.pair[k & 3])); }
};

// Eight scales (one per 32 values), from 8 signed bytes.
struct Scales8 {
  __m256i all;
  explicit Scales8(__m128i bytes) {
    const __m128i s = _mm_cvtepi8_epi16(bytes);
    all = _mm256_set_m128i(s, s);
  }
  __m256i one(int k) const { return _mm256_shuffle_epi8(all, load256(kShuffles.one[k])); }
};

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 16 bytes of nibbles → 32 bytes: low nibbles (values 0..15), then high nibbles (16..31).
inline __m256i nibbles(const uint8_t* q) {
  const __m128i b = load128(q);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

// Bit j of `bits` → byte j: 0xFF where set, 0 elsewhere.
inline __m256i bit_mask_bytes(uint32_t bits) {
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuffle);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// Σ w·a for signed weights, via |w| and a with w's sign.
template <typename P>
inline __m256i dot_signed(__m256i w, __m256i a) {
  return P::dot(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

template <typename P>
inline __m256i dot_signed_scaled(__m256i w, __m256i a, __m256i s) {
  return P::dot_scaled(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w), s);
}


inline __m256i lut16(const int8_t* table) { return _mm256_broadcastsi128_si256(load128(table)); }

// MXFP4's E8M0 exponent, halved (ggml's GGML_E8M0_TO_FP32_HALF), for all 256 codes.
struct E8m0Table {
  float half[256];
};

constexpr E8m0Table make_e8m0_table() {
  E8m0Table t{};
  for (uint32_t e = 0; e < 256; ++e) t.half[e] = std::bit_cast<float>(e < 2 ? 0x00200000u << e : (e - 1) << 23);
  return t;
}

constexpr E8m0Table kE8m0 = make_e8m0_table();
inline float e8m0_half(uint8_t e) { return kE8m0.half[e]; }

// ---- float weights × float activations ---------------------------------------------------

inline __m256 load_f32x8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load_f16x8(const uint16_t* p) { return _mm256_cvtph_ps(load128(p)); }
inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load128(p)), 16));
}
inline float scalar_f32(const float* p, int64_t i) { return p[i]; }
inline float scalar_f16(const uint16_t* p, int64_t i) { return f16(p[i]); }
inline float scalar_bf16(const uint16_t* p, int64_t i) {
  uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T, __m256 (*load)(const T*), float (*scalar)(const T*, int64_t)>
float dot_float(int64_t n, const void* row, const void* act) {
  const T* w = static_cast<const T*>(row);
  const float* a = static_cast<const float*>(act);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(load(w + i + 8 * k), _mm256_loadu_ps(a + i + 8 * k), acc[k]);
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load(w + i), _mm256_loadu_ps(a + i), acc[0]);
  float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += scalar(w, i) * a[i];
  return sum;
}

// ---- 32-value blocks × Q8_0 ------------------------------------------------------------------
//
// A block type is described by an unpacker: operator() gives its 32 weight bytes in row order
// (signed for the symmetric formats, unsigned codes for the affine ones) and scale() its float
// scale (offset() its offset, for the affine ones). The loops run two blocks per step into two
// accumulators so that the float chain does not bound the speed; dot_avx512.cpp has 512-bit
// loops over the same unpackers.

struct UnpackQ8_0 {
  using Block = BlockQ8_0;
  __m256i operator()(const Block& b) const { return load256(b.qs); }
  float scale(const Block& b, const F16& h) const { return h(b.d); }
};

struct UnpackQ4_0 {
  using Block = BlockQ4_0;
  __m256i operator()(const Block& b) const { return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8)); }
  float scale(const Block& b, const F16& h) const { return h(b.d); }
};

inline __m256i q5_values(const uint8_t* qs, const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return _mm256_or_si256(nibbles(qs), _mm256_and_si256(bit_mask_bytes(bits), _mm256_set1_epi8(0x10)));
}

struct UnpackQ5_0 {
  using Block = BlockQ5_0;
  __m256i operator()(const Block& b) const { return _mm256_sub_epi8(q5_values(b.qs, b.qh), _mm256_set1_epi8(16)); }
  float scale(const Block& b, const F16& h) const { return h(b.d); }
};

struct UnpackIq4Nl {
  using Block = BlockIq4Nl;
  __m256i table = lut16(kIq4NlValues);
  __m256i operator()(const Block& b) const { return _mm256_shuffle_epi8(table, nibbles(b.qs)); }
  float scale(const Block& b, const F16& h) const { return h(b.d); }
};

// MXFP4 keeps a power-of-two exponent instead of an fp16 scale.
struct UnpackMxfp4 {
  using Block = BlockMxfp4;
  __m256i table = lut16(kFp4Values);
  __m256i operator()(const Block& b) const { return _mm256_shuffle_epi8(table, nibbles(b.qs)); }
  float scale(const Block& b, const F16&) const { return e8m0_half(b.e); }
};

// Affine blocks (Q4_1, Q5_1): d·Σq·a + m·Σa, with Σa of the activation codes computed here
// exactly (ggml pairs them with Q8_1, whose fp16 d·Σq rounds).
struct UnpackQ4_1 {
  using Block = BlockQ4_1;
  __m256i operator()(const Block& b) const { return nibbles(b.qs); }
  float scale(const Block& b, const F16& h) const { return h(b.d); }
  float offset(const Block& b, const F16& h) const { return h(b.m); }
};

struct UnpackQ5_1 {
  using Block = BlockQ5_1;
  __m256i operator()(const Block& b) const { return q5_values(b.qs, b.qh); }
  float scale(const Block& b, const F16& h) const { return h(b.d); }
  float offset(const Block& b, const F16& h) const { return h(b.m); }
};

template <typename P, typename U>
float dot_blocks32(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const typename U::Block*>(row);
  const auto* y = static_cast<const BlockQ8_0*>(act);
  const F16 h;
  const U unpack;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  const int64_t nb = n / 32;
  int64_t i = 0;
  for (; i + 1 < nb; i += 2) {
    const __m256i s0 = dot_signed<P>(unpack(x[i]), load256(y[i].qs));
    const __m256i s1 = dot_signed<P>(unpack(x[i + 1]), load256(y[i + 1].qs));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(unpack.scale(x[i], h) * h(y[i].d)), _mm256_cvtepi32_ps(s0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(unpack.scale(x[i + 1], h) * h(y[i + 1].d)), _mm256_cvtepi32_ps(s1), acc1);
  }
  if (i < nb) {
    const __m256i s0 = dot_signed<P>(unpack(x[i]), load256(y[i].qs));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(unpack.scale(x[i], h) * h(y[i].d)), _mm256_cvtepi32_ps(s0), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

template <typename P, typename U>
float dot_affine32(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const typename U::Block*>(row);
  const auto* y = static_cast<const BlockQ8_0*>(act);
  const F16 h;
  const U unpack;
  const __m256i ones = _mm256_set1_epi8(1);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 32; ++i) {
    const __m256i a = load256(y[i].qs);
    const float da = h(y[i].d);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(unpack.scale(x[i], h) * da), _mm256_cvtepi32_ps(P::dot(unpack(x[i]), a)), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(unpack.offset(x[i], h) * da), _mm256_cvtepi32_ps(P::dot(ones, a)), acc1);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// Q2_0: 64 values per block, value j in bits 2(j%4) of byte j/4; spans two Q8_0 blocks.
inline __m256i q2_0_values(const uint8_t* q) {
  const __m256i spread = _mm256_set_epi64x(0x0707070706060606, 0x0505050504040404, 0x0303030302020202, 0x0101010100000000);
  int64_t bytes;
  std::memcpy(&bytes, q, 8);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi64x(bytes), spread);
  // Position p%4 = k keeps bits 2k..2k+1: shift by 0, 2, 4, 6 by lanes, then mask.
  const __m256i pos1 = _mm256_set1_epi32(0x0000FF00), pos2 = _mm256_set1_epi32(0x00FF0000), pos3 = _mm256_set1_epi32(static_cast<int>(0xFF000000u));
  __m256i r = _mm256_blendv_epi8(v, _mm256_srli_epi16(v, 2), pos1);
  r = _mm256_blendv_epi8(r, _mm256_srli_epi16(v, 4), pos2);
  r = _mm256_blendv_epi8(r, _mm256_srli_epi16(v, 6), pos3);
  return _mm256_sub_epi8(_mm256_and_si256(r, _mm256_set1_epi8(3)), _mm256_set1_epi8(1));
}

template <typename P>
float dot_q2_0(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockQ2_0*>(row);
  const auto* y = static_cast<const BlockQ8_0*>(act);
  const F16 h;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / 64; ++i) {
    const float d = h(x[i].d);
    const __m256i s0 = dot_signed<P>(q2_0_values(x[i].qs), load256(y[2 * i].qs));
    const __m256i s1 = dot_signed<P>(q2_0_values(x[i].qs + 8), load256(y[2 * i + 1].qs));
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d * h(y[2 * i].d)), _mm256_cvtepi32_ps(s0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d * h(y[2 * i + 1].d)), _mm256_cvtepi32_ps(s1), acc1);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

// ---- K-quants × Q8_K ------------------------------------------------------------------------
//
// Per super-block: integer sums of w·a scaled by the sub-block scales (vpmaddwd with Scales16 /
// Scales8 multipliers), one float multiply-add by d·d_a; the mins (or the +32 of Q6_K) via
// Σ min·bsums, also in vectors.

// Σ_j mins[j]·bsums[j] for 16 int16 mins (as 8 int32 partial sums).
inline __m256i mins_dot_bsums16(__m128i mins_u8, const int16_t* bsums) {
  return _mm256_madd_epi16(_mm256_cvtepu8_epi16(mins_u8), load256(bsums));
}

template <typename P>
float dot_q2_k(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockQ2_K*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  const __m256i three = _mm256_set1_epi8(3);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps(), acc_min = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const __m128i packed = load128(x[i].scales);
    const Scales16 sc(_mm_and_si128(packed, low4));
    const __m256i mins = mins_dot_bsums16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4), y[i].bsums);
    const int8_t* a = y[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q = load256(x[i].qs + 32 * half);
      for (int j = 0; j < 4; ++j, a += 32) {
        const __m256i w = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three);
        isum = _mm256_add_epi32(isum, P::dot_scaled(w, load256(a), sc.pair(4 * half + j)));
      }
    }
    const float da = y[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(da * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
    acc_min = _mm256_fmadd_ps(_mm256_set1_ps(da * h(x[i].dmin)), _mm256_cvtepi32_ps(mins), acc_min);
  }
  return hsum(_mm256_sub_ps(acc, acc_min));
}

// The sixteen 6-bit scale codes of Q3_K: low nibbles from bytes 0..7 (codes 0..7) and their high
// nibbles (codes 8..15); the top two bits from byte 8 + j%4, bits 2(j/4).
inline __m128i q3k_codes(const uint8_t* s) {
  uint32_t a0, a1, a2;
  std::memcpy(&a0, s, 4);
  std::memcpy(&a1, s + 4, 4);
  std::memcpy(&a2, s + 8, 4);
  const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
  return _mm_set_epi32(static_cast<int>(((a1 >> 4) & m4) | (((a2 >> 6) & m2) << 4)), static_cast<int>(((a0 >> 4) & m4) | (((a2 >> 4) & m2) << 4)),
                       static_cast<int>((a1 & m4) | (((a2 >> 2) & m2) << 4)), static_cast<int>((a0 & m4) | ((a2 & m2) << 4)));
}

template <typename P>
float dot_q3_k(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockQ3_K*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const Scales16 sc(_mm_sub_epi8(q3k_codes(x[i].scales), _mm_set1_epi8(32)));
    const int8_t* a = y[i].qs;
    const __m256i hm = load256(x[i].hmask);
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q = load256(x[i].qs + 32 * half);
      for (int j = 0; j < 4; ++j, a += 32) {
        const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << (4 * half + j)));
        const __m256i high = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
        const __m256i w = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three), _mm256_andnot_si256(high, four));
        isum = _mm256_add_epi32(isum, dot_signed_scaled<P>(w, load256(a), sc.pair(4 * half + j)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum(acc);
}

// The eight 6-bit scales and mins of Q4_K/Q5_K as bytes (low 8 bytes: scales, high: mins).
inline __m128i k4_scales_mins(const uint8_t* s) {
  uint32_t a, b, c;
  std::memcpy(&a, s, 4);
  std::memcpy(&b, s + 4, 4);
  std::memcpy(&c, s + 8, 4);
  const uint32_t sc_lo = a & 0x3f3f3f3f, mn_lo = b & 0x3f3f3f3f;
  const uint32_t sc_hi = (c & 0x0f0f0f0f) | ((a >> 2) & 0x30303030);
  const uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0f) | ((b >> 2) & 0x30303030);
  return _mm_set_epi32(static_cast<int>(mn_hi), static_cast<int>(mn_lo), static_cast<int>(sc_hi), static_cast<int>(sc_lo));
}

template <typename P, bool kFive>
float dot_q45_k(int64_t n, const void* row, const void* act) {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  const auto* x = static_cast<const Block*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  const __m256i low4 = _mm256_set1_epi8(0x0F), sixteen = _mm256_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_min = _mm_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const __m128i sm = k4_scales_mins(x[i].scales);
    const Scales8 sc(sm);
    // Σ_j min_j·(bsums[2j] + bsums[2j+1])
    const __m256i bs = load256(y[i].bsums);
    const __m128i bsum_pairs = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    const __m128i mins = _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_unpackhi_epi64(sm, sm)), bsum_pairs);
    const int8_t* a = y[i].qs;
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = load256(x[i].qh);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c, a += 64) {
      const __m256i q = load256(x[i].qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFive) {
        const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c))), b1 = _mm256_set1_epi8(static_cast<char>(2 << (2 * c)));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
      }
      isum = _mm256_add_epi32(isum, P::dot_scaled(lo, load256(a), sc.one(2 * c)));
      isum = _mm256_add_epi32(isum, P::dot_scaled(hi, load256(a + 32), sc.one(2 * c + 1)));
    }
    const float da = y[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(da * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
    acc_min = _mm_fmadd_ps(_mm_set1_ps(da * h(x[i].dmin)), _mm_cvtepi32_ps(mins), acc_min);
  }
  __m128 m = _mm_add_ps(acc_min, _mm_movehl_ps(acc_min, acc_min));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return hsum(acc) - _mm_cvtss_f32(m);
}

template <typename P>
float dot_q6_k(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockQ6_K*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i m03 = _mm256_set1_epi8(0x03), m0c = _mm256_set1_epi8(0x0C), m30 = _mm256_set1_epi8(0x30);
  const __m256i mc0 = _mm256_set1_epi8(static_cast<char>(0xC0));
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const __m128i scale_bytes = load128(x[i].scales);
    const Scales16 sc(scale_bytes);
    // The codes are stored +32: subtract 32·Σ sc·(Σa per 16 values).
    const __m256i offset = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scale_bytes), load256(y[i].bsums));
    const int8_t* a = y[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half, a += 128) {
      const __m256i ql0 = load256(x[i].ql + 64 * half), ql1 = load256(x[i].ql + 64 * half + 32);
      const __m256i qh = load256(x[i].qh + 32 * half);
      const __m256i w0 = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, m03), 4));
      const __m256i w1 = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_slli_epi16(_mm256_and_si256(qh, m0c), 2));
      const __m256i w2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, m30));
      const __m256i w3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), _mm256_srli_epi16(_mm256_and_si256(qh, mc0), 2));
      isum = _mm256_add_epi32(isum, P::dot_scaled(w0, load256(a), sc.pair(4 * half)));
      isum = _mm256_add_epi32(isum, P::dot_scaled(w1, load256(a + 32), sc.pair(4 * half + 1)));
      isum = _mm256_add_epi32(isum, P::dot_scaled(w2, load256(a + 64), sc.pair(4 * half + 2)));
      isum = _mm256_add_epi32(isum, P::dot_scaled(w3, load256(a + 96), sc.pair(4 * half + 3)));
    }
    isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(offset, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum(acc);
}

// ---- I-quants × Q8_K ----------------------------------------------------------------------

inline __m256i grid8x4(const uint64_t* grid, int i0, int i1, int i2, int i3) {
  return _mm256_set_epi64x(static_cast<int64_t>(grid[i3]), static_cast<int64_t>(grid[i2]), static_cast<int64_t>(grid[i1]), static_cast<int64_t>(grid[i0]));
}

inline __m256i signs8x4(const uint64_t* table, int s0, int s1, int s2, int s3) {
  return _mm256_set_epi64x(static_cast<int64_t>(table[s3]), static_cast<int64_t>(table[s2]), static_cast<int64_t>(table[s1]), static_cast<int64_t>(table[s0]));
}

// a negated where bit j of the 4 bytes at `signs` is set (full 8-bit sign fields).
inline __m256i apply_sign_bits(__m256i a, const uint8_t* signs) {
  uint32_t bits;
  std::memcpy(&bits, signs, 4);
  const __m256i m = bit_mask_bytes(bits);
  return _mm256_sub_epi8(_mm256_xor_si256(a, m), m);
}

// Odd multipliers 2l+1 from 4-bit codes.
inline __m128i odd(__m128i codes) { return _mm_add_epi8(_mm_add_epi8(codes, codes), _mm_set1_epi8(1)); }

// Sixteen 4-bit scales of IQ2_XS/IQ2_S (per 16 values: low nibble first) as 2l+1.
inline Scales16 nibble_scales16(const uint8_t* s) {
  const __m128i b = load64(s), low4 = _mm_set1_epi8(0x0F);
  return Scales16(odd(_mm_unpacklo_epi8(_mm_and_si128(b, low4), _mm_and_si128(_mm_srli_epi16(b, 4), low4))));
}

template <typename P>
float dot_iq2_xxs(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockIq2Xxs*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    uint32_t aux[16];
    std::memcpy(aux, x[i].qs, 64);
    uint8_t codes[16] = {};
    for (int ib = 0; ib < 8; ++ib) codes[ib] = static_cast<uint8_t>(aux[2 * ib + 1] >> 28);
    const Scales8 sc(odd(load64(codes)));
    const int8_t* a = y[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib, a += 32) {
      const uint32_t g = aux[2 * ib], s = aux[2 * ib + 1];
      const __m256i w = grid8x4(kIq2XxsGrid, g & 255, (g >> 8) & 255, (g >> 16) & 255, g >> 24);
      const __m256i sg = signs8x4(kSigns.seven, s & 127, (s >> 7) & 127, (s >> 14) & 127, (s >> 21) & 127);
      isum = _mm256_add_epi32(isum, P::dot_scaled(w, _mm256_sign_epi8(load256(a), sg), sc.one(ib)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return 0.125f * hsum(acc);
}

template <typename P>
float dot_iq2_xs(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockIq2Xs*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const Scales16 sc = nibble_scales16(x[i].scales);
    const int8_t* a = y[i].qs;
    const uint16_t* q = x[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib, a += 32, q += 4) {
      const __m256i w = grid8x4(kIq2XsGrid, q[0] & 511, q[1] & 511, q[2] & 511, q[3] & 511);
      const __m256i sg = signs8x4(kSigns.seven, q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9);
      isum = _mm256_add_epi32(isum, P::dot_scaled(w, _mm256_sign_epi8(load256(a), sg), sc.pair(ib)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return 0.125f * hsum(acc);
}

template <typename P>
float dot_iq2_s(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockIq2S*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const Scales16 sc = nibble_scales16(x[i].scales);
    const int8_t* a = y[i].qs;
    const uint8_t* qs = x[i].qs;
    const uint8_t* sg = x[i].qs + kSuperBlock / 8;
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib, a += 32, qs += 4, sg += 4) {
      const int qh = x[i].qh[ib];
      const __m256i w = grid8x4(kIq2SGrid, qs[0] | ((qh << 8) & 0x300), qs[1] | ((qh << 6) & 0x300),
                                qs[2] | ((qh << 4) & 0x300), qs[3] | ((qh << 2) & 0x300));
      isum = _mm256_add_epi32(isum, P::dot_scaled(w, apply_sign_bits(load256(a), sg), sc.pair(ib)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return 0.125f * hsum(acc);
}

inline __m256i grid4x8(const uint32_t* grid, const int* idx) {
  return _mm256_set_epi32(static_cast<int>(grid[idx[7]]), static_cast<int>(grid[idx[6]]), static_cast<int>(grid[idx[5]]), static_cast<int>(grid[idx[4]]),
                          static_cast<int>(grid[idx[3]]), static_cast<int>(grid[idx[2]]), static_cast<int>(grid[idx[1]]), static_cast<int>(grid[idx[0]]));
}

template <typename P>
float dot_iq3_xxs(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockIq3Xxs*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    uint32_t aux[8];
    std::memcpy(aux, x[i].qs + kSuperBlock / 4, 32);
    uint8_t codes[16] = {};
    for (int ib = 0; ib < 8; ++ib) codes[ib] = static_cast<uint8_t>(aux[ib] >> 28);
    const Scales8 sc(odd(load64(codes)));
    const int8_t* a = y[i].qs;
    const uint8_t* qs = x[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib, a += 32, qs += 8) {
      const int idx[8] = {qs[0], qs[1], qs[2], qs[3], qs[4], qs[5], qs[6], qs[7]};
      const uint32_t s = aux[ib];
      const __m256i sg = signs8x4(kSigns.seven, s & 127, (s >> 7) & 127, (s >> 14) & 127, (s >> 21) & 127);
      isum = _mm256_add_epi32(isum, P::dot_scaled(grid4x8(kIq3XxsGrid, idx), _mm256_sign_epi8(load256(a), sg), sc.one(ib)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return 0.25f * hsum(acc);
}

template <typename P>
float dot_iq3_s(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockIq3S*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const __m128i b = _mm_cvtsi32_si128(static_cast<int>(x[i].scales[0] | (x[i].scales[1] << 8) | (x[i].scales[2] << 16) | (static_cast<uint32_t>(x[i].scales[3]) << 24)));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const Scales8 sc(odd(_mm_unpacklo_epi8(_mm_and_si128(b, low4), _mm_and_si128(_mm_srli_epi16(b, 4), low4))));
    const int8_t* a = y[i].qs;
    const uint8_t* qs = x[i].qs;
    const uint8_t* sg = x[i].signs;
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib, a += 32, qs += 8, sg += 4) {
      const int qh = x[i].qh[ib];
      int idx[8];
      for (int k = 0; k < 8; ++k) idx[k] = qs[k] | (((qh >> k) & 1) << 8);
      isum = _mm256_add_epi32(isum, P::dot_scaled(grid4x8(kIq3SGrid, idx), apply_sign_bits(load256(a), sg), sc.one(ib)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum(acc);
}

template <typename P>
float dot_iq4_xs(int64_t n, const void* row, const void* act) {
  const auto* x = static_cast<const BlockIq4Xs*>(row);
  const auto* y = static_cast<const BlockQ8_K*>(act);
  const F16 h;
  const __m256i table = lut16(kIq4NlValues);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    int8_t codes[16] = {};
    for (int ib = 0; ib < 8; ++ib)
      codes[ib] = static_cast<int8_t>((((x[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((x[i].scales_h >> (2 * ib)) & 3) << 4)) - 32);
    const Scales8 sc(load64(codes));
    const int8_t* a = y[i].qs;
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib, a += 32) {
      const __m256i w = _mm256_shuffle_epi8(table, nibbles(x[i].qs + 16 * ib));
      isum = _mm256_add_epi32(isum, dot_signed_scaled<P>(w, load256(a), sc.one(ib)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(y[i].d * h(x[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum(acc);
}

// ---- the table -------------------------------------------------------------------------------

template <typename P>
constexpr DotTable make_simd_table() {
  DotTable t{};
  t[static_cast<int>(GgmlType::F32)] = dot_float<float, load_f32x8, scalar_f32>;
  t[static_cast<int>(GgmlType::F16)] = dot_float<uint16_t, load_f16x8, scalar_f16>;
  t[static_cast<int>(GgmlType::BF16)] = dot_float<uint16_t, load_bf16x8, scalar_bf16>;
  t[static_cast<int>(GgmlType::Q4_0)] = dot_blocks32<P, UnpackQ4_0>;
  t[static_cast<int>(GgmlType::Q4_1)] = dot_affine32<P, UnpackQ4_1>;
  t[static_cast<int>(GgmlType::Q5_0)] = dot_blocks32<P, UnpackQ5_0>;
  t[static_cast<int>(GgmlType::Q5_1)] = dot_affine32<P, UnpackQ5_1>;
  t[static_cast<int>(GgmlType::Q8_0)] = dot_blocks32<P, UnpackQ8_0>;
  t[static_cast<int>(GgmlType::Q2_0)] = dot_q2_0<P>;
  t[static_cast<int>(GgmlType::MXFP4)] = dot_blocks32<P, UnpackMxfp4>;
  t[static_cast<int>(GgmlType::IQ4_NL)] = dot_blocks32<P, UnpackIq4Nl>;
  t[static_cast<int>(GgmlType::Q2_K)] = dot_q2_k<P>;
  t[static_cast<int>(GgmlType::Q3_K)] = dot_q3_k<P>;
  t[static_cast<int>(GgmlType::Q4_K)] = dot_q45_k<P, false>;
  t[static_cast<int>(GgmlType::Q5_K)] = dot_q45_k<P, true>;
  t[static_cast<int>(GgmlType::Q6_K)] = dot_q6_k<P>;
  t[static_cast<int>(GgmlType::IQ2_XXS)] = dot_iq2_xxs<P>;
  t[static_cast<int>(GgmlType::IQ2_XS)] = dot_iq2_xs<P>;
  t[static_cast<int>(GgmlType::IQ2_S)] = dot_iq2_s<P>;
  t[static_cast<int>(GgmlType::IQ3_XXS)] = dot_iq3_xxs<P>;
  t[static_cast<int>(GgmlType::IQ3_S)] = dot_iq3_s<P>;
  t[static_cast<int>(GgmlType::IQ4_XS)] = dot_iq4_xs<P>;
  return t;
}

}  // namespace
}  // namespace regolith::quant
