// Decode-time products (a few tokens): every weight row is read once, with wide coalesced loads.
// A row is cut into units of 16 values that one thread fetches with a single 8- or 16-byte load
// (plus its block's scales, which neighbouring threads share through L1); consecutive threads take
// consecutive units, so a warp reads a contiguous stretch of the row. The 16 values of a unit pair
// with two runs of 8 activations, x[x0 .. x0+7] and x[x1 .. x1+7]. Each thread keeps its units'
// activations in registers and applies them to R rows, so activations are read once per R rows.
// Codes become floats by the exponent trick (a code OR'ed under the bits of 2^23, then 2^23
// subtracted), which runs on the integer and FP32 pipes instead of the slower conversion unit.
// A unit is fetched (its raw bytes, `Raw`) apart from its dot product with the activations, so
// that a thread puts the loads of all its rows in flight before it waits for the first of them.
// The dot product takes a block's scale out of the sum (d·Σ q·x rather than Σ (q·d)·x): the decode
// products issue about as many instructions as they move bytes, and this saves one or two a value.
//
// Types with a unit loader here: F32, F16, BF16 (K a multiple of 16), Q8_0 in the device layout
// of cuda_quant.cuh, Q4_K. Others take the chunk-based matvec (cuda_matmul.cu).
//
// Q8_0 and Q4_K also have int8 units (Int8Unit), which read activations already quantized to the
// format quant pairs with the type (Q8_0 or Q8_K codes and chunk scales, QuantizedX) and sum code
// products with dp4a: four values an instruction, where FP32 activations take about three
// instructions a value (byte to float, subtract, multiply-add). The decode products and the
// routed experts' gate/up kernel read them unless the backend runs exact products.
#pragma once

#include <cuda_fp16.h>

#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_int8.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace regolith::cuda {

constexpr int kUnit = 16;

// Byte b (0..3) of w as a float: 2^23 + byte, less `bias` (exact for bias = 2^23 + a small integer).
__device__ __forceinline__ float byte_as_float(uint32_t w, int b, float bias = 8388608.0f) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + b)) - bias;
}

// Σ w[i]·x[i] over a unit's 16 values.
__device__ __forceinline__ float dot16(const float* w, const float* x) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) s = fmaf(w[i], x[i], s);
  return s;
}

// A unit type's dot(raw, u, x, sums): Σ value·x over the unit's 16 values, where `sums` (from
// sums(x)) holds what the type needs of the activations alone, once for all rows of a unit.
struct NoActivationSums {
  struct Sums {};
  __device__ static Sums sums(const float*) { return {}; }
};

template <GgmlType kType>
struct Unit;

template <>
struct Unit<GgmlType::F32> : NoActivationSums {
  struct Raw {
    float4 v[4];
  };
  __device__ static void runs(int64_t u, int64_t& x0, int64_t& x1) { x0 = u * 16, x1 = x0 + 8; }
  __device__ static Raw fetch(const uint8_t* row, int64_t u, int64_t) {
    const float4* p = reinterpret_cast<const float4*>(row) + u * 4;
    Raw r;
#pragma unroll
    for (int i = 0; i < 4; ++i) r.v[i] = __ldg(p + i);
    return r;
  }
  __device__ static float dot(const Raw& r, int64_t, const float* x, Sums) {
    float w[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[4 * i] = r.v[i].x, w[4 * i + 1] = r.v[i].y, w[4 * i + 2] = r.v[i].z, w[4 * i + 3] = r.v[i].w;
    return dot16(w, x);
  }
};

// 16 values stored as 16-bit floats: two 16-byte words, two values per 32-bit word.
struct Raw16Bit {
  uint4 v[2];
};
__device__ __forceinline__ Raw16Bit fetch_16bit_unit(const uint8_t* row, int64_t u) {
  const uint4* p = reinterpret_cast<const uint4*>(row) + u * 2;
  return {{__ldg(p), __ldg(p + 1)}};
}
template <typename Widen>
__device__ __forceinline__ float dot_16bit_unit(const Raw16Bit& r, const float* x, Widen widen) {
  float w[16];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint32_t words[4] = {r.v[i].x, r.v[i].y, r.v[i].z, r.v[i].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) widen(words[j], w + 8 * i + 2 * j);
  }
  return dot16(w, x);
}

