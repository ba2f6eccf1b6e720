// The integer tensor-core tile of prefill products with quantized weights, as llama.cpp's MMQ and
// the CPU backend's decode products compute them: activations are first quantized to the format
// quant pairs with the weight type (Q8_0 for 32-value blocks, Q8_K for 256-value blocks, rounded
// exactly as quant's codecs round them), and each 32-value chunk of a weight row becomes 32 int8
// codes with w = scale·code − offset. One m16n8k32 s8 mma.sync sums a chunk's code products
// exactly; the chunk then adds scale·d·Σq_w·q_x − offset·d·Σq_x to an FP32 accumulator (for
// 256-value blocks, whose scale is a block scale times an integer sub-scale, a stage's chunks first
// sum sub_scale·Σq_w·q_x in integers). The result is the float64 product of the dequantized
// weights with the rounded activations, up to FP32 accumulation (tests/ops/cuda_vs_ref_test.cpp).
//
// Tile: 64 weight rows × 64 token columns per block of 4 warps (each 32 × 32), stages of 4 chunks
// (128 values of K) in two shared-memory buffers: while the tensor cores run over one stage, the
// next stage's activation codes arrive by cp.async and its weight bytes are in registers, decoded
// into codes and stored after the stage's products.
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace regolith::cuda {

// Activations as the int8 tile reads them: codes [rows][K], and per 32-value chunk of a row its
// scale d and d·Σ codes (for weights with an offset).
struct QuantizedX {
  const int8_t* codes = nullptr;
  const float2* chunk_scales = nullptr;  // [rows][K / 32]
};

// Where a kernel writes the activations it quantizes (QuantizedX's layout).
struct QuantizeTarget {
  int8_t* codes = nullptr;
  float2* scales = nullptr;
};

// Activations quantized for the int8 tile, in scratch buffers of the backend.
struct QuantizedActivations {
  Tensor codes, scales;
  QuantizedX view() const {
    return {reinterpret_cast<const int8_t*>(codes.f32()), reinterpret_cast<const float2*>(scales.f32())};
  }
  QuantizeTarget target() {
    return codes.empty() ? QuantizeTarget{}
                         : QuantizeTarget{reinterpret_cast<int8_t*>(codes.f32()), reinterpret_cast<float2*>(scales.f32())};
  }
};

class CudaBackend;
// x [rows][K] quantized as Q8_K (block256) or Q8_0, on the backend's stream (cuda_matmul.cu).
QuantizedActivations quantize_activations(CudaBackend& be, bool block256, const float* x, int64_t rows, int64_t K);

// Q8_0 activations: chunk c of x by one warp (a value a lane, v), rounded as quant::quantize_q8_0
// rounds them: d = amax/127, codes round(x·(1/d)), d kept as fp16 (the value the codes multiply).
// Without kSum the scale's second half (d·Σ codes, which only offset formats read) is left 0.
template <bool kSum = true>
__device__ __forceinline__ void quantize_q8_0_value(float v, int64_t c, int8_t* __restrict__ codes, float2* __restrict__ scales) {
  const int lane = threadIdx.x % 32;
  const float d = warp_max(fabsf(v)) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  const int q = static_cast<int>(roundf(v * id));
  codes[c * 32 + lane] = static_cast<int8_t>(q);
  const int sum = kSum ? warp_sum(q) : 0;
  const float d16 = __half2float(__float2half_rn(d));
  if (lane == 0) scales[c] = make_float2(d16, d16 * static_cast<float>(sum));
}
// Q8_0 codes of 4 consecutive values a lane, 8 lanes (aligned) a 32-value chunk c, rounded as
// quantize_q8_0_value rounds them: three shuffles a reduction instead of five for a value a lane.
// The shuffles name only the chunk's 8 lanes, so a warp may hold fewer than four chunks.
__device__ __forceinline__ void quantize_q8_0_quad(const float (&v)[4], int64_t c, int8_t* __restrict__ codes,
                                                   float2* __restrict__ scales) {
  const int lane = threadIdx.x % 32;
  const unsigned chunk_lanes = 0xFFu << (lane & 24);
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(chunk_lanes, amax, o));
  const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  uint32_t packed = 0;
  int sum = 0;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int q = static_cast<int>(roundf(v[e] * id));
    sum += q;
    packed |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * e);
  }
  reinterpret_cast<uint32_t*>(codes + c * 32)[lane % 8] = packed;
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) sum += __shfl_xor_sync(chunk_lanes, sum, o);
  const float d16 = __half2float(__float2half_rn(d));
  if (lane % 8 == 0) scales[c] = make_float2(d16, d16 * static_cast<float>(sum));
}

