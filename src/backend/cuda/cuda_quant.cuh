// Weight decoding on the device: every weight type the kernels read in place, as 32-value chunks
// of a row (chunk c holds values 32c .. 32c+31). Rows start at multiples of 16 bytes (the device
// pitch is padded), and Q8_0 rows are rearranged (below); other layouts are ggml's (src/quant/blocks.h, decoded
// as in src/quant/legacy.cpp, kquants.cpp, iq4.cpp, iq_grid_quants.cpp); F32/F16/BF16 rows may end in a partial chunk,
// whose missing values read as 0. Types without a decoder here (of those quant/rows.cpp reads,
// only the activation types Q8_1 and Q8_K) are dequantized once on the host at upload and read as
// F32 (CudaBackend::matrix).
#pragma once

#include <cuda_fp16.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "core/ggml_type.h"
#include "quant/blocks.h"
#include "quant/iq_grids.h"

namespace regolith::cuda {

__device__ __forceinline__ float f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// ggml's IQ4_NL grid (ggml-common.h kvalues_iq4nl), the same data as src/quant/iq_grids.cpp;
// aligned so that the int8 tile can read it as four words.
alignas(16) static __device__ __constant__ const int8_t kIq4Nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                                  1,    13,   25,  38,  53,  69,  89,  113};

template <GgmlType kType>
struct Dq;

template <>
struct Dq<GgmlType::F32> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t K, float* y) {
    const float* p = reinterpret_cast<const float*>(row) + c * 32;
    int64_t n = K - c * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = j < n ? p[j] : 0.0f;
  }
};

template <>
struct Dq<GgmlType::F16> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t K, float* y) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + c * 32;
    int64_t n = K - c * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = j < n ? f16(p[j]) : 0.0f;
  }
};

template <>
struct Dq<GgmlType::BF16> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t K, float* y) {
    const uint16_t* p = reinterpret_cast<const uint16_t*>(row) + c * 32;
    int64_t n = K - c * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = j < n ? bf16(p[j]) : 0.0f;
  }
};

// Q8_0 rows are stored on the device as their K codes followed by their K/32 fp16 scales
// (to_device_layout), so that codes can be read with aligned 16-byte loads.
template <>
struct Dq<GgmlType::Q8_0> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t K, float* y) {
    const int8_t* q = reinterpret_cast<const int8_t*>(row) + c * 32;
    const float d = f16(reinterpret_cast<const uint16_t*>(row + K)[c]);
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = q[j] * d;
  }
};

template <>
struct Dq<GgmlType::Q4_0> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ4_0*>(row)[c];
    const float d = f16(b.d);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      y[j] = ((b.qs[j] & 0x0F) - 8) * d;
      y[j + 16] = ((b.qs[j] >> 4) - 8) * d;
    }
  }
};

template <>
struct Dq<GgmlType::Q4_1> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ4_1*>(row)[c];
    const float d = f16(b.d), m = f16(b.m);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      y[j] = (b.qs[j] & 0x0F) * d + m;
      y[j + 16] = (b.qs[j] >> 4) * d + m;
    }
  }
};

__device__ __forceinline__ uint32_t load_u32_unaligned(const uint8_t* p) {
  return p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

template <>
struct Dq<GgmlType::Q5_0> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ5_0*>(row)[c];
    const float d = f16(b.d);
    const uint32_t qh = load_u32_unaligned(b.qh);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      // qh is unsigned: the code goes through int before the bias, or it would wrap.
      y[j] = (static_cast<int>((b.qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16) * d;
      y[j + 16] = (static_cast<int>((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16) * d;
    }
  }
};

template <>
struct Dq<GgmlType::Q5_1> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ5_1*>(row)[c];
    const float d = f16(b.d), m = f16(b.m);
    const uint32_t qh = load_u32_unaligned(b.qh);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      y[j] = ((b.qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) * d + m;
      y[j + 16] = ((b.qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) * d + m;
    }
  }
};

// Q2_0: 64-value blocks, value j in bits 2(j%4) of byte j/4; chunk c is half of block c/2.
template <>
struct Dq<GgmlType::Q2_0> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ2_0*>(row)[c / 2];
    const float d = f16(b.d);
    const uint8_t* q = b.qs + (c % 2) * 8;
#pragma unroll
    for (int j = 0; j < 32; ++j) y[j] = (((q[j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
  }
};

template <>
struct Dq<GgmlType::IQ4_NL> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockIq4Nl*>(row)[c];
    const float d = f16(b.d);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      y[j] = d * kIq4Nl[b.qs[j] & 0xf];
      y[j + 16] = d * kIq4Nl[b.qs[j] >> 4];
    }
  }
};