template <>
struct Unit<GgmlType::F16> : NoActivationSums {
  using Raw = Raw16Bit;
  __device__ static void runs(int64_t u, int64_t& x0, int64_t& x1) { x0 = u * 16, x1 = x0 + 8; }
  __device__ static Raw fetch(const uint8_t* row, int64_t u, int64_t) { return fetch_16bit_unit(row, u); }
  __device__ static float dot(const Raw& r, int64_t, const float* x, Sums) {
    return dot_16bit_unit(r, x, [](uint32_t word, float* out) {
      float2 f = __half22float2(*reinterpret_cast<const __half2*>(&word));
      out[0] = f.x, out[1] = f.y;
    });
  }
};

template <>
struct Unit<GgmlType::BF16> : NoActivationSums {
  using Raw = Raw16Bit;
  __device__ static void runs(int64_t u, int64_t& x0, int64_t& x1) { x0 = u * 16, x1 = x0 + 8; }
  __device__ static Raw fetch(const uint8_t* row, int64_t u, int64_t) { return fetch_16bit_unit(row, u); }
  __device__ static float dot(const Raw& r, int64_t, const float* x, Sums) {
    return dot_16bit_unit(r, x, [](uint32_t word, float* out) {
      out[0] = __uint_as_float(word << 16), out[1] = __uint_as_float(word & 0xFFFF0000u);
    });
  }
};

// Device layout (cuda_quant.cuh): the row's K codes, then its K/32 fp16 scales.
template <>
struct Unit<GgmlType::Q8_0> : NoActivationSums {
  struct Raw {
    uint4 codes;
    uint16_t d;
  };
  __device__ static void runs(int64_t u, int64_t& x0, int64_t& x1) { x0 = u * 16, x1 = x0 + 8; }
  __device__ static Raw fetch(const uint8_t* row, int64_t u, int64_t K) {
    return {__ldg(reinterpret_cast<const uint4*>(row) + u), __ldg(reinterpret_cast<const uint16_t*>(row + K) + (u >> 1))};
  }
  // The unit's 16 values share their block's scale d: d·Σ code·x.
  __device__ static float dot(const Raw& r, int64_t, const float* x, Sums) {
    const uint4 v = r.codes;
    // Codes are signed: flipping the top bit makes them code + 128 as unsigned bytes.
    const uint32_t words[4] = {v.x ^ 0x80808080u, v.y ^ 0x80808080u, v.z ^ 0x80808080u, v.w ^ 0x80808080u};
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int b = 0; b < 4; ++b) s = fmaf(byte_as_float(words[j], b, 8388608.0f + 128.0f), x[4 * j + b], s);
    return f16(r.d) * s;
  }
};

// 16 units per 256-value block: unit v of a block holds 8 code bytes at qs[32g + l0] (g = v/4,
// l0 = 8(v%4)): low nibbles are values 64g + l0 .. (sub-block 2g), high nibbles 64g + 32 + l0 ..
// (sub-block 2g + 1). Blocks are 144 bytes, so each header is 16-byte aligned in a device row.
template <>
struct Unit<GgmlType::Q4_K> {
  struct Raw {
    uint2 q;
    uint4 header;
  };
  // Units are never negative: bit operations instead of signed division.
  __device__ static void runs(int64_t u, int64_t& x0, int64_t& x1) {
    const int v = static_cast<int>(u & 15);
    x0 = (u >> 4) * 256 + (v >> 2) * 64 + (v & 3) * 8, x1 = x0 + 32;
  }
  __device__ static Raw fetch(const uint8_t* row, int64_t u, int64_t) {
    const auto* b = reinterpret_cast<const quant::BlockQ4_K*>(row) + (u >> 4);
    const int v = static_cast<int>(u & 15);
    return {__ldg(reinterpret_cast<const uint2*>(b->qs + 32 * (v >> 2) + (v & 3) * 8)), __ldg(reinterpret_cast<const uint4*>(b))};
  }
  // The unit's runs are sub-blocks 2g and 2g + 1, values code·d_j - o_j: d_j·Σ code·x - o_j·Σ x.
  struct Sums {
    float lo, hi;  // Σ x over the first and the second run
  };
  __device__ static Sums sums(const float* x) {
    Sums s{0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 8; ++i) s.lo += x[i], s.hi += x[8 + i];
    return s;
  }
  __device__ static float dot(const Raw& r, int64_t u, const float* x, Sums xs) {
    const uint2 q = r.q;
    const uint4 header = r.header;
    const float d = f16(static_cast<uint16_t>(header.x)), dmin = f16(static_cast<uint16_t>(header.x >> 16));
    uint32_t scales, mins;
    k4_scale_min_pair(header, static_cast<int>(u & 15) >> 2, scales, mins);
    const float sc0 = byte_as_float(scales, 0), sc1 = byte_as_float(scales, 1);
    const float m0 = byte_as_float(mins, 0), m1 = byte_as_float(mins, 1);
    const uint32_t words[2] = {q.x, q.y};
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t lo = words[j] & 0x0F0F0F0Fu, hi = (words[j] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        s0 = fmaf(byte_as_float(lo, k), x[4 * j + k], s0);
        s1 = fmaf(byte_as_float(hi, k), x[8 + 4 * j + k], s1);
      }
    }
    return fmaf(d * sc0, s0, fmaf(d * sc1, s1, -(dmin * m0 * xs.lo + dmin * m1 * xs.hi)));
  }
};

