// The tensor-core tile of the prefill matrix products: 64 weight rows × 64 token columns per block
// of 4 warps, each warp 32 rows × 32 columns of m16n8k8 TF32 mma.sync. Per 32-wide step of K, two
// warps decode one 32-value chunk of a weight row each (cuda_quant.cuh) and two warps read one
// chunk of a token column each, into registers while the tensor cores work on the previous step,
// then into the other half of a double-buffered shared tile.
//
// Precision: every operand is split into two TF32 parts, v = hi + lo (hi = v rounded to TF32, lo =
// the rest rounded again), and W·x is summed as hi·hi + hi·lo + lo·hi: the dropped terms are below
// 3·2^-22·|w||x| per product, so the result is as accurate as an FP32 product (activations of this
// model can be large, and plain TF32 would round each of them to 11 bits). The tensor cores may
// truncate when they accumulate, so each 32-wide step is summed on its own and added to the
// FP32 accumulators with an ordinary rounded add.
//
// Columns are addressed through x_row/out_row, so the same tile serves a plain product and the
// token lists of grouped experts.
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace regolith::cuda {

// Up to this many tokens a product is a matvec (each weight row read once for all tokens).
constexpr int kMatvecMaxTokens = 8;
constexpr int kGemmRows = 64;        // weight rows (outputs per token) of one block
constexpr int kGemmCols = 64;        // token columns of one block
constexpr int kGemmThreads = 128;    // threads 0..63 load weight rows, 64..127 token columns
constexpr int kGemmBlocksPerSm = 3;  // caps registers at 168 (a few bytes spill), so that 12 warps share an SM

namespace gemm_detail {

// A 32-value chunk in shared memory, 36 floats apart (16-byte rows that rotate through the banks).
// Value k sits at position (k % 4)·8 + k / 4, so the lane that owns k ≡ t (mod 4) in the mma
// fragments finds its 8 values of the chunk side by side: two 16-byte loads.
constexpr int kPitch = 36;

__device__ __forceinline__ void store_chunk(float* dst, const float (&v)[32]) {
#pragma unroll
  for (int q = 0; q < 8; ++q)  // positions 4q .. 4q+3 hold k = 16(q % 2) + 4i + q / 2
    *reinterpret_cast<float4*>(dst + 4 * q) = make_float4(v[16 * (q % 2) + q / 2], v[16 * (q % 2) + 4 + q / 2],
                                                          v[16 * (q % 2) + 8 + q / 2], v[16 * (q % 2) + 12 + q / 2]);
}

struct SplitTf32 {
  uint32_t hi, lo;
};

__device__ __forceinline__ SplitTf32 split_tf32(float v) {
  uint32_t hi, lo;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(hi) : "f"(v));
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(lo) : "f"(v - __uint_as_float(hi)));
  return {hi, lo};
}

// d += a·b for one m16n8k8 tile (PTX ISA fragment layouts for .tf32).
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace gemm_detail

// Whether rows of K floats from x can be read 16 bytes at a time (gemm_tile's x_vec4).
inline bool rows_vec4(const float* x, int64_t K) { return K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0; }

// Row tiles go in grid.y, whose limit is 65535.
inline unsigned gemm_row_blocks(int64_t N) {
  if (N > 65535LL * kGemmRows) fail("cuda gemm: ", N, " rows exceed the grid");
  return blocks_for(N, kGemmRows);
}

