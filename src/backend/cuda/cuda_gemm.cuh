// The tensor-core tile of the prefill matrix products: 64 weight rows × 64 token columns per block
// of 4 warps, each warp 32 rows × 32 columns of m16n8k8 TF32 mma.sync. A stage covers 128 values
// of K: the block decodes 64 rows × 4 chunks of 32 values (cuda_quant.cuh) and reads 64 columns ×
// 128 values into shared memory, then runs the tensor cores over them. Weight rows are decoded
// four lanes to a row, on consecutive chunks, so one load instruction of a warp touches 8 rows
// rather than 32, and a warp reads a token column's 128 values with 16-byte loads. The stage is
// single-buffered: three blocks share an SM, so one block's loads overlap another's tensor-core
// work.
//
// Precision: every operand is split into two TF32 parts, v = hi + lo (hi = v rounded to TF32, lo =
// the rest, of which the tensor cores read 11 significant bits; cuda_mma.cuh), and W·x is summed as
// hi·hi + hi·lo + lo·hi: the dropped terms are below 3·2^-22·|w||x| per product, so the result is
// as accurate as an FP32 product (activations of this model can be large, and plain TF32 would
// round each of them to 11 bits). The tensor cores may truncate when they accumulate, so each
// 32-wide chunk is summed on its own and added to the FP32 accumulators with an ordinary rounded
// add.
//
// Columns are addressed through x_row/out_row, so the same tile serves a plain product and the
// token lists of grouped experts. A tile may cover part of K (chunks [c_begin, c_end)): a product
// with few tiles splits K over several blocks and sums their partial outputs (cuda_matmul.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace regolith::cuda {

// Up to this many tokens a product is a matvec (each weight row read once for all tokens).
constexpr int kMatvecMaxTokens = 8;
constexpr int kGemmRows = 64;        // weight rows (outputs per token) of one block
constexpr int kGemmCols = 64;        // token columns of one block
constexpr int kGemmThreads = 128;
constexpr int kGemmBlocksPerSm = 3;  // registers capped at 168, shared memory at a third of an SM

namespace gemm_detail {

constexpr int kStepChunks = 4;  // 32-value chunks of K per stage
// In shared memory a chunk takes 36 floats and a row 4 chunks + 4 floats: 16-byte aligned, and
// rows g and g + 1 start 20 banks apart, so the fragment loads below are free of bank conflicts.
// Value k of a chunk sits at position (k % 4)·8 + k / 4, so the lane that owns k ≡ t (mod 4) in
// the mma fragments finds its 8 values of the chunk side by side: two 16-byte loads.
constexpr int kChunkPitch = 36;
constexpr int kRowPitch = kStepChunks * kChunkPitch + 4;

}  // namespace gemm_detail

// Dynamic shared memory of gemm_tile: the weight and token tiles, then the token columns' x rows.
constexpr size_t kGemmSharedBytes =
    (kGemmRows + kGemmCols) * gemm_detail::kRowPitch * sizeof(float) + kGemmCols * sizeof(int64_t);

// A kernel running gemm_tile (bytes kGemmSharedBytes) or gemm_int8_tile (kGemmInt8SharedBytes)
// needs more than the default 48 KB of shared memory: allow_max_shared (cuda_common.cuh).

// Whether rows of K floats from x can be read 16 bytes at a time (gemm_tile's x_vec4).
inline bool rows_vec4(const float* x, int64_t K) { return K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0; }

// Row tiles go in grid.y, whose limit is 65535.
inline unsigned gemm_row_blocks(int64_t N) {
  if (N > 65535LL * kGemmRows) fail("cuda gemm: ", N, " rows exceed the grid");
  return blocks_for(N, kGemmRows);
}

// K splits for a product of `tiles` blocks at blocks_per_sm a multiprocessor: chunks per split
// (cuda_matmul.cu).
int64_t split_chunks_for(int64_t tiles, int64_t K, int blocks_per_sm);

// A warp's 32 × 32 accumulators (acc[m16 tile][n8 tile][e], fragment coordinates g, t) to rows
// row0 + .. (< N) and columns col0 + .. (< n_cols) of out: accumulator e of a tile is its row
// g + 8·(e / 2), column 2t + e % 2.
template <typename OutRow>
__device__ __forceinline__ void store_warp_tile(const float (&acc)[2][4][4], int64_t row0, int col0, int g, int t,
                                                int64_t N, int64_t n_cols, float* __restrict__ out, OutRow out_row) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t n = row0 + mi * 16 + g + 8 * (e / 2);
        const int col = col0 + ni * 8 + 2 * t + e % 2;
        if (n < N && col < n_cols) out[out_row(col) * N + n] = acc[mi][ni][e];
      }
}