// ---- int8 activations ----

// A unit's activations as int8 codes: the 8 codes of each run and the scale of their chunk (both
// runs of a Q8_0 or Q4_K unit lie in one chunk of the activation format).
struct Int8Run {
  uint2 lo, hi;
  float d;
};

// Int8Unit<T>: Unit<T>'s rows (fetch, runs) with dot products on Int8Run activations.
template <GgmlType kType>
struct Int8Unit;

template <>
struct Int8Unit<GgmlType::Q8_0> : Unit<GgmlType::Q8_0> {
  using Activation = Int8Run;
  static constexpr bool kBlock256 = I8<GgmlType::Q8_0>::kBlock256;  // Q8_0 activations
  __device__ static Sums sums(const Int8Run&) { return {}; }
  __device__ static float dot(const Raw& r, int64_t, const Int8Run& x, Sums) {
    const int s = __dp4a(static_cast<int>(r.codes.w), static_cast<int>(x.hi.y),
                         __dp4a(static_cast<int>(r.codes.z), static_cast<int>(x.hi.x),
                                __dp4a(static_cast<int>(r.codes.y), static_cast<int>(x.lo.y),
                                       __dp4a(static_cast<int>(r.codes.x), static_cast<int>(x.lo.x), 0))));
    return f16(r.d) * x.d * static_cast<float>(s);
  }
};

// Q4_K values code·d_j − o_j on Q8_K activations d·q: d·(d_j·Σ code·q − o_j·Σ q) per run, both
// sums in integers.
template <>
struct Int8Unit<GgmlType::Q4_K> : Unit<GgmlType::Q4_K> {
  using Activation = Int8Run;
  static constexpr bool kBlock256 = I8<GgmlType::Q4_K>::kBlock256;  // Q8_K activations
  struct Sums {
    int lo, hi;  // Σ q over each run
  };
  __device__ static Sums sums(const Int8Run& x) {
    constexpr int kOnes = 0x01010101;
    return {__dp4a(static_cast<int>(x.lo.y), kOnes, __dp4a(static_cast<int>(x.lo.x), kOnes, 0)),
            __dp4a(static_cast<int>(x.hi.y), kOnes, __dp4a(static_cast<int>(x.hi.x), kOnes, 0))};
  }
  __device__ static float dot(const Raw& r, int64_t u, const Int8Run& x, Sums xs) {
    const uint4 header = r.header;
    const float d = f16(static_cast<uint16_t>(header.x)), dmin = f16(static_cast<uint16_t>(header.x >> 16));
    uint32_t scales, mins;
    k4_scale_min_pair(header, static_cast<int>(u & 15) >> 2, scales, mins);
    const int lo = __dp4a(static_cast<int>(r.q.y & 0x0F0F0F0Fu), static_cast<int>(x.lo.y),
                          __dp4a(static_cast<int>(r.q.x & 0x0F0F0F0Fu), static_cast<int>(x.lo.x), 0));
    const int hi = __dp4a(static_cast<int>((r.q.y >> 4) & 0x0F0F0F0Fu), static_cast<int>(x.hi.y),
                          __dp4a(static_cast<int>((r.q.x >> 4) & 0x0F0F0F0Fu), static_cast<int>(x.hi.x), 0));
    const int sc = static_cast<int>(scales & 0xFF) * lo + static_cast<int>(scales >> 8) * hi;
    const int m = static_cast<int>(mins & 0xFF) * xs.lo + static_cast<int>(mins >> 8) * xs.hi;
    return x.d * (d * static_cast<float>(sc) - dmin * static_cast<float>(m));
  }
};