template <>
struct Dq<GgmlType::IQ4_XS> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockIq4Xs*>(row)[c / 8];
    const int ib = static_cast<int>(c % 8);
    const int ls = ((b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b.scales_h >> 2 * ib) & 3) << 4);
    const float dl = f16(b.d) * (ls - 32);
    const uint8_t* qs = b.qs + ib * 16;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * kIq4Nl[qs[j] & 0xf];
      y[j + 16] = dl * kIq4Nl[qs[j] >> 4];
    }
  }
};

// Q4_K/Q5_K sub-block j's 6-bit scale and min (quant/formats.h k4_scale_min), from the block's
// 12 scale bytes as s(i).
template <typename ScaleByte>
__device__ __forceinline__ void k4_scale_min(int j, ScaleByte s, int& scale, int& min) {
  if (j < 4) {
    scale = s(j) & 63;
    min = s(j + 4) & 63;
  } else {
    scale = (s(j + 4) & 0xF) | ((s(j - 4) >> 6) << 4);
    min = (s(j + 4) >> 4) | ((s(j) >> 6) << 4);
  }
}

// The 6-bit scales and mins of sub-blocks 2g and 2g + 1 (g = 0..3) of a Q4_K block, from its
// 16-byte header h (d and dmin in h.x, the 12 scale bytes s0..s11 in h.y .. h.w): k4_scale_min
// for both sub-blocks at once and without branches (the decode unit loader, cuda_gemv.cuh), two
// bytes in the low 16 bits of `scales` and `mins`. Sub-blocks 0..3 keep 6 bits in s_j (scale) and s_{j+4} (min); 4..7
// take their low 4 bits from the nibbles of s_{j+4} and their top 2 bits from the top bits of
// s_{j-4} (scale) and s_j (min). Both pairs sit at byte 2(g mod 2) of their words.
__device__ __forceinline__ void k4_scale_min_pair(const uint4& h, int g, uint32_t& scales, uint32_t& mins) {
  const int shift = 16 * (g & 1);
  const uint32_t a = h.y >> shift, b = h.z >> shift, c = h.w >> shift;
  const bool first_half = g < 2;
  scales = first_half ? a & 0x3F3Fu : (c & 0x0F0Fu) | ((a >> 2) & 0x3030u);
  mins = first_half ? b & 0x3F3Fu : ((c >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
}

template <>
struct Dq<GgmlType::Q4_K> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ4_K*>(row)[c / 8];
    const int j = static_cast<int>(c % 8);
    int sc, m;
    k4_scale_min(j, [&](int i) { return static_cast<int>(b.scales[i]); }, sc, m);
    const float d1 = f16(b.d) * sc, m1 = f16(b.dmin) * m;
    const uint8_t* q = b.qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) y[l] = d1 * ((q[l] >> shift) & 0xF) - m1;
  }
};

template <>
struct Dq<GgmlType::Q5_K> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ5_K*>(row)[c / 8];
    const int j = static_cast<int>(c % 8);
    int sc, m;
    k4_scale_min(j, [&](int i) { return static_cast<int>(b.scales[i]); }, sc, m);
    const float d1 = f16(b.d) * sc, m1 = f16(b.dmin) * m;
    const uint8_t* q = b.qs + (j / 2) * 32;
    const int shift = (j % 2) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) y[l] = d1 * (((q[l] >> shift) & 0xF) + (((b.qh[l] >> j) & 1) << 4)) - m1;
  }
};