// out[out_row(c)·N + n] = W[n]·x[x_row(c)·K ..] over the 32-value chunks [c_begin, c_end) of K
// (c_begin a multiple of the stage's 4 chunks) for rows n0 .. n0+63 (< N) and columns c < n_cols.
// x_vec4: x rows may be read 16 bytes at a time (K % 4 == 0 and x 16-byte aligned). Launch with
// kGemmThreads threads and kGemmSharedBytes of dynamic shared memory.
template <typename D, typename XRow, typename OutRow>
__device__ void gemm_tile(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t c_begin,
                          int64_t c_end, int64_t N, int64_t n0, int64_t n_cols, const float* __restrict__ x,
                          XRow x_row, bool x_vec4, float* __restrict__ out, OutRow out_row) {
  using namespace gemm_detail;
  extern __shared__ __align__(16) float gemm_shared[];
  float* Ws = gemm_shared;                 // [64 rows][kRowPitch]
  float* Xs = Ws + kGemmRows * kRowPitch;  // [64 columns][kRowPitch]
  int64_t* x_rows = reinterpret_cast<int64_t*>(Xs + kGemmCols * kRowPitch);  // [64], -1 past n_cols
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates
  const int warp_row = (warp / 2) * 32, warp_col = (warp % 2) * 32;
  if (tid < kGemmCols) x_rows[tid] = tid < n_cols ? static_cast<int64_t>(x_row(tid)) : -1;
  __syncthreads();

  float acc[2][4][4] = {};  // [m16 tile][n8 tile][mma accumulator]
  for (int64_t c0 = c_begin; c0 < c_end; c0 += kStepChunks) {
    // Weights: jobs tid and tid + 128 are (row job / 4, chunk c0 + job % 4); zeros outside W.
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int job = tid + m * kGemmThreads, r = job / kStepChunks, q = job % kStepChunks;
      float v[32];
      if (n0 + r < N && c0 + q < c_end) {
        D::chunk(W + (n0 + r) * row_bytes, c0 + q, K, v);
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) v[j] = 0.0f;
      }
#pragma unroll
      for (int p = 0; p < 8; ++p)  // positions 4p .. 4p+3 hold k = 16(p % 2) + 4i + p / 2
        *reinterpret_cast<float4*>(Ws + r * kRowPitch + q * kChunkPitch + 4 * p) =
            make_float4(v[16 * (p % 2) + p / 2], v[16 * (p % 2) + 4 + p / 2], v[16 * (p % 2) + 8 + p / 2],
                        v[16 * (p % 2) + 12 + p / 2]);
    }
    // Tokens: warp w reads columns w, w + 4, ..., lane l values 4l .. 4l+3 of the stage, which
    // land in chunk l / 8 at positions i·8 + l % 8.
#pragma unroll 4
    for (int col = warp; col < kGemmCols; col += 4) {
      const int64_t xr = x_rows[col], k = c0 * 32 + 4 * lane;
      float4 f = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (xr >= 0) {
        const float* p = x + xr * K + k;
        if (x_vec4 && k + 4 <= K) {
          f = *reinterpret_cast<const float4*>(p);
        } else {
          if (k < K) f.x = p[0];
          if (k + 1 < K) f.y = p[1];
          if (k + 2 < K) f.z = p[2];
          if (k + 3 < K) f.w = p[3];
        }
      }
      float* dst = Xs + col * kRowPitch + (lane / 8) * kChunkPitch + lane % 8;
      dst[0] = f.x, dst[8] = f.y, dst[16] = f.z, dst[24] = f.w;
    }
    __syncthreads();

#pragma unroll 1
    for (int q = 0; q < kStepChunks; ++q) {
      if (c0 + q >= c_end) break;
      const float* wq = Ws + q * kChunkPitch + t * 8;
      const float* xq = Xs + q * kChunkPitch + t * 8;
      float part[2][4][4] = {};
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // k8 steps 2·half and 2·half + 1 of the chunk
        float4 a[2][2], b[4];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            a[mi][r] = *reinterpret_cast<const float4*>(wq + (warp_row + mi * 16 + r * 8 + g) * kRowPitch + half * 4);
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
          b[ni] = *reinterpret_cast<const float4*>(xq + (warp_col + ni * 8 + g) * kRowPitch + half * 4);
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
            const SplitTf32 ak[4] = {split_tf32(s ? a[mi][0].z : a[mi][0].x), split_tf32(s ? a[mi][1].z : a[mi][1].x),
                                     split_tf32(s ? a[mi][0].w : a[mi][0].y), split_tf32(s ? a[mi][1].w : a[mi][1].y)};
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) mma_split_tf32(part[mi][ni], ak, bk[ni]);
          }
        }
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mi][ni][e] += part[mi][ni][e];
    }
    __syncthreads();  // the next stage overwrites the tiles
  }
  store_warp_tile(acc, n0 + warp_row, warp_col, g, t, N, n_cols, out, out_row);
}

}  // namespace regolith::cuda