// Calls fn(Int8Unit<type>{}) for a type with an int8 unit; false for any other type. On the host
// or in device code, as dispatch_unit.
#pragma nv_exec_check_disable
template <typename Fn>
__host__ __device__ __forceinline__ bool dispatch_int8_unit(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::Q8_0: fn(Int8Unit<GgmlType::Q8_0>{}); return true;
    case GgmlType::Q4_K: fn(Int8Unit<GgmlType::Q4_K>{}); return true;
    default: return false;
  }
}

// ---- activation sources of gemv_accumulate ----

// The activations a unit type's dot reads: 16 floats, or its Activation (Int8Run).
template <typename U, typename = void>
struct ActivationOf {
  using type = float[16];
};
template <typename U>
struct ActivationOf<U, std::void_t<typename U::Activation>> {
  using type = typename U::Activation;
};

// FP32 activations: token t's values at x + t·ld.
struct FloatX {
  const float* x;
  int64_t ld;
  // The source whose token 0 is this one's token t0.
  __host__ __device__ FloatX from_token(int64_t t0) const { return {x + t0 * ld, ld}; }
  __device__ void load(int t, int64_t x0, int64_t x1, float (&out)[16]) const {
    const float4* a = reinterpret_cast<const float4*>(x + t * ld + x0);
    const float4* b = reinterpret_cast<const float4*>(x + t * ld + x1);
    const float4 v[4] = {a[0], a[1], b[0], b[1]};
#pragma unroll
    for (int i = 0; i < 4; ++i) out[4 * i] = v[i].x, out[4 * i + 1] = v[i].y, out[4 * i + 2] = v[i].z, out[4 * i + 3] = v[i].w;
  }
};

// Quantized activations as quantize_activations lays them out (ld = K, a multiple of 32): token
// t's codes at q.codes + t·ld, and the scale of code i in chunk_scales[i/32] (a Q8_K block's d is
// stored in each of its 8 chunks).
struct Int8X {
  QuantizedX q;
  int64_t ld;
  // The source whose token 0 is this one's token t0.
  __host__ __device__ Int8X from_token(int64_t t0) const { return {{q.codes + t0 * ld, q.chunk_scales + t0 * ld / 32}, ld}; }
  __device__ void load(int t, int64_t x0, int64_t x1, Int8Run& out) const {
    const int8_t* c = q.codes + t * ld;
    out.lo = *reinterpret_cast<const uint2*>(c + x0);
    out.hi = *reinterpret_cast<const uint2*>(c + x1);
    out.d = q.chunk_scales[(t * ld + x0) / 32].x;
  }
};

// Whether `type` has a unit loader and rows of K values fit it.
inline bool has_unit_loader(GgmlType type, int64_t K) {
  switch (type) {
    case GgmlType::F32:
    case GgmlType::F16:
    case GgmlType::BF16: return K % kUnit == 0;
    case GgmlType::Q8_0:
    case GgmlType::Q4_K: return true;  // their blocks are whole units
    default: return false;
  }
}

// Calls fn(Unit<type>{}) for a type with a unit loader, on the host (to pick a kernel) or in
// device code (a branch per call, uniform where the callers' threads share a type).
#pragma nv_exec_check_disable
template <typename Fn>
__host__ __device__ __forceinline__ void dispatch_unit(GgmlType type, Fn&& fn) {
  switch (type) {
    case GgmlType::F32: fn(Unit<GgmlType::F32>{}); return;
    case GgmlType::F16: fn(Unit<GgmlType::F16>{}); return;
    case GgmlType::BF16: fn(Unit<GgmlType::BF16>{}); return;
    case GgmlType::Q8_0: fn(Unit<GgmlType::Q8_0>{}); return;
    case GgmlType::Q4_K: fn(Unit<GgmlType::Q4_K>{}); return;
    default: return;
  }
}