template <>
struct Dq<GgmlType::Q6_K> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ6_K*>(row)[c / 8];
    const int half = static_cast<int>(c % 8) / 4, r = static_cast<int>(c % 4);
    const uint8_t* ql = b.ql + half * 64 + (r % 2) * 32;
    const uint8_t* qh = b.qh + half * 32;
    const int8_t* sc = b.scales + half * 8 + 2 * r;
    const int lo_shift = (r / 2) * 4, hi_shift = 2 * r;
    const float d = f16(b.d);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = (((ql[l] >> lo_shift) & 0xF) | (((qh[l] >> hi_shift) & 3) << 4)) - 32;
      y[l] = d * sc[l / 16] * q;
    }
  }
};

// Q2_K: chunk c of a 256-block: half c/4 (32 code bytes), shift 2(c%4), scales 2 per chunk.
template <>
struct Dq<GgmlType::Q2_K> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ2_K*>(row)[c / 8];
    const int half = static_cast<int>(c % 8) / 4, s = static_cast<int>(c % 4);
    const uint8_t* q = b.qs + half * 32;
    const float d = f16(b.d), min = f16(b.dmin);
#pragma unroll
    for (int part = 0; part < 2; ++part) {
      const uint8_t sc = b.scales[half * 8 + s * 2 + part];
      const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
#pragma unroll
      for (int l = 0; l < 16; ++l) y[16 * part + l] = dl * ((q[l + 16 * part] >> (2 * s)) & 3) - ml;
    }
  }
};

template <>
struct Dq<GgmlType::Q3_K> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    const auto& b = reinterpret_cast<const quant::BlockQ3_K*>(row)[c / 8];
    const int half = static_cast<int>(c % 8) / 4, s = static_cast<int>(c % 4);
    const uint8_t* q = b.qs + half * 32;
    const uint8_t m = static_cast<uint8_t>(1u << (half * 4 + s));
    const float d_all = f16(b.d);
#pragma unroll
    for (int part = 0; part < 2; ++part) {
      const int j = half * 8 + s * 2 + part;  // scale code j (quant::q3k_scale_codes)
      const int low = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
      const int high = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      const float dl = d_all * ((low | (high << 4)) - 32);
#pragma unroll
      for (int l = 0; l < 16; ++l) {
        const int k = l + 16 * part;
        y[k] = dl * (((q[k] >> (2 * s)) & 3) - ((b.hmask[k] & m) ? 0 : 4));
      }
    }
  }
};

// ---- MXFP4 and the grid I-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) ---------------------
// Each decoder's body is a __host__ __device__ function taking its grid as a pointer, so that the
// host can check it against quant::dequantize_row (cuda_quant_selfcheck.cu); Dq<> passes the
// device copy. Same float expressions as the CPU code, which has no add after a multiply to fuse.

// #pragma unroll for the device pass only (host compilers warn about it).
#ifdef __CUDA_ARCH__
#define REGOLITH_DQ_UNROLL _Pragma("unroll")
#else
#define REGOLITH_DQ_UNROLL
#endif

// E2M1 values (quant::kFp4Values) packed at compile time into two words: 8 bytes each, read with a
// shift instead of an indexed table.
constexpr uint64_t pack_fp4_values(int first) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(quant::kFp4Values[first + i])) << (8 * i);
  return v;
}
constexpr uint64_t kFp4Low = pack_fp4_values(0), kFp4High = pack_fp4_values(8);

__host__ __device__ __forceinline__ float f16_hd(uint16_t h) { return __half2float(__ushort_as_half(h)); }

__host__ __device__ __forceinline__ float bits_as_float(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  return std::bit_cast<float>(bits);
#endif
}

// quant::signs_from_seven: the eighth sign bit makes the number of set bits even.
__host__ __device__ __forceinline__ uint32_t iq_signs_from_seven(uint32_t seven) {
  seven &= 127;
  uint32_t p = seven ^ (seven >> 4);
  p ^= p >> 2;
  p ^= p >> 1;
  return seven | ((p & 1u) << 7);
}

__host__ __device__ __forceinline__ float iq_signed(float v, uint32_t negative) { return negative ? -v : v; }

