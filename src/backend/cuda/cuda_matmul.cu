// out [N, T] = W·x with W in any decodable weight type (cuda_quant.cuh), FP32 accumulation.
// Few tokens (decode): types with a unit loader take the coalesced kernel of cuda_gemv.cuh (R rows
// per block); the others a warp per output row, each lane decoding 32-value chunks. More tokens
// (prefill): 64×64 output tiles (cuda_gemm.cuh).
#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace regolith::cuda {

namespace {

constexpr int kMatvecWarps = 4;

template <typename D, int TB>
__global__ void matvec_kernel(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t N,
                              const float* __restrict__ x, int T, float* __restrict__ out) {
  int64_t n = static_cast<int64_t>(blockIdx.x) * kMatvecWarps + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (n >= N) return;
  const uint8_t* row = W + n * row_bytes;
  int64_t n_chunks = (K + 31) / 32;
  float acc[TB];
#pragma unroll
  for (int t = 0; t < TB; ++t) acc[t] = 0.0f;
  for (int64_t c = lane; c < n_chunks; c += 32) {
    float w[32];
    D::chunk(row, c, K, w);
    int64_t k0 = c * 32;
    int valid = static_cast<int>(K - k0 < 32 ? K - k0 : 32);
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      if (t < T) {
        const float* xr = x + t * K + k0;
        float s = 0.0f;
        if (valid == 32) {
#pragma unroll
          for (int j = 0; j < 32; ++j) s += w[j] * xr[j];
        } else {
          for (int j = 0; j < valid; ++j) s += w[j] * xr[j];
        }
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TB; ++t) {
    float s = warp_sum(acc[t]);
    if (lane == 0 && t < T) out[t * N + n] = s;
  }
}

// Rows n0 .. n0+R-1 of W (n0 = R·blockIdx.x) times T <= TB tokens.
template <typename U, int R, int TB>
__global__ void __launch_bounds__(128) gemv_kernel(const uint8_t* __restrict__ W, uint64_t pitch, int64_t K, int64_t N,
                                                   const float* __restrict__ x, int T, float* __restrict__ out) {
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * R;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = n0 + r < N ? W + (n0 + r) * pitch : nullptr;
  float acc[R][TB] = {};
  gemv_accumulate<U, R, TB>(rows, K, x, K, T, threadIdx.x, blockDim.x, acc);
  float sums[R * TB];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TB; ++t) sums[r * TB + t] = acc[r][t];
  block_reduce_to_first(sums);
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TB; ++t)
      if (n0 + r < N && t < T) out[t * N + n0 + r] = sums[r * TB + t];
}

template <typename U, int R, int TB>
void launch_gemv(const DeviceMatrix& w, const float* x, int T, float* out, cudaStream_t stream) {
  gemv_kernel<U, R, TB><<<blocks_for(w.n_rows, R), gemv_threads(w.K / kUnit), 0, stream>>>(w.data, w.row_bytes, w.K,
                                                                                        w.n_rows, x, T, out);
  check_launch("gemv_kernel");
}

// Decode products through the unit loaders: one pass for up to 4 tokens, passes of 4 beyond.
template <typename U>
void gemv(const DeviceMatrix& w, const float* x, int64_t T, float* out, cudaStream_t stream) {
  if (T == 1) return launch_gemv<U, 4, 1>(w, x, 1, out, stream);
  if (T == 2) return launch_gemv<U, 2, 2>(w, x, 2, out, stream);
  for (int64_t t0 = 0; t0 < T; t0 += 4)
    launch_gemv<U, 2, 4>(w, x + t0 * w.K, static_cast<int>(std::min<int64_t>(4, T - t0)), out + t0 * w.n_rows, stream);
}

template <typename D>
__global__ void __launch_bounds__(kGemmThreads) gemm_kernel(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K,
                                                            int64_t N, const float* __restrict__ x, int64_t T,
                                                            float* __restrict__ out) {
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kGemmTile;
  gemm_tile<D>(W, row_bytes, K, N, static_cast<int64_t>(blockIdx.x) * kGemmTile, T - t0 < kGemmTile ? T - t0 : kGemmTile, x,
               [=](int tt) { return t0 + tt; }, out, [=](int tt) { return t0 + tt; });
}

template <typename D>
void launch_matmul(const DeviceMatrix& w, const float* x, int64_t T, float* out, cudaStream_t stream) {
  const int64_t N = w.n_rows, K = w.K;
  if (T <= kMatvecMaxTokens) {
    dim3 grid(blocks_for(N, kMatvecWarps)), block(32 * kMatvecWarps);
    int t = static_cast<int>(T);
    if (T == 1)
      matvec_kernel<D, 1><<<grid, block, 0, stream>>>(w.data, w.row_bytes, K, N, x, t, out);
    else if (T == 2)
      matvec_kernel<D, 2><<<grid, block, 0, stream>>>(w.data, w.row_bytes, K, N, x, t, out);
    else if (T <= 4)
      matvec_kernel<D, 4><<<grid, block, 0, stream>>>(w.data, w.row_bytes, K, N, x, t, out);
    else
      matvec_kernel<D, 8><<<grid, block, 0, stream>>>(w.data, w.row_bytes, K, N, x, t, out);
    check_launch("matvec_kernel");
  } else {
    dim3 grid(blocks_for(N, kGemmTile), blocks_for(T, kGemmTile));
    gemm_kernel<D><<<grid, kGemmThreads, 0, stream>>>(w.data, w.row_bytes, K, N, x, T, out);
    check_launch("gemm_kernel");
  }
}

}  // namespace

void CudaBackend::matmul(const DeviceMatrix& w, const float* x, int64_t T, float* out) {
  if (T == 0 || w.n_rows == 0) return;
  if (T <= kMatvecMaxTokens && has_unit_loader(w.type, w.K)) {
    dispatch_unit(w.type, [&](auto unit) { gemv<decltype(unit)>(w, x, T, out, stream_); });
    return;
  }
  bool ok = dispatch_weight_type(w.type, [&](auto dq) { launch_matmul<decltype(dq)>(w, x, T, out, stream_); });
  if (!ok) fail("cuda matmul: no decoder for ", type_name(w.type));
}

void CudaBackend::mul_mat(const Weight& w, const Tensor& x, Tensor& out) {
  int64_t K = w.ne[0], N = w.ne[1], T = x.ne(1);
  if (w.ne[2] != 1 || w.ne[3] != 1) fail("mul_mat: ", w.name, " is not a matrix");
  expect_shape(x, {K, T, 1, 1}, "mul_mat", "x");
  expect_shape(out, {N, T, 1, 1}, "mul_mat", "out");
  matmul(matrix(w), x.f32(), T, out.f32());
}

}  // namespace regolith::cuda