__device__ __forceinline__ void quantize_q8_0_chunk(const float* __restrict__ x, int64_t c, int8_t* __restrict__ codes,
                                                    float2* __restrict__ scales) {
  quantize_q8_0_value(x[c * 32 + threadIdx.x % 32], c, codes, scales);
}

// Q8_K activations: 256-value block b of x by one warp (8 values a lane), rounded as
// quant::quantize_q8_k rounds them: the value of largest magnitude (the first of equals) maps to
// −127, codes nearest-even of x·(−127/max), d = 1/(−127/max).
__device__ __forceinline__ void quantize_q8_k_block(const float* __restrict__ x, int64_t b, int8_t* __restrict__ codes,
                                                    float2* __restrict__ scales) {
  const int lane = threadIdx.x % 32;
  const float4* src = reinterpret_cast<const float4*>(x + b * 256 + lane * 8);
  const float4 v0 = src[0], v1 = src[1];
  const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
  float amax = 0.0f, max = 0.0f;
  int at = 256;  // index of max in the block
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (fabsf(v[i]) > amax) amax = fabsf(v[i]), max = v[i], at = lane * 8 + i;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float a2 = __shfl_xor_sync(0xffffffffu, amax, o), m2 = __shfl_xor_sync(0xffffffffu, max, o);
    const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
    if (a2 > amax || (a2 == amax && at2 < at)) amax = a2, max = m2, at = at2;
  }
  const float iscale = amax != 0.0f ? -127.0f / max : 0.0f;
  uint32_t packed[2] = {0, 0};
  int sum = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int q = min(127, __float2int_rn(iscale * v[i]));
    sum += q;
    packed[i / 4] |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * (i % 4));
  }
  *reinterpret_cast<uint2*>(codes + b * 256 + lane * 8) = make_uint2(packed[0], packed[1]);
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);  // the chunk's four lanes
  const float d = amax != 0.0f ? 1.0f / iscale : 0.0f;
  if (lane % 4 == 0) scales[b * 8 + lane / 4] = make_float2(d, d * static_cast<float>(sum));
}

// A weight type's 32-value chunk as int8 codes (Raw: the bytes loaded ahead, unpack: codes in k
// order, 4 a word, and w = scale·code − offset). kBlock256: its activations are Q8_K, else Q8_0,
// and its scale is an integer sub-scale of the chunk times a scale of the 256-value block
// (w = block_scale·sub_scale·code − offset), so that the tile sums sub_scale·(code products) in
// integers over the chunks of a block, where the activations' scale is one too. kJobChunks: the
// consecutive chunks (from an even one when 2) one load's Raw holds, each unpacked by its index.
template <GgmlType kType>
struct I8;

namespace i8_detail {

// 32 bytes at p as eight words; p is 16-byte aligned (device rows start at multiples of 16 bytes,
// and Q8_0 codes, Q4_K/Q5_K quants and Q5_K high bits sit at multiples of 16 within them).
__device__ __forceinline__ void load_32_bytes(const uint8_t* p, uint32_t (&w)[8]) {
  const uint4 u0 = __ldg(reinterpret_cast<const uint4*>(p)), u1 = __ldg(reinterpret_cast<const uint4*>(p) + 1);
  w[0] = u0.x, w[1] = u0.y, w[2] = u0.z, w[3] = u0.w, w[4] = u1.x, w[5] = u1.y, w[6] = u1.z, w[7] = u1.w;
}

// 16 bytes at p (2-byte aligned) as four words.
__device__ __forceinline__ void load_16_bytes(const uint8_t* p, uint32_t (&w)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p) + 2 * i;
    w[i] = __ldg(h) | (static_cast<uint32_t>(__ldg(h + 1)) << 16);
  }
}