__host__ __device__ inline void mxfp4_chunk(const uint8_t* row, int64_t c, float* y) {
  const auto& b = reinterpret_cast<const quant::BlockMxfp4*>(row)[c];
  const uint32_t e = b.e;  // quant::e8m0_to_f32_half
  const float d = bits_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
REGOLITH_DQ_UNROLL
  for (int j = 0; j < 16; ++j) {
    const int lo = b.qs[j] & 0x0F, hi = b.qs[j] >> 4;
    y[j] = static_cast<int8_t>((lo < 8 ? kFp4Low : kFp4High) >> (8 * (lo % 8))) * d;
    y[j + 16] = static_cast<int8_t>((hi < 8 ? kFp4Low : kFp4High) >> (8 * (hi % 8))) * d;
  }
}

// Chunk c of a 256-value I-quant block is its 32-value block ib = c % 8.
__host__ __device__ inline void iq2_xxs_chunk(const uint8_t* row, int64_t c, const uint64_t* grid, float* y) {
  const auto& b = reinterpret_cast<const quant::BlockIq2Xxs*>(row)[c / 8];
  const uint16_t* q = b.qs + 4 * (c % 8);  // two little-endian words, 2-byte aligned
  const uint32_t aux0 = q[0] | (static_cast<uint32_t>(q[1]) << 16);
  const uint32_t aux1 = q[2] | (static_cast<uint32_t>(q[3]) << 16);
  const float db = f16_hd(b.d) * (0.5f + (aux1 >> 28)) * 0.25f;
REGOLITH_DQ_UNROLL
  for (int l = 0; l < 4; ++l) {
    const uint64_t g = grid[(aux0 >> (8 * l)) & 255];
    const uint32_t signs = iq_signs_from_seven(aux1 >> (7 * l));
REGOLITH_DQ_UNROLL
    for (int j = 0; j < 8; ++j) y[8 * l + j] = iq_signed(db * static_cast<uint8_t>(g >> (8 * j)), signs & (1u << j));
  }
}

__host__ __device__ inline void iq2_xs_chunk(const uint8_t* row, int64_t c, const uint64_t* grid, float* y) {
  const auto& b = reinterpret_cast<const quant::BlockIq2Xs*>(row)[c / 8];
  const int ib = static_cast<int>(c % 8);
  const float d = f16_hd(b.d);
  const float db[2] = {d * (0.5f + (b.scales[ib] & 0xf)) * 0.25f, d * (0.5f + (b.scales[ib] >> 4)) * 0.25f};
REGOLITH_DQ_UNROLL
  for (int l = 0; l < 4; ++l) {
    const uint16_t q = b.qs[4 * ib + l];
    const uint64_t g = grid[q & 511];
    const uint32_t signs = iq_signs_from_seven(q >> 9);
REGOLITH_DQ_UNROLL
    for (int j = 0; j < 8; ++j)
      y[8 * l + j] = iq_signed(db[l / 2] * static_cast<uint8_t>(g >> (8 * j)), signs & (1u << j));
  }
}

__host__ __device__ inline void iq2_s_chunk(const uint8_t* row, int64_t c, const uint64_t* grid, float* y) {
  const auto& b = reinterpret_cast<const quant::BlockIq2S*>(row)[c / 8];
  const int ib = static_cast<int>(c % 8);
  const uint8_t* qs = b.qs + 4 * ib;
  const uint8_t* signs = b.qs + quant::kSuperBlock / 8 + 4 * ib;
  const float d = f16_hd(b.d);
  const float db[2] = {d * (0.5f + (b.scales[ib] & 0xf)) * 0.25f, d * (0.5f + (b.scales[ib] >> 4)) * 0.25f};
REGOLITH_DQ_UNROLL
  for (int l = 0; l < 4; ++l) {
    const uint64_t g = grid[qs[l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300)];
REGOLITH_DQ_UNROLL
    for (int j = 0; j < 8; ++j)
      y[8 * l + j] = iq_signed(db[l / 2] * static_cast<uint8_t>(g >> (8 * j)), signs[l] & (1u << j));
  }
}