// Rows to read for rows[0 .. R): an absent (null) row reads the first present one instead, so that
// no load waits behind a branch and a thread has all its rows' loads in flight at once. Callers
// drop absent rows' results. False when no row is present.
template <int R>
__device__ __forceinline__ bool rows_to_fetch(const uint8_t* const (&rows)[R], const uint8_t* (&src)[R]) {
  const uint8_t* present = nullptr;
#pragma unroll
  for (int r = R - 1; r >= 0; --r) present = rows[r] ? rows[r] : present;
#pragma unroll
  for (int r = 0; r < R; ++r) src[r] = rows[r] ? rows[r] : present;
  return present != nullptr;
}

// acc[r][t] += unit u of R rows (already fetched: raw[r]) times x_t, for tokens t < T <= TB of the
// activation source x (FloatX or, for int8 units, Int8X).
template <typename U, int R, int TB, typename X>
__device__ __forceinline__ void accumulate_unit(const typename U::Raw (&raw)[R], int64_t u, const X& x, int T,
                                                float (&acc)[R][TB]) {
  int64_t x0, x1;
  U::runs(u, x0, x1);
  typename ActivationOf<U>::type xs[TB];
  typename U::Sums sums[TB];
#pragma unroll
  for (int t = 0; t < TB; ++t) {
    if (t < T) {
      x.load(t, x0, x1, xs[t]);
      sums[t] = U::sums(xs[t]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TB; ++t)
      if (t < T) acc[r][t] += U::dot(raw[r], u, xs[t], sums[t]);
}

// acc[r][t] += this thread's share of rows[r]·x_t (as accumulate_unit): units u = first, first +
// stride, ... of K/16. A unit's R rows are all fetched before the first is decoded. Absent (null)
// rows' acc hold meaningless sums.
template <typename U, int R, int TB, typename X>
__device__ __forceinline__ void gemv_accumulate(const uint8_t* const (&rows)[R], int64_t K, const X& x, int T,
                                                int64_t first, int64_t stride, float (&acc)[R][TB]) {
  const uint8_t* src[R];
  if (!rows_to_fetch(rows, src)) return;
  const int64_t n_units = K / kUnit;
#pragma unroll 2
  for (int64_t u = first; u < n_units; u += stride) {
    typename U::Raw raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r] = U::fetch(src[r], u, K);
    accumulate_unit<U, R, TB>(raw, u, x, T, acc);
  }
}

// Sums v[0..N) over the block (blockDim.x a multiple of 32, at most 1024); thread 0 gets the sums.
template <int N>
__device__ __forceinline__ void block_reduce_to_first(float (&v)[N]) {
  __shared__ float partial[32][N];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
  if (n_warps == 1) return;
  if (lane == 0)
#pragma unroll
    for (int i = 0; i < N; ++i) partial[warp][i] = v[i];
  __syncthreads();
  if (threadIdx.x == 0)
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float s = partial[0][i];
      for (int w = 1; w < n_warps; ++w) s += partial[w][i];
      v[i] = s;
    }
}

// acc (each thread's rows × tokens) summed over the block: thread 0 gets sums[r·TB + t].
template <int R, int TB>
__device__ __forceinline__ void block_reduce_rows(const float (&acc)[R][TB], float (&sums)[R * TB]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TB; ++t) sums[r * TB + t] = acc[r][t];
  block_reduce_to_first(sums);
}

// Threads for a block whose rows have n_units units each: whole warps, at most 128.
inline int gemv_threads(int64_t n_units) {
  return static_cast<int>(std::min<int64_t>(128, std::max<int64_t>(32, (n_units + 31) / 32 * 32)));
}

// Threads for a block whose rows have n_units units each, at most max_threads: as few units per
// thread as that allows, spread evenly (rows of 2,560 values: 160 threads of one unit each, where
// 128 threads leave a quarter of them two), in whole warps.
inline int balanced_threads(int64_t n_units, int max_threads) {
  const int64_t per_thread = std::max<int64_t>(1, (n_units + max_threads - 1) / max_threads);
  const int64_t threads = (n_units + per_thread - 1) / per_thread;
  return static_cast<int>(std::min<int64_t>(max_threads, std::max<int64_t>(32, (threads + 31) / 32 * 32)));
}

}  // namespace regolith::cuda