// Sixteen nibble-packed bytes (value j in the low nibble of byte j, value j + 16 in the high one,
// ggml's layout for 32-value sub-blocks) as 32 byte codes in k order.
__device__ __forceinline__ void unpack_nibbles(const uint32_t (&q)[4], uint32_t (&w)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    w[i] = q[i] & 0x0F0F0F0Fu;
    w[i + 4] = (q[i] >> 4) & 0x0F0F0F0Fu;
  }
}

// Four 4-bit indices (one a byte) through the IQ4_NL grid, as four signed bytes: byte_perm picks
// each from the grid's first and last eight values, and the index's bit 3 chooses between them.
__device__ __forceinline__ uint32_t iq4nl_codes(uint32_t idx) {
  const uint32_t* grid = reinterpret_cast<const uint32_t*>(kIq4Nl);
  uint32_t sel = idx & 0x07070707u;
  sel |= sel >> 4;                                // index i's low bits at bits 8(i/2) + 4(i%2)
  sel = (sel & 0xFFu) | ((sel >> 8) & 0xFF00u);  // ... and at bits 4i: byte_perm's selector
  const uint32_t lo = __byte_perm(grid[0], grid[1], sel), hi = __byte_perm(grid[2], grid[3], sel);
  const uint32_t upper = ((idx >> 3) & 0x01010101u) * 0xFFu;  // 0xFF in the bytes with bit 3 set
  return (hi & upper) | (lo & ~upper);
}

__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) { return __ldg(reinterpret_cast<const uint32_t*>(p)); }
__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }

}  // namespace i8_detail

// Q8_0 rows on the device: K codes, then K/32 fp16 scales (cuda_quant.cuh).
template <>
struct I8<GgmlType::Q8_0> {
  static constexpr bool kBlock256 = false, kOffset = false;
  static constexpr int kJobChunks = 1;
  struct Raw {
    uint32_t q[8];
    uint16_t d;
  };
  __device__ static Raw load(const uint8_t* row, int64_t c, int64_t K) {
    Raw r;
    i8_detail::load_32_bytes(row + c * 32, r.q);
    r.d = i8_detail::load_u16(row + K + 2 * c);
    return r;
  }
  __device__ static void unpack(const Raw& r, int64_t, uint32_t (&w)[8], float& scale, float& offset) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = r.q[i];
    scale = f16(r.d), offset = 0.0f;
  }
};