__host__ __device__ inline void iq3_xxs_chunk(const uint8_t* row, int64_t c, const uint32_t* grid, float* y) {
  const auto& b = reinterpret_cast<const quant::BlockIq3Xxs*>(row)[c / 8];
  const int ib = static_cast<int>(c % 8);
  const uint8_t* qs = b.qs + 8 * ib;
  const uint8_t* a = b.qs + quant::kSuperBlock / 4 + 4 * ib;  // little-endian word, 2-byte aligned
  const uint32_t aux = a[0] | (a[1] << 8) | (a[2] << 16) | (static_cast<uint32_t>(a[3]) << 24);
  const float db = f16_hd(b.d) * (0.5f + (aux >> 28)) * 0.5f;
REGOLITH_DQ_UNROLL
  for (int l = 0; l < 4; ++l) {
    const uint32_t signs = iq_signs_from_seven(aux >> (7 * l));
    const uint32_t g1 = grid[qs[2 * l]], g2 = grid[qs[2 * l + 1]];
REGOLITH_DQ_UNROLL
    for (int j = 0; j < 4; ++j) {
      y[8 * l + j] = iq_signed(db * static_cast<uint8_t>(g1 >> (8 * j)), signs & (1u << j));
      y[8 * l + j + 4] = iq_signed(db * static_cast<uint8_t>(g2 >> (8 * j)), signs & (1u << (j + 4)));
    }
  }
}

__host__ __device__ inline void iq3_s_chunk(const uint8_t* row, int64_t c, const uint32_t* grid, float* y) {
  const auto& b = reinterpret_cast<const quant::BlockIq3S*>(row)[c / 8];
  const int ib = static_cast<int>(c % 8);
  const uint8_t* qs = b.qs + 8 * ib;
  const uint8_t* signs = b.signs + 4 * ib;
  const float db = f16_hd(b.d) * (1 + 2 * ((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
  const int qh = b.qh[ib];
REGOLITH_DQ_UNROLL
  for (int l = 0; l < 4; ++l) {
    const uint32_t g1 = grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
    const uint32_t g2 = grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
REGOLITH_DQ_UNROLL
    for (int j = 0; j < 4; ++j) {
      y[8 * l + j] = iq_signed(db * static_cast<uint8_t>(g1 >> (8 * j)), signs[l] & (1u << j));
      y[8 * l + j + 4] = iq_signed(db * static_cast<uint8_t>(g2 >> (8 * j)), signs[l] & (1u << (j + 4)));
    }
  }
}

// The I-quant grids on the device (data: quant/iq_grids.cpp, copied at run time). Without
// relocatable device code each .cu file is its own device module, so every file including this
// header gets its own copy (internal linkage); a static initializer registers that file's upload,
// and the CudaBackend constructor runs them all on its device (upload_iq_grids).
struct IqGrids {
  uint64_t iq2_xxs[256];
  uint64_t iq2_xs[512];
  uint64_t iq2_s[1024];
  uint32_t iq3_xxs[256];
  uint32_t iq3_s[512];
};
static __device__ IqGrids g_iq_grids;

inline const IqGrids& host_iq_grids() {
  static const IqGrids grids = [] {
    IqGrids g;
    std::memcpy(g.iq2_xxs, quant::kIq2XxsGrid, sizeof g.iq2_xxs);
    std::memcpy(g.iq2_xs, quant::kIq2XsGrid, sizeof g.iq2_xs);
    std::memcpy(g.iq2_s, quant::kIq2SGrid, sizeof g.iq2_s);
    std::memcpy(g.iq3_xxs, quant::kIq3XxsGrid, sizeof g.iq3_xxs);
    std::memcpy(g.iq3_s, quant::kIq3SGrid, sizeof g.iq3_s);
    return g;
  }();
  return grids;
}

inline std::vector<cudaError_t (*)()>& iq_grid_uploads() {
  static std::vector<cudaError_t (*)()> uploads;
  return uploads;
}

namespace {
cudaError_t upload_iq_grids_of_this_file() {
  return cudaMemcpyToSymbol(g_iq_grids, &host_iq_grids(), sizeof(IqGrids));
}
[[maybe_unused]] const bool g_iq_grids_registered = (iq_grid_uploads().push_back(upload_iq_grids_of_this_file), true);
}  // namespace

// Copies the grids to the current device for every .cu file and waits for the copies (pageable
// sources may still be in flight when cudaMemcpyToSymbol returns); returns the first error.
inline cudaError_t upload_iq_grids() {
  for (auto upload : iq_grid_uploads())
    if (cudaError_t e = upload(); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

template <>
struct Dq<GgmlType::MXFP4> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) { mxfp4_chunk(row, c, y); }
};

template <>
struct Dq<GgmlType::IQ2_XXS> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    iq2_xxs_chunk(row, c, g_iq_grids.iq2_xxs, y);
  }
};

template <>
struct Dq<GgmlType::IQ2_XS> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    iq2_xs_chunk(row, c, g_iq_grids.iq2_xs, y);
  }
};

