// Shared pieces of the CUDA op files: error checks that throw regolith::Error, shape checks with
// the reference backend's messages, launch geometry, and block/warp reductions.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"

namespace regolith::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda: ", what, ": ", cudaGetErrorString(e));
}

// Called once by every kernel before it touches memory the previous kernel of the stream may write
// (tests/ops/cuda_kernels_wait.py checks the call): with programmatic dependent launch
// (cuda_launch.cuh) it waits until that kernel has completed and its writes are visible, then lets
// the next kernel be scheduled; without it both are no-ops. So a kernel is scheduled only once
// every block of the kernel before it has passed this wait, when everything earlier is complete:
// before it, a kernel may load weights and what the kernels before the previous one wrote (a
// kernel that does says why it knows its predecessor), never what the previous one writes.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for the bytes [p, p + bytes) without waiting for them: one prefetch per 128-byte line,
// spread over threads first, first + stride, .... Weights do not depend on the previous kernel, so
// a kernel may prefetch its rows before grid_dependency_wait() and fetch them while its predecessor
// finishes; after it, a prefetch puts all of a group's rows in flight at once.
__device__ __forceinline__ void prefetch_l2(const void* p, uint64_t bytes, int first = threadIdx.x,
                                            int stride = blockDim.x) {
  const uint64_t begin = reinterpret_cast<uint64_t>(p) / 128, end = (reinterpret_cast<uint64_t>(p) + bytes + 127) / 128;
  for (uint64_t line = begin + first; line < end; line += stride) asm volatile("prefetch.L2 [%0];" ::"l"(line * 128));
}

// Asks L2 for [p, p + bytes) by one bulk request (sm_90's cp.async.bulk.prefetch.L2, which the
// copy engine splits into lines), issued by the calling thread alone; the range is rounded inward
// to 16 bytes. Elsewhere, by this thread's line prefetches.
__device__ __forceinline__ void bulk_prefetch_l2(const void* p, uint64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t begin = (reinterpret_cast<uint64_t>(p) + 15) & ~uint64_t{15};
  const uint64_t end = (reinterpret_cast<uint64_t>(p) + bytes) & ~uint64_t{15};
  if (end > begin)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin), "r"(static_cast<uint32_t>(end - begin)) : "memory");
#else
  prefetch_l2(p, bytes, 0, 1);
#endif
}

// Opts a kernel into `bytes` of dynamic shared memory (more than the default 48 KB) and the largest
// shared-memory carveout, so that several of its blocks share an SM; call once per kernel before
// its first launch (e.g. from a function-local static).
template <typename Kernel>
bool allow_max_shared(Kernel kernel, size_t bytes, const char* name) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), name);
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
        name);
  return true;
}

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// Blocks over the n values of a token (x) by tokens (y), for elementwise kernels over T tokens that
// find their value and token without dividing a flat index (a 64-bit division costs dozens of
// instructions: prefill's conv and HC kernels spent most of their time on it). The kernels loop t
// from blockIdx.y in steps of gridDim.y, as y is limited to 65535.
inline dim3 per_token_grid(int64_t n, int64_t T, int threads) {
  return dim3(blocks_for(n, threads), static_cast<unsigned>(T < 65535 ? T : 65535));
}

