// CUDA hyper-connection read/write (model-spec §4.2) and the PLE gate (§4.8.4). hc_read is the
// grouped norm, down projection + SiLU, up projection, sigmoid-weighted stream mix and inject
// weights. One token with four streams and matrices that have unit loaders (decode) runs it as
// two kernels, the norm folded into both by linearity: n = R·gamma·rinv_s on stream s, so a row's
// product with n is Σ_s rinv_s·(row·gamma·R over stream s). The first kernel takes down and inject
// rows and finds rinv_s along the way; the second takes up rows with the mix and forms n itself.
// Otherwise each step is a kernel over all tokens.
#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemv.cuh"

namespace regolith::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void scaled_silu_kernel(float* v, int64_t n, double inv_s) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<float>(silu_d(v[i] * inv_s));
}

// x[d, t] = (1/S) Σ_s sigmoid(m[s·H + d, t]) · n[s·H + d, t]
__global__ void hc_mix_kernel(const float* m, const float* nrm, int64_t H, int64_t S, int64_t T, float* x) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= H * T) return;
  int64_t d = i % H, t = i / H, W = H * S;
  double acc = 0;
  for (int64_t s = 0; s < S; ++s) acc += sigmoid_d(m[t * W + s * H + d]) * nrm[t * W + s * H + d];
  x[i] = static_cast<float>(acc / S);
}

__global__ void inject_weights_kernel(float* v, int64_t n, double inv_s) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<float>(2.0 * sigmoid_d(v[i] * inv_s));
}

__global__ void hc_write_kernel(float* R, const float* y, const float* iw, int64_t H, int64_t S, int64_t T) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t W = H * S;
  if (i >= W * T) return;
  int64_t t = i / W, c = i % W;
  R[i] = static_cast<float>(R[i] + static_cast<double>(iw[t * S + c / H]) * y[t * H + c % H]);
}

// The decode path: one token with four streams.
constexpr int kDecodeStreams = 4;
// Down/inject rows per block of the decode kernel: one gives r + 4 blocks (324 for 132 SMs), so
// each SM has a few blocks' loads in flight. On an H200 (H = 2560, Q8_0) that ran 8.2 µs, two rows
// per block (162 blocks, most SMs with one) 11.4 µs, despite reading R and gamma half as often.
constexpr int kDownRowsPerBlock = 1;
constexpr int kUpWarps = 4;  // positions per block of the up/mix kernel

// Stream (norm group) of position i of a W = 4·H row.
__device__ __forceinline__ int stream_of(int64_t i, int64_t H) { return (i >= H) + (i >= 2 * H) + (i >= 3 * H); }

// v[s] += a, with s known only at run time, without indexing a register array dynamically.
__device__ __forceinline__ void add_to_stream(float* v, int s, float a) {
#pragma unroll
  for (int k = 0; k < kDecodeStreams; ++k) v[k] += k == s ? a : 0.0f;
}

// A run of 8 activations: gr[i] = gamma[i]·R[i]; returns Σ R[i]².
__device__ __forceinline__ float load_scaled_run(const float* __restrict__ R, const float* __restrict__ gamma,
                                                 float* gr) {
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float4 x = reinterpret_cast<const float4*>(R)[i], g = reinterpret_cast<const float4*>(gamma)[i];
    const float xs[4] = {x.x, x.y, x.z, x.w}, gs[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) gr[4 * i + j] = gs[j] * xs[j], sq = fmaf(xs[j], xs[j], sq);
  }
  return sq;
}