template <>
struct I8<GgmlType::Q4_0> {
  static constexpr bool kBlock256 = false, kOffset = false;
  static constexpr int kJobChunks = 1;
  struct Raw {
    uint32_t q[4];
    uint16_t d;
  };
  __device__ static Raw load(const uint8_t* row, int64_t c, int64_t) {
    const uint8_t* b = row + c * sizeof(quant::BlockQ4_0);
    Raw r;
    r.d = i8_detail::load_u16(b);
    i8_detail::load_16_bytes(b + 2, r.q);
    return r;
  }
  __device__ static void unpack(const Raw& r, int64_t, uint32_t (&w)[8], float& scale, float& offset) {
    i8_detail::unpack_nibbles(r.q, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = __vsub4(w[i], 0x08080808u);  // q − 8, per byte
    scale = f16(r.d), offset = 0.0f;
  }
};

template <>
struct I8<GgmlType::Q4_1> {
  static constexpr bool kBlock256 = false, kOffset = true;
  static constexpr int kJobChunks = 1;
  struct Raw {
    uint32_t q[4];
    uint32_t dm;
  };
  __device__ static Raw load(const uint8_t* row, int64_t c, int64_t) {
    const uint8_t* b = row + c * sizeof(quant::BlockQ4_1);
    Raw r;
    r.dm = i8_detail::load_u32(b);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = i8_detail::load_u32(b + 4 + 4 * i);
    return r;
  }
  __device__ static void unpack(const Raw& r, int64_t, uint32_t (&w)[8], float& scale, float& offset) {
    i8_detail::unpack_nibbles(r.q, w);
    scale = f16(static_cast<uint16_t>(r.dm)), offset = -f16(static_cast<uint16_t>(r.dm >> 16));  // w = d·q + m
  }
};

template <>
struct I8<GgmlType::IQ4_NL> {
  static constexpr bool kBlock256 = false, kOffset = false;
  static constexpr int kJobChunks = 1;
  using Raw = I8<GgmlType::Q4_0>::Raw;
  __device__ static Raw load(const uint8_t* row, int64_t c, int64_t K) { return I8<GgmlType::Q4_0>::load(row, c, K); }
  __device__ static void unpack(const Raw& r, int64_t, uint32_t (&w)[8], float& scale, float& offset) {
    i8_detail::unpack_nibbles(r.q, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = i8_detail::iq4nl_codes(w[i]);
    scale = f16(r.d), offset = 0.0f;
  }
};

template <>
struct I8<GgmlType::IQ4_XS> {
  static constexpr bool kBlock256 = true, kOffset = false;
  static constexpr int kJobChunks = 1;
  struct Raw {
    uint32_t q[4];
    uint32_t d_scales_h, scales_l;
  };
  __device__ static Raw load(const uint8_t* row, int64_t c, int64_t) {
    const uint8_t* b = row + (c / 8) * sizeof(quant::BlockIq4Xs);
    Raw r;
    r.d_scales_h = i8_detail::load_u32(b);
    r.scales_l = i8_detail::load_u32(b + 4);
    const uint2 q0 = __ldg(reinterpret_cast<const uint2*>(b + 8 + 16 * (c % 8))), q1 = __ldg(reinterpret_cast<const uint2*>(b + 16 + 16 * (c % 8)));
    r.q[0] = q0.x, r.q[1] = q0.y, r.q[2] = q1.x, r.q[3] = q1.y;
    return r;
  }
  __device__ static void unpack(const Raw& r, int64_t c, uint32_t (&w)[8], int& sub_scale, float& block_scale,
                                float& offset) {
    const int ib = static_cast<int>(c % 8);
    i8_detail::unpack_nibbles(r.q, w);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = i8_detail::iq4nl_codes(w[i]);
    const int ls = ((r.scales_l >> (8 * (ib / 2) + 4 * (ib % 2))) & 0xF) | (((r.d_scales_h >> (16 + 2 * ib)) & 3) << 4);
    sub_scale = ls - 32, block_scale = f16(static_cast<uint16_t>(r.d_scales_h)), offset = 0.0f;
  }
};

// Q4_K and Q5_K: sub-block j = c % 8 of a 256-value block, w = d·sc_j·q − dmin·m_j. Sub-blocks 2i
// and 2i + 1 share their quant bytes (low and high nibbles) and the block's header, so one load
// serves both chunks of such a pair (kJobChunks).
template <>
struct I8<GgmlType::Q4_K> {
  static constexpr bool kBlock256 = true, kOffset = true;
  static constexpr int kJobChunks = 2;
  struct Raw {
    uint32_t q[8];
    uint4 header;  // d and dmin, then the 12 scale bytes
  };
  __device__ static Raw load(const uint8_t* row, int64_t c, int64_t) {
    const uint8_t* b = row + (c / 8) * sizeof(quant::BlockQ4_K);
    Raw r;
    r.header = __ldg(reinterpret_cast<const uint4*>(b));  // blocks are 144 bytes: 16-byte aligned
    i8_detail::load_32_bytes(b + 16 + (c % 8) / 2 * 32, r.q);
    return r;
  }
  __device__ static void scale_offset(const uint4& header, int j, int& sub_scale, float& block_scale, float& offset) {
    uint32_t scales, mins;
    k4_scale_min_pair(header, j / 2, scales, mins);
    const int shift = 8 * (j % 2);
    sub_scale = static_cast<int>((scales >> shift) & 0xFF);
    block_scale = f16(static_cast<uint16_t>(header.x));
    offset = f16(static_cast<uint16_t>(header.x >> 16)) * static_cast<float>((mins >> shift) & 0xFF);
  }
  __device__ static void unpack(const Raw& r, int64_t c, uint32_t (&w)[8], int& sub_scale, float& block_scale,
                                float& offset) {
    const int j = static_cast<int>(c % 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = (r.q[i] >> (4 * (j % 2))) & 0x0F0F0F0Fu;
    scale_offset(r.header, j, sub_scale, block_scale, offset);
  }
};

template <>
struct I8<GgmlType::Q5_K> {
  static constexpr bool kBlock256 = true, kOffset = true;
  static constexpr int kJobChunks = 2;
  struct Raw {
    I8<GgmlType::Q4_K>::Raw low;
    uint32_t qh[8];
  };
  __device__ static Raw load(const uint8_t* row, int64_t c, int64_t) {
    const uint8_t* b = row + (c / 8) * sizeof(quant::BlockQ5_K);
    Raw r;
    r.low.header = __ldg(reinterpret_cast<const uint4*>(b));  // blocks are 176 bytes: 16-byte aligned
    i8_detail::load_32_bytes(b + 16, r.qh);
    i8_detail::load_32_bytes(b + 48 + (c % 8) / 2 * 32, r.low.q);
    return r;
  }
  __device__ static void unpack(const Raw& r, int64_t c, uint32_t (&w)[8], int& sub_scale, float& block_scale,
                                float& offset) {
    const int j = static_cast<int>(c % 8);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      w[i] = ((r.low.q[i] >> (4 * (j % 2))) & 0x0F0F0F0Fu) | (((r.qh[i] >> j) & 0x01010101u) << 4);
    I8<GgmlType::Q4_K>::scale_offset(r.low.header, j, sub_scale, block_scale, offset);
  }
};

// Calls fn(I8<type>{}) for a type the int8 tile reads; returns false for any other type.
template <typename Fn>
bool dispatch_int8_type(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::Q8_0: fn(I8<GgmlType::Q8_0>{}); return true;
    case GgmlType::Q4_0: fn(I8<GgmlType::Q4_0>{}); return true;
    case GgmlType::Q4_1: fn(I8<GgmlType::Q4_1>{}); return true;
    case GgmlType::IQ4_NL: fn(I8<GgmlType::IQ4_NL>{}); return true;
    case GgmlType::IQ4_XS: fn(I8<GgmlType::IQ4_XS>{}); return true;
    case GgmlType::Q4_K: fn(I8<GgmlType::Q4_K>{}); return true;
    case GgmlType::Q5_K: fn(I8<GgmlType::Q5_K>{}); return true;
    default: return false;
  }
}

inline bool has_int8_decoder(GgmlType type) {
  return dispatch_int8_type(type, [](auto) {});
}

// Whether the int8 tile takes Q8_K activations for this type (else Q8_0).
inline bool int8_block256(GgmlType type) {
  bool block256 = false;
  dispatch_int8_type(type, [&](auto i8) { block256 = decltype(i8)::kBlock256; });
  return block256;
}

constexpr int kGemmInt8BlocksPerSm = 4;  // registers capped at 128, shared memory 4 × 49.7 KB

namespace i8_detail {

constexpr int kStageChunks = 4;  // 32-value chunks of K per stage
// A row (weights) or column (tokens) of a stage: 4 chunks of 8 code words and 8 words of padding,
// so that the 8-byte fragment loads of a half warp (rows g .. g+3, words 2t, 2t+1 of a chunk) fall
// on 32 different banks. Lane t reads words 2t and 2t+1 of a chunk as the mma fragment's k-words t
// and t + 4, the same for weights and tokens, so the products are those of k order.
constexpr int kPitchWords = kStageChunks * 8 + 8;

// The scales are separate arrays so that types without an offset read only the scales: a warp's
// reads of the columns' (d, d·Σq) pairs were as many bytes as its reads of the codes.
struct Stage {
  uint32_t w[kGemmRows * kPitchWords];
  uint32_t x[kGemmCols * kPitchWords];
  union {
    float w_scale[kStageChunks][kGemmRows];
    int w_sub_scale[kStageChunks][kGemmRows];  // kBlock256 types
  };
  float w_block_scale[kGemmRows];           // kBlock256 types: a stage's 4 chunks lie in one block
  float w_offset[kStageChunks][kGemmRows];  // read by types with an offset
  float x_d[kStageChunks][kGemmCols];       // zero for absent columns and chunks
  float x_dsum[kStageChunks][kGemmCols];    // d·Σq, read by types with an offset
};

}  // namespace i8_detail

// A chunk's code products sum to at most 32·128·127 < 2^22 in magnitude. Added to the bits of
// 1.5·2^23 (whose float has a unit last place between 2^23 and 2^24), any such sum s gives the
// bits of the float 1.5·2^23 + s exactly.
constexpr int kDotBias = 0x4B400000;
constexpr float kDotBiasValue = 12582912.0f;  // 1.5·2^23

constexpr size_t kGemmInt8SharedBytes = 2 * sizeof(i8_detail::Stage) + kGemmCols * sizeof(int64_t);

// The sums w_row(r)·x̂[x_row(c)] over the 32-value chunks [c_begin, c_end) of K (c_begin a multiple
// of the stage's 4 chunks) for the tile's rows r < n_rows (at most 64; w_row(r) is row r's address)
// and columns c < n_cols, x̂ the quantized activations xq; then epilogue(acc, warp_row, warp_col, g,
// t) with each warp's 32 × 32 sums (store_warp_tile's layout), the shared memory free for its use.
// Launch with kGemmThreads threads and kGemmInt8SharedBytes of dynamic shared memory.
// kChunkUnroll: how far a stage's chunk loop unrolls (all 4 gain 4–6% on the Q8_0 products; a
// caller whose epilogue needs the registers takes 1).
template <typename I, int kChunkUnroll = i8_detail::kStageChunks, typename WRow, typename XRow, typename Epilogue>
__device__ void gemm_int8_tile_rows(WRow w_row, int64_t n_rows, int64_t K, int64_t c_begin, int64_t c_end,
                                    int64_t n_cols, QuantizedX xq, XRow x_row, Epilogue epilogue) {
  using namespace i8_detail;
  extern __shared__ __align__(16) uint8_t gemm_int8_shared[];
  Stage* stages = reinterpret_cast<Stage*>(gemm_int8_shared);
  int64_t* x_rows = reinterpret_cast<int64_t*>(stages + 2);  // [64], -1 past n_cols
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates
  const int warp_row = (warp / 2) * 32, warp_col = (warp % 2) * 32;
  const int64_t chunks_per_row = K / 32;
  if (tid < kGemmCols) x_rows[tid] = tid < n_cols ? static_cast<int64_t>(x_row(tid)) : -1;
  __syncthreads();

  // Weights: a job is kJobChunks chunks of a row decoded from one load; jobs tid, tid + 128, ...
  // are (row job / kRowJobs, chunks c0 + kJobChunks·(job % kRowJobs) ...).
  constexpr int kJobChunks = I::kJobChunks, kRowJobs = kStageChunks / kJobChunks;
  constexpr int kThreadJobs = kGemmRows * kRowJobs / kGemmThreads;
  typename I::Raw raw[kThreadJobs];
  auto load_weights = [&](int64_t c0) {
#pragma unroll
    for (int m = 0; m < kThreadJobs; ++m) {
      const int job = tid + m * kGemmThreads, r = job / kRowJobs, q = job % kRowJobs * kJobChunks;
      if (r < n_rows && c0 + q < c_end) raw[m] = I::load(w_row(r), c0 + q, K);
    }
  };
  auto store_weights = [&](Stage& s, int64_t c0) {
#pragma unroll
    for (int m = 0; m < kThreadJobs; ++m) {
#pragma unroll
      for (int i = 0; i < kJobChunks; ++i) {
        const int job = tid + m * kGemmThreads, r = job / kRowJobs, q = job % kRowJobs * kJobChunks + i;
        float scale = 0.0f, offset = 0.0f;  // absent rows and chunks add nothing
        int sub_scale = 0;
        if (r < n_rows && c0 + q < c_end) {
          uint32_t w[8];
          if constexpr (I::kBlock256)
            I::unpack(raw[m], c0 + q, w, sub_scale, scale, offset);
          else
            I::unpack(raw[m], c0 + q, w, scale, offset);
          uint4* dst = reinterpret_cast<uint4*>(s.w + r * kPitchWords + q * 8);
          dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
          dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
        }
        if constexpr (I::kBlock256) {
          s.w_sub_scale[q][r] = sub_scale;
          if (q == 0) s.w_block_scale[r] = scale;  // chunk c0 is present whenever the stage is
        } else {
          s.w_scale[q][r] = scale;
        }
        if constexpr (I::kOffset) s.w_offset[q][r] = offset;
      }
    }
  };
  // Tokens: 16-byte pieces p = tid + 128i of the stage's 64 columns × 128 codes, then the
  // columns' chunk scales two a thread.
  auto load_tokens = [&](Stage& s, int64_t c0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = tid + i * kGemmThreads, col = p / 8, part = p % 8;
      const int64_t xr = x_rows[col];
      if (xr >= 0 && c0 + part / 2 < c_end)
        cp_async_16(s.x + col * kPitchWords + part * 4, xq.codes + xr * K + c0 * 32 + part * 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int p = tid + i * kGemmThreads, col = p / kStageChunks, q = p % kStageChunks;
      const int64_t xr = x_rows[col];
      if (xr >= 0 && c0 + q < c_end) {
        const float2* src = xq.chunk_scales + xr * chunks_per_row + c0 + q;
        cp_async_4(&s.x_d[q][col], &src->x);
        if constexpr (I::kOffset) cp_async_4(&s.x_dsum[q][col], &src->y);
      } else {
        s.x_d[q][col] = 0.0f;
        if constexpr (I::kOffset) s.x_dsum[q][col] = 0.0f;
      }
    }
  };

  float acc[2][4][4] = {};  // [m16 tile][n8 tile][mma accumulator]
  load_weights(c_begin);
  load_tokens(stages[0], c_begin);
  cp_async_commit();
  store_weights(stages[0], c_begin);
  int buf = 0;
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kStageChunks, buf ^= 1) {
    const bool more = c0 + kStageChunks < c_end;
    if (more) {
      load_weights(c0 + kStageChunks);
      load_tokens(stages[buf ^ 1], c0 + kStageChunks);
    }
    cp_async_commit();
    cp_async_wait<1>();  // this stage's tokens have landed
    __syncthreads();
    const Stage& s = stages[buf];
    if constexpr (I::kBlock256) {
      // Each m16 tile sums sub_scale·(code products) over the stage's chunks in integers (a
      // chunk's products sum to under 2^19 in magnitude, sub-scales are at most 64, four chunks:
      // under 2^27), then scales the sums once by the weights' and the activations' block scales:
      // 2 instructions a sum and chunk where the FP32 form takes 4.
      const int n_chunks = c_end - c0 < kStageChunks ? static_cast<int>(c_end - c0) : kStageChunks;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r0 = warp_row + mi * 16 + g;
        int sums[4][4] = {};
#pragma unroll kChunkUnroll
        for (int q = 0; q < kStageChunks; ++q) {
          if (q >= n_chunks) break;
          uint2 a[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) a[h] = *reinterpret_cast<const uint2*>(s.w + (r0 + h * 8) * kPitchWords + q * 8 + 2 * t);
          const int sub[2] = {s.w_sub_scale[q][r0], s.w_sub_scale[q][r0 + 8]};
          float wo[2] = {};
          if constexpr (I::kOffset) wo[0] = s.w_offset[q][r0], wo[1] = s.w_offset[q][r0 + 8];
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            const uint2 b = *reinterpret_cast<const uint2*>(s.x + (warp_col + ni * 8 + g) * kPitchWords + q * 8 + 2 * t);
            constexpr int kZero[4] = {};
            int dots[4];
            mma_s8(dots, kZero, a[0].x, a[1].x, a[0].y, a[1].y, b.x, b.y);
#pragma unroll
            for (int e = 0; e < 4; ++e) sums[ni][e] += sub[e / 2] * dots[e];
            if constexpr (I::kOffset) {
              const float2 xdsum = *reinterpret_cast<const float2*>(&s.x_dsum[q][warp_col + ni * 8 + 2 * t]);
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[mi][ni][e] = fmaf(-wo[e / 2], e % 2 ? xdsum.y : xdsum.x, acc[mi][ni][e]);
            }
          }
        }
        const float wd[2] = {s.w_block_scale[r0], s.w_block_scale[r0 + 8]};
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          const float2 xd = *reinterpret_cast<const float2*>(&s.x_d[0][warp_col + ni * 8 + 2 * t]);
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc[mi][ni][e] = fmaf(wd[e / 2] * (e % 2 ? xd.y : xd.x), static_cast<float>(sums[ni][e]), acc[mi][ni][e]);
        }
      }
    } else {
#pragma unroll kChunkUnroll
      for (int q = 0; q < kStageChunks; ++q) {
        if (c0 + q >= c_end) break;
        uint2 a[2][2], b[4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            a[mi][h] = *reinterpret_cast<const uint2*>(s.w + (warp_row + mi * 16 + h * 8 + g) * kPitchWords + q * 8 + 2 * t);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
          b[ni] = *reinterpret_cast<const uint2*>(s.x + (warp_col + ni * 8 + g) * kPitchWords + q * 8 + 2 * t);
        // One m16 tile at a time, so that only its 16 integer sums are live. Accumulator e of a
        // tile: row g + 8·(e / 2), column 2t + e % 2. The sums start at kDotBias, so that each
        // comes out as the bits of the float kDotBiasValue + dot (int-to-float conversion runs at
        // a quarter of the FP32 rate; the subtraction is exact).
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          constexpr int kBias[4] = {kDotBias, kDotBias, kDotBias, kDotBias};
          int dots[4][4];
#pragma unroll
          for (int ni = 0; ni < 4; ++ni)
            mma_s8(dots[ni], kBias, a[mi][0].x, a[mi][1].x, a[mi][0].y, a[mi][1].y, b[ni].x, b[ni].y);
          const int r0 = warp_row + mi * 16 + g;
          const float ws[2] = {s.w_scale[q][r0], s.w_scale[q][r0 + 8]};
          float wo[2] = {};
          if constexpr (I::kOffset) wo[0] = s.w_offset[q][r0], wo[1] = s.w_offset[q][r0 + 8];
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            const int col = warp_col + ni * 8 + 2 * t;
            const float2 xd = *reinterpret_cast<const float2*>(&s.x_d[q][col]);
            float2 xdsum = {};
            if constexpr (I::kOffset) xdsum = *reinterpret_cast<const float2*>(&s.x_dsum[q][col]);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float d = e % 2 ? xd.y : xd.x;
              float& sum = acc[mi][ni][e];
              sum = fmaf(ws[e / 2] * d, __int_as_float(dots[ni][e]) - kDotBiasValue, sum);
              if constexpr (I::kOffset) sum = fmaf(-wo[e / 2], e % 2 ? xdsum.y : xdsum.x, sum);
            }
          }
        }
      }
    }
    if (more) store_weights(stages[buf ^ 1], c0 + kStageChunks);
    __syncthreads();  // the next stage overwrites this one's buffer
  }
  epilogue(acc, warp_row, warp_col, g, t);
}