// BF16 bits to FP32, and FP32 to BF16 bits rounded to nearest, ties to even (as core/half.h).
__device__ __forceinline__ float bf16(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
__device__ __forceinline__ uint16_t bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// A residual value after the write R += w·y (in FP64, as the reference).
__device__ __forceinline__ float written(float r, float w, float y) { return static_cast<float>(r + static_cast<double>(w) * y); }

__device__ __forceinline__ double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ double silu_d(double x) { return x * sigmoid_d(x); }
// The same in FP32 (expf and a division: a fifth of the FP64 chain's latency).
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_f(float x) { return x * sigmoid_f(x); }
// A causal conv's output from its FP64 tap sum, the SiLU in FP32 (an FP64 exp and division a value
// took the FP64 pipe in prefill's conv: 84 M values a GDN layer at 8K tokens). Every conv kernel
// takes this, so decode steps and prefill runs agree bit for bit.
__device__ __forceinline__ float conv_silu(double sum) { return silu_f(static_cast<float>(sum)); }

// RoPE inverse frequencies computed on the host exactly as the reference does (FP32 pow), so the
// FP32 angles inv_freq·pos agree bit for bit.
inline std::vector<float> rope_inv_freq(int64_t n_rot, float theta) {
  std::vector<float> f(static_cast<size_t>(n_rot / 2));
  for (int64_t i = 0; i < n_rot / 2; ++i)
    f[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(n_rot));
  return f;
}

// Rotates pair (i, i + half) of one head in place: NeoX RoPE with FP32 angle, cos/sin rounded
// to FP32 and the rotation in FP64 (ref_util.h rope_head). rope_angle and rotate_pair are its two
// halves, for a kernel that knows the angle before its inputs.
__device__ __forceinline__ void rope_angle(float inv_freq, int64_t pos, double& c, double& s) {
  const float ang = inv_freq * static_cast<float>(pos);
  c = static_cast<float>(cos(static_cast<double>(ang)));
  s = static_cast<float>(sin(static_cast<double>(ang)));
}
__device__ __forceinline__ void rotate_pair(float* x, int64_t i, int64_t half, double c, double s) {
  const double x1 = x[i], x2 = x[i + half];
  x[i] = static_cast<float>(x1 * c - x2 * s);
  x[i + half] = static_cast<float>(x2 * c + x1 * s);
}
__device__ __forceinline__ void rope_pair(float* x, int64_t i, int64_t half, float inv_freq, int64_t pos) {
  double c, s;
  rope_angle(inv_freq, pos, c, s);
  rotate_pair(x, i, half, c, s);
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < n_warps; ++w) total += partial[w];
  return total;
}

// 1/sqrt(mean(x²) + eps) from the sum of the n squares, in FP64.
__device__ __forceinline__ double inv_rms(double sum_squares, int64_t n, float eps) {
  return 1.0 / sqrt(sum_squares / n + static_cast<double>(eps));
}

// 1/sqrt(mean(x²) + eps) over x[0 .. n), by the whole block (FP64 partial sums a thread, then
// block_sum): the RMSNorm scale of rms_norm_kernel and of the fused ops that norm as it does. x is
// read through L2, so a caller may norm values that other blocks of its kernel wrote.
__device__ __forceinline__ double block_inv_rms(const float* x, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double v = __ldcg(x + i);
    ss += v * v;
  }
  return inv_rms(block_sum(ss), n, eps);
}

// Counts the calling block (every thread calls) as one of `blocks` finished on *counter and returns
// to every thread whether it was the last; the last block sees what the others wrote before they
// counted and sets the counter back to zero. One thread fences, after the barrier that orders the
// block's writes before it, and again after the count, as cooperative groups' grid sync does.
__device__ __forceinline__ bool last_block_to_finish(unsigned* counter, unsigned blocks) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counter, 1u) == blocks - 1;
    __threadfence();
    if (last) *counter = 0;
  }
  __syncthreads();
  return last;
}

// The columns ops (causal_conv_columns, gdn_core_columns): one token each of several sequences,
// each with its own state, at most kMaxColumns a launch. The state pointers travel as a kernel
// parameter (no upload, and a step graph updates them as it updates any parameter).
constexpr int kMaxColumns = 8;
template <typename T>
struct ColumnPointers {
  T* p[kMaxColumns] = {};
  // p[i] by constant indices: a parameter array indexed at run time would be copied to local memory.
  __device__ __forceinline__ T* at(unsigned i) const {
    T* v = p[0];
#pragma unroll
    for (unsigned k = 1; k < kMaxColumns; ++k)
      if (i == k) v = p[k];
    return v;
  }
};

// Runs launch(first, count, pointers) for each group of at most kMaxColumns of `columns`, in order:
// pointers.p[b] = data(*columns[first + b]).
template <typename T, typename Data, typename Launch>
void for_each_column_group(std::span<Tensor* const> columns, Data data, Launch launch) {
  for (size_t first = 0; first < columns.size(); first += kMaxColumns) {
    const size_t count = std::min<size_t>(kMaxColumns, columns.size() - first);
    ColumnPointers<T> pointers;
    for (size_t b = 0; b < count; ++b) pointers.p[b] = data(*columns[first + b]);
    launch(first, count, pointers);
  }
}

template <typename T>
__device__ T block_max(T v) {
  __shared__ T partial[32];
  int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T m = partial[0];
  for (int w = 1; w < n_warps; ++w) m = max(m, partial[w]);
  return m;
}

}  // namespace regolith::cuda