// out[out_row(c)·N + n] = W[n]·x[x_row(c)·K ..] for rows n0 .. n0+63 (< N) and columns c < n_cols.
// x_vec4: x rows may be read 16 bytes at a time (K % 4 == 0 and x 16-byte aligned).
template <typename D, typename XRow, typename OutRow>
__device__ void gemm_tile(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t N, int64_t n0,
                          int64_t n_cols, const float* __restrict__ x, XRow x_row, bool x_vec4, float* __restrict__ out,
                          OutRow out_row) {
  using namespace gemm_detail;
  __shared__ __align__(16) float Ws[2][kGemmRows][kPitch];
  __shared__ __align__(16) float Xs[2][kGemmCols][kPitch];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates
  const int warp_row = (warp / 2) * 32, warp_col = (warp % 2) * 32;
  const bool loads_weights = tid < kGemmRows;
  const int own = loads_weights ? tid : tid - kGemmRows;  // the row or column this thread loads
  const bool own_valid = loads_weights ? n0 + own < N : own < n_cols;
  const uint8_t* w_row = own_valid && loads_weights ? W + (n0 + own) * row_bytes : nullptr;
  const float* x_col = own_valid && !loads_weights ? x + x_row(own) * K : nullptr;

  // One 32-wide step of K for this thread's row or column; zeros outside the matrix.
  auto load_step = [&](int64_t c, float(&v)[32]) {
    if (!own_valid) {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = 0.0f;
    } else if (loads_weights) {
      D::chunk(w_row, c, K, v);
    } else if (x_vec4 && c * 32 + 32 <= K) {
#pragma unroll
      for (int j = 0; j < 32; j += 4) {
        float4 f = *reinterpret_cast<const float4*>(x_col + c * 32 + j);
        v[j] = f.x, v[j + 1] = f.y, v[j + 2] = f.z, v[j + 3] = f.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < 32; ++j) v[j] = c * 32 + j < K ? x_col[c * 32 + j] : 0.0f;
    }
  };
  auto store_step = [&](int buf, const float(&v)[32]) {
    store_chunk(loads_weights ? &Ws[buf][own][0] : &Xs[buf][own][0], v);
  };

  float acc[2][4][4] = {};  // [m16 tile][n8 tile][mma accumulator]
  float staged[32];
  const int64_t n_steps = (K + 31) / 32;
  load_step(0, staged);
  store_step(0, staged);
  __syncthreads();
  for (int64_t c = 0; c < n_steps; ++c) {
    const int buf = static_cast<int>(c % 2);
    if (c + 1 < n_steps) load_step(c + 1, staged);  // in flight while the tensor cores work
    float part[2][4][4] = {};
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // k8 steps 2·half and 2·half + 1
      float4 a[2][2], b[4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          a[mi][r] = *reinterpret_cast<const float4*>(&Ws[buf][warp_row + mi * 16 + r * 8 + g][t * 8 + half * 4]);
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
        b[ni] = *reinterpret_cast<const float4*>(&Xs[buf][warp_col + ni * 8 + g][t * 8 + half * 4]);
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        SplitTf32 bk[4][2];  // column g, rows k = t and t + 4 of each n8 tile
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
          bk[ni][0] = split_tf32(s ? b[ni].z : b[ni].x);
          bk[ni][1] = split_tf32(s ? b[ni].w : b[ni].y);
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          // rows g and g + 8, columns k = t and t + 4 of the m16 tile
          SplitTf32 a0 = split_tf32(s ? a[mi][0].z : a[mi][0].x), a1 = split_tf32(s ? a[mi][1].z : a[mi][1].x);
          SplitTf32 a2 = split_tf32(s ? a[mi][0].w : a[mi][0].y), a3 = split_tf32(s ? a[mi][1].w : a[mi][1].y);
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {  // the small terms first
            mma_tf32(part[mi][ni], a0.lo, a1.lo, a2.lo, a3.lo, bk[ni][0].hi, bk[ni][1].hi);
            mma_tf32(part[mi][ni], a0.hi, a1.hi, a2.hi, a3.hi, bk[ni][0].lo, bk[ni][1].lo);
            mma_tf32(part[mi][ni], a0.hi, a1.hi, a2.hi, a3.hi, bk[ni][0].hi, bk[ni][1].hi);
          }
        }
      }
    }
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][ni][e] += part[mi][ni][e];
    // The other buffer was last read in step c - 1, which every thread finished before the
    // barrier that ended it.
    if (c + 1 < n_steps) store_step(1 - buf, staged);
    __syncthreads();
  }
  // Accumulator e of a tile: row g + 8·(e / 2), column 2t + e % 2.
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t n = n0 + warp_row + mi * 16 + g + 8 * (e / 2);
        const int col = warp_col + ni * 8 + 2 * t + e % 2;
        if (n < N && col < n_cols) out[out_row(col) * N + n] = acc[mi][ni][e];
      }
}

}  // namespace regolith::cuda