// For epilogues that regroup a tile's sums: every warp's sums to shared memory (free once the
// tile is done) as [64 rows][kTileSumsPitch] floats, then a barrier; returns the array.
constexpr int kTileSumsPitch = kGemmCols + 1;
__device__ __forceinline__ const float* tile_sums_to_shared(const float (&acc)[2][4][4], int warp_row, int warp_col,
                                                            int g, int t) {
  extern __shared__ __align__(16) uint8_t gemm_int8_shared[];
  float* sums = reinterpret_cast<float*>(gemm_int8_shared);
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        sums[(warp_row + mi * 16 + g + 8 * (e / 2)) * kTileSumsPitch + warp_col + ni * 8 + 2 * t + e % 2] = acc[mi][ni][e];
  __syncthreads();
  return sums;
}

// out[out_row(c)·N + n] = W[n]·x̂[x_row(c)] for rows n0 .. n0+63 (< N) of W (gemm_int8_tile_rows).
template <typename I, typename XRow, typename OutRow>
__device__ void gemm_int8_tile(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t c_begin,
                               int64_t c_end, int64_t N, int64_t n0, int64_t n_cols, QuantizedX xq, XRow x_row,
                               float* __restrict__ out, OutRow out_row) {
  gemm_int8_tile_rows<I>(
      [=](int r) { return W + (n0 + r) * row_bytes; }, N - n0 < kGemmRows ? N - n0 : kGemmRows, K, c_begin, c_end,
      n_cols, xq, x_row, [&](const float(&acc)[2][4][4], int warp_row, int warp_col, int g, int t) {
        store_warp_tile(acc, n0 + warp_row, warp_col, g, t, N, n_cols, out, out_row);
      });
}

}  // namespace regolith::cuda
