// The FP32 tile of the prefill matrix products: 64 weight rows × 64 token columns per block of
// 256 threads, each thread 4×4 outputs. Per 32-wide step of K, 64 threads decode one 32-value
// chunk of a row each into shared memory (cuda_quant.cuh) while the block stages the columns'
// inputs. Columns are addressed through x_row/out_row, so the same tile serves a plain product
// and the token lists of grouped experts.
#pragma once

#include "backend/cuda/cuda_quant.cuh"

namespace regolith::cuda {

// Up to this many tokens a product is a matvec (each weight row read once for all tokens).
constexpr int kMatvecMaxTokens = 8;
constexpr int kGemmTile = 64;
constexpr int kGemmThreads = 256;

// out[out_row(c)·N + n] = W[n]·x[x_row(c)·K ..] for rows n0..n0+63 (< N) and columns c < n_cols.
template <typename D, typename XRow, typename OutRow>
__device__ void gemm_tile(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t N, int64_t n0,
                          int64_t n_cols, const float* __restrict__ x, XRow x_row, float* __restrict__ out,
                          OutRow out_row) {
  __shared__ float Ws[32][kGemmTile + 1];  // [k][row]
  __shared__ float Xs[32][kGemmTile + 1];  // [k][column]
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  float acc[4][4] = {};
  const int64_t n_chunks = (K + 31) / 32;
  for (int64_t c = 0; c < n_chunks; ++c) {
    if (tid < kGemmTile) {
      float w[32];
      if (n0 + tid < N) {
        D::chunk(W + (n0 + tid) * row_bytes, c, K, w);
      } else {
#pragma unroll
        for (int j = 0; j < 32; ++j) w[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 32; ++j) Ws[j][tid] = w[j];
    }
    for (int i = tid; i < 32 * kGemmTile; i += kGemmThreads) {
      int col = i / 32, kk = i % 32;
      int64_t k = c * 32 + kk;
      Xs[kk][col] = (col < n_cols && k < K) ? x[x_row(col) * K + k] : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < 32; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = Ws[kk][ty * 4 + i], b[i] = Xs[kk][tx * 4 + i];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int64_t n = n0 + ty * 4 + i;
      int col = tx * 4 + j;
      if (n < N && col < n_cols) out[out_row(col) * N + n] = acc[i][j];
    }
}

}  // namespace regolith::cuda