// Decode: rows kRows·blockIdx.x + k of [down; inject] times the normed row n of R (W = 4·H), with
// n = R·gamma·rinv_s on stream s. Each thread sums, per stream, row·gamma·R and R² over its units;
// as the threads stride over all of R, every block finds rinv_s itself, and block 0 stores them for
// hc_up_mix_kernel. A run of 8 values lies in one stream (H % 8 == 0), but a unit's two runs need
// not (Q4_K's are 32 apart). Down rows give lo = silu(v/S), inject rows inject_w = 2·sigmoid(v/S).
template <typename U, int kRows>
__global__ void __launch_bounds__(128) hc_down_inject_kernel(const uint8_t* __restrict__ down,
                                                             const uint8_t* __restrict__ inject, uint64_t pitch,
                                                             int64_t H, int64_t r, const float* __restrict__ R,
                                                             const float* __restrict__ gamma, float eps,
                                                             float* __restrict__ lo, float* __restrict__ inject_w,
                                                             float* __restrict__ rinv_out) {
  constexpr int S = kDecodeStreams, kSumSq = kRows * S;  // sums[k·S + s]: row k's dot; sums[kSumSq + s]: Σ R²
  const int64_t W = S * H, i0 = static_cast<int64_t>(blockIdx.x) * kRows, n_rows = r + (inject ? S : 0);
  const uint8_t* rows[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int64_t row = i0 + k;
    rows[k] = row >= n_rows ? nullptr : row < r ? down + row * pitch : inject + (row - r) * pitch;
    if (rows[k]) prefetch_l2(rows[k], pitch);
  }
  grid_dependency_wait();
  float sums[kSumSq + S] = {};
  // One unit at a time: on an H200 that ran 8.3 µs against 9.6 µs for two units per step.
#pragma unroll 1
  for (int64_t u = threadIdx.x; u < W / kUnit; u += blockDim.x) {
    int64_t x0, x1;
    U::runs(u, x0, x1);
    const int s0 = stream_of(x0, H), s1 = stream_of(x1, H);
    float gr[16];
    // Once per unit, not per row, so that each value of R counts once.
    add_to_stream(sums + kSumSq, s0, load_scaled_run(R + x0, gamma + x0, gr));
    add_to_stream(sums + kSumSq, s1, load_scaled_run(R + x1, gamma + x1, gr + 8));
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      if (rows[k] == nullptr) continue;
      float w[16], d0 = 0.0f, d1 = 0.0f;
      U::load(rows[k], u, W, w);
#pragma unroll
      for (int i = 0; i < 8; ++i) d0 = fmaf(w[i], gr[i], d0), d1 = fmaf(w[8 + i], gr[8 + i], d1);
      add_to_stream(sums + k * S, s0, d0);
      add_to_stream(sums + k * S, s1, d1);
    }
  }
  block_reduce_to_first(sums);
  if (threadIdx.x != 0) return;
  double rinv[S];  // rsqrt in double: within an ulp of the reference's 1/sqrt, and quicker
#pragma unroll
  for (int s = 0; s < S; ++s) rinv[s] = rsqrt(static_cast<double>(sums[kSumSq + s]) / H + static_cast<double>(eps));
  if (blockIdx.x == 0)
#pragma unroll
    for (int s = 0; s < S; ++s) rinv_out[s] = static_cast<float>(rinv[s]);
  const double inv_s = 1.0 / S;
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int64_t row = i0 + k;
    double v = 0;
#pragma unroll
    for (int s = 0; s < S; ++s) v += rinv[s] * sums[k * S + s];
    if (row < r)
      lo[row] = static_cast<float>(silu_d(v * inv_s));
    else if (row < n_rows)
      inject_w[row - r] = static_cast<float>(2.0 * sigmoid_d(v * inv_s));
  }
}

// Decode: x[d] = (1/S) Σ_s sigmoid(up[s·H + d]·lo) · n[s·H + d], a warp per position d (four to a
// block; was a block per position), S = 4 streams, with n[s·H + d] = R·gamma·rinv_s (rinv from
// hc_down_inject_kernel). The up rows are prefetched into L2 before the wait on the previous kernel.
template <typename U>
__global__ void __launch_bounds__(128) hc_up_mix_kernel(const uint8_t* __restrict__ up, uint64_t pitch, int64_t r,
                                                        int64_t H, const float* __restrict__ lo,
                                                        const float* __restrict__ R, const float* __restrict__ gamma,
                                                        const float* __restrict__ rinv, float* __restrict__ x) {
  constexpr int S = kDecodeStreams;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (d >= H) return;
  const uint8_t* rows[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    rows[s] = up + (s * H + d) * pitch;
    prefetch_l2(rows[s], pitch, lane, 32);
  }
  grid_dependency_wait();
  float acc[S][1] = {};
  gemv_accumulate<U, S, 1>(rows, r, lo, r, 1, lane, 32, acc);
  float m[S];
#pragma unroll
  for (int s = 0; s < S; ++s) m[s] = warp_sum(acc[s][0]);
  if (lane != 0) return;
  double mix = 0;
#pragma unroll
  for (int s = 0; s < S; ++s) {
    const int64_t i = s * H + d;
    mix += sigmoid_d(m[s]) * (static_cast<double>(R[i]) * rinv[s] * gamma[i]);
  }
  x[d] = static_cast<float>(mix / S);
}