template <>
struct Dq<GgmlType::IQ2_S> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    iq2_s_chunk(row, c, g_iq_grids.iq2_s, y);
  }
};

template <>
struct Dq<GgmlType::IQ3_XXS> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    iq3_xxs_chunk(row, c, g_iq_grids.iq3_xxs, y);
  }
};

template <>
struct Dq<GgmlType::IQ3_S> {
  __device__ static void chunk(const uint8_t* row, int64_t c, int64_t, float* y) {
    iq3_s_chunk(row, c, g_iq_grids.iq3_s, y);
  }
};

// Calls fn(Dq<type>{}) for a type with a device decoder; returns false for any other type.
template <typename Fn>
bool dispatch_weight_type(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::F32: fn(Dq<GgmlType::F32>{}); return true;
    case GgmlType::F16: fn(Dq<GgmlType::F16>{}); return true;
    case GgmlType::BF16: fn(Dq<GgmlType::BF16>{}); return true;
    case GgmlType::Q8_0: fn(Dq<GgmlType::Q8_0>{}); return true;
    case GgmlType::Q4_0: fn(Dq<GgmlType::Q4_0>{}); return true;
    case GgmlType::Q4_1: fn(Dq<GgmlType::Q4_1>{}); return true;
    case GgmlType::Q5_0: fn(Dq<GgmlType::Q5_0>{}); return true;
    case GgmlType::Q5_1: fn(Dq<GgmlType::Q5_1>{}); return true;
    case GgmlType::Q2_0: fn(Dq<GgmlType::Q2_0>{}); return true;
    case GgmlType::IQ4_NL: fn(Dq<GgmlType::IQ4_NL>{}); return true;
    case GgmlType::IQ4_XS: fn(Dq<GgmlType::IQ4_XS>{}); return true;
    case GgmlType::Q2_K: fn(Dq<GgmlType::Q2_K>{}); return true;
    case GgmlType::Q3_K: fn(Dq<GgmlType::Q3_K>{}); return true;
    case GgmlType::Q4_K: fn(Dq<GgmlType::Q4_K>{}); return true;
    case GgmlType::Q5_K: fn(Dq<GgmlType::Q5_K>{}); return true;
    case GgmlType::Q6_K: fn(Dq<GgmlType::Q6_K>{}); return true;
    case GgmlType::MXFP4: fn(Dq<GgmlType::MXFP4>{}); return true;
    case GgmlType::IQ2_XXS: fn(Dq<GgmlType::IQ2_XXS>{}); return true;
    case GgmlType::IQ2_XS: fn(Dq<GgmlType::IQ2_XS>{}); return true;
    case GgmlType::IQ2_S: fn(Dq<GgmlType::IQ2_S>{}); return true;
    case GgmlType::IQ3_XXS: fn(Dq<GgmlType::IQ3_XXS>{}); return true;
    case GgmlType::IQ3_S: fn(Dq<GgmlType::IQ3_S>{}); return true;
    default: return false;
  }
}

inline bool has_device_decoder(GgmlType type) {
  return dispatch_weight_type(type, [](auto) {});
}

}  // namespace regolith::cuda