// One block per (token, stream).
__global__ void ple_gate_kernel(const float* key, const float* qry, const float* val, int64_t H, int64_t S,
                                float* out) {
  grid_dependency_wait();
  int64_t t = blockIdx.x, s = blockIdx.y, W = H * S;
  const float* k = key + t * W + s * H;
  const float* q = qry + t * W + s * H;
  double dot = 0;
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x) dot += static_cast<double>(k[d]) * q[d];
  double score = block_sum(dot) / sqrt(static_cast<double>(H));
  double ss = score == 0 ? 0.0 : copysign(sqrt(fmax(fabs(score), 1e-6)), score);
  double gate = sigmoid_d(ss);
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x) out[t * W + s * H + d] = static_cast<float>(gate * val[t * H + d]);
}

}  // namespace

void CudaBackend::hc_read(const HcReadArgs& a) {
  OpScope scope(profiler_, "hc_read", a.R->ne(1), stream_);
  check_hc_read(a);
  const Tensor& R = *a.R;
  int64_t S = a.n_streams, W = R.ne(0), T = R.ne(1), H = W / S, r = a.down->ne[1];
  if (T == 0) return;
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  // H % 8 == 0: no run of 8 activations straddles two streams.
  if (T == 1 && S == kDecodeStreams && H % 8 == 0 && has_unit_loader(down.type, W) && has_unit_loader(up.type, r) &&
      (!inject || (inject->type == down.type && inject->row_bytes == down.row_bytes))) {
    Tensor lo = scratch_f32(r), rinv = scratch_f32(kDecodeStreams);
    const float* gamma = values(*a.norm);
    const int64_t n_rows = r + (inject ? S : 0);
    dispatch_unit(down.type, [&](auto unit) {
      launch(stream_, "hc_down_inject_kernel", hc_down_inject_kernel<decltype(unit), kDownRowsPerBlock>, blocks_for(n_rows, kDownRowsPerBlock), gemv_threads(W / kUnit), 0, down.data, inject ? inject->data : nullptr, down.row_bytes, H, r, R.f32(), gamma, a.eps, lo.f32(), inject ? a.inject_w->f32() : nullptr, rinv.f32());
    });
    dispatch_unit(up.type, [&](auto unit) {
      launch(stream_, "hc_up_mix_kernel", hc_up_mix_kernel<decltype(unit)>, blocks_for(H, kUpWarps), 32 * kUpWarps, 0, up.data, up.row_bytes, r, H, lo.f32(), R.f32(), gamma, rinv.f32(), a.x->f32());
    });
    return;
  }
  Tensor n = scratch_f32(W * T).reshaped({W, T, 1, 1}), lo = scratch_f32(r * T);
  rms_norm(R, a.norm, H, a.eps, n);  // grouped: one gamma per position of the W-wide row
  Tensor m = scratch_f32(W * T);
  matmul(down, n.f32(), T, lo.f32());
  launch(stream_, "scaled_silu_kernel", scaled_silu_kernel, blocks_for(r * T, kThreads), kThreads, 0, lo.f32(), r * T, 1.0 / S);
  matmul(up, lo.f32(), T, m.f32());
  launch(stream_, "hc_mix_kernel", hc_mix_kernel, blocks_for(H * T, kThreads), kThreads, 0, m.f32(), n.f32(), H, S, T, a.x->f32());
  if (a.inject) {
    matmul(*inject, n.f32(), T, a.inject_w->f32());
    launch(stream_, "inject_weights_kernel", inject_weights_kernel, blocks_for(S * T, kThreads), kThreads, 0, a.inject_w->f32(), S * T, 1.0 / S);
  }
}

void CudaBackend::hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) {
  OpScope scope(profiler_, "hc_write", y.ne(1), stream_);
  check_hc_write(R, y, inject_w);
  int64_t W = R.ne(0), T = R.ne(1), H = y.ne(0), S = inject_w.ne(0);
  if (W * T == 0) return;
  launch(stream_, "hc_write_kernel", hc_write_kernel, blocks_for(W * T, kThreads), kThreads, 0, R.f32(), y.f32(), inject_w.f32(), H, S, T);
}

void CudaBackend::ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) {
  OpScope scope(profiler_, "ple_gate", val.ne(1), stream_);
  check_ple_gate(key, qry, val, n_streams, out);
  int64_t T = key.ne(1), H = val.ne(0);
  if (n_streams * T == 0) return;
  dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(n_streams));
  launch(stream_, "ple_gate_kernel", ple_gate_kernel, grid, 128, 0, key.f32(), qry.f32(), val.f32(), H, n_streams, out.f32());
}

}  // namespace regolith::cuda
