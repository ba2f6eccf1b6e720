// CUDA hyper-connection read/write (model-spec §4.2) and the PLE gate (§4.8.4). hc_read is the
// grouped norm, down projection + SiLU, up projection, sigmoid-weighted stream mix and inject
// weights. One token with four streams and matrices that have unit loaders (decode) runs it as
// one kernel, the norm folded in by linearity: n = R·gamma·rinv_s on stream s, so a row's product
// with n is Σ_s rinv_s·(row·gamma·R over stream s). Phase 1 takes down and inject rows a stream at
// a time (those per-stream dots, and Σ R² per stream); after a grid barrier, phase 2 combines them
// into lo and the inject weights, then takes up rows with the mix and forms n itself. A launch
// costs more than the barrier: each is a chain of dependent memory round trips, and the up rows
// are fetched into L2 before the kernel starts. A pending write (hc_write_read) rides along: both
// phases read R + w_s·y where they read R, and phase 2, the last to read R, stores it.
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

// A residual value after the write R += w·y (in FP64, as the reference).
__device__ __forceinline__ float written(float r, float w, float y) { return static_cast<float>(r + static_cast<double>(w) * y); }

__global__ void hc_write_kernel(float* R, const float* y, const float* iw, int64_t H, int64_t S, int64_t T) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t W = H * S;
  if (i >= W * T) return;
  int64_t t = i / W, c = i % W;
  R[i] = written(R[i], iw[t * S + c / H], y[t * H + c % H]);
}

// The decode path: one token with four streams, one kernel in two phases with a grid barrier.
constexpr int kDecodeStreams = 4;
constexpr int kDecodeThreads = 512;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDownRows = 4;         // down/inject rows of a phase-1 item
constexpr int kDownMaxThreads = 256;  // threads of a phase-1 group (a stream's units, balanced_threads)
constexpr int kUpPositions = 2;      // positions of a phase-2 warp: 2 × 4 streams = 8 up rows
constexpr size_t kDecodeMaxLoBytes = 32 * 1024;  // lo in shared memory, within the 48 KB default

// A run of 8 activations, R[i] after the pending write w·y[i] when y is set: gr[i] = gamma[i]·R[i];
// returns Σ R[i]².
__device__ __forceinline__ float load_scaled_run(const float* __restrict__ R, const float* __restrict__ gamma,
                                                 const float* __restrict__ y, float w, float* gr) {
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float4 x = reinterpret_cast<const float4*>(R)[i], g = reinterpret_cast<const float4*>(gamma)[i];
    float xs[4] = {x.x, x.y, x.z, x.w};
    const float gs[4] = {g.x, g.y, g.z, g.w};
    if (y) {
      const float4 v = reinterpret_cast<const float4*>(y)[i];
      const float ys[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) xs[j] = written(xs[j], w, ys[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) gr[4 * i + j] = gs[j] * xs[j], sq = fmaf(xs[j], xs[j], sq);
  }
  return sq;
}

// The arguments of the decode kernel.
struct HcDecodeArgs {
  const uint8_t *down, *inject, *up;  // inject may be null
  uint64_t down_pitch, up_pitch;
  int64_t H, r, n_rows;  // n_rows: r down rows, then the inject rows
  float eps;
  float* R;
  const float *y, *write_w;  // the pending write R += write_w[s]·y, or null
  const float* gamma;
  float* part;   // [S, n_rows]: phase 1's per-stream dots
  float* sumsq;  // [S]
  float* x;
  float* inject_w;  // null without inject
  unsigned* barrier;  // two counters at zero
  int group_threads, groups;  // phase 1: groups of a block, each of group_threads threads
};

// Waits until every block of the grid has called it once; leaves both counters at zero again (the
// last block out resets them, after every block has seen the count complete).
__device__ void grid_barrier(unsigned* counters) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counters, 1u);
    unsigned arrived;
    do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(arrived) : "l"(counters) : "memory");
    while (arrived < gridDim.x);
    if (atomicAdd(counters + 1, 1u) == gridDim.x - 1) counters[0] = 0, counters[1] = 0;
  }
  __syncthreads();
}

// Phase 1, split by stream: with n = R·gamma·rinv_s on stream s, a row's product with n is
// Σ_s rinv_s·dot_s, dot_s = row·gamma·R over stream s. Item (s, i0) finds dot_s of rows i0 ..
// i0 + kDownRows of [down; inject] over the units of stream s (units_follow_streams), by one group
// of the block (thread t of it): a quarter of R and gamma a group. part[s·n_rows + row] = dot_s;
// item (s, 0) stores Σ R² over stream s. With y set, R is read as R + write_w[s]·y.
template <typename U>
__device__ void down_inject_item(const HcDecodeArgs& a, int64_t item, int t, float (&partial)[kDecodeWarps][kDownRows + 1]) {
  const int64_t row_groups = (a.n_rows + kDownRows - 1) / kDownRows;
  const bool active = item < kDecodeStreams * row_groups && t < a.group_threads;
  const int64_t s = active ? item / row_groups : 0, i0 = active ? item % row_groups * kDownRows : 0;
  float sums[kDownRows + 1] = {};  // the rows' dots, then Σ R²
  if (active) {
    const uint8_t* rows[kDownRows];
#pragma unroll
    for (int k = 0; k < kDownRows; ++k) {
      const int64_t row = i0 + k;
      rows[k] = row >= a.n_rows ? nullptr : row < a.r ? a.down + row * a.down_pitch : a.inject + (row - a.r) * a.down_pitch;
    }
    const uint8_t* src[kDownRows];
    rows_to_fetch(rows, src);  // row i0 is present in every item
    const int64_t H = a.H, u_end = (s + 1) * H / kUnit;
    const float w = a.y ? a.write_w[s] : 0.0f;
    const float* ys = a.y ? a.y - s * H : nullptr;  // ys[i]: y at position i of stream s
#pragma unroll 1
    for (int64_t u = s * H / kUnit + t; u < u_end; u += a.group_threads) {
      typename U::Raw raw[kDownRows];
#pragma unroll
      for (int k = 0; k < kDownRows; ++k) raw[k] = U::fetch(src[k], u, kDecodeStreams * H);
      int64_t x0, x1;
      U::runs(u, x0, x1);
      float gr[16];
      sums[kDownRows] += load_scaled_run(a.R + x0, a.gamma + x0, ys ? ys + x0 : nullptr, w, gr) +
                         load_scaled_run(a.R + x1, a.gamma + x1, ys ? ys + x1 : nullptr, w, gr + 8);
      const typename U::Sums gr_sums = U::sums(gr);
#pragma unroll
      for (int k = 0; k < kDownRows; ++k) sums[k] += U::dot(raw[k], u, gr, gr_sums);
    }
  }
  // Each group is whole warps: warp sums, then the group's first thread adds its warps.
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int k = 0; k <= kDownRows; ++k) sums[k] = warp_sum(sums[k]);
  __syncthreads();  // partial[] may still be read for the previous item
  if (lane == 0)
#pragma unroll
    for (int k = 0; k <= kDownRows; ++k) partial[warp][k] = sums[k];
  __syncthreads();
  if (!active || t != 0) return;
  const int first_warp = warp, n_warps = a.group_threads / 32;
#pragma unroll
  for (int k = 0; k <= kDownRows; ++k) {
    float v = partial[first_warp][k];
    for (int w = 1; w < n_warps; ++w) v += partial[first_warp + w][k];
    sums[k] = v;
  }
#pragma unroll
  for (int k = 0; k < kDownRows; ++k)
    if (i0 + k < a.n_rows) a.part[s * a.n_rows + i0 + k] = sums[k];
  if (i0 == 0) a.sumsq[s] = sums[kDownRows];
}

// Phase 2: x[d] = (1/S) Σ_s sigmoid(up[s·H + d]·lo) · n[s·H + d], S = 4 streams, n[s·H + d] =
// R·gamma·rinv_s, a warp for kUpPositions positions (their 4·kUpPositions up rows read together).
// Lane 4p + s forms stream s's term of position p (after the pending write, which it stores) and
// lane 4p adds the four in stream order.
template <typename U>
__device__ void up_mix_warp(const HcDecodeArgs& a, int64_t d0, const float* lo, const double (&rinv)[kDecodeStreams]) {
  constexpr int S = kDecodeStreams, kRows = S * kUpPositions;
  const int lane = threadIdx.x % 32;
  const uint8_t* rows[kRows];
#pragma unroll
  for (int p = 0; p < kUpPositions; ++p)
#pragma unroll
    for (int s = 0; s < S; ++s) rows[p * S + s] = d0 + p < a.H ? a.up + (s * a.H + d0 + p) * a.up_pitch : nullptr;
  // Lane l < kRows: position d0 + l / S, stream l % S; its R, gamma and y load beside the rows.
  const int ls = lane % S;
  const int64_t d = d0 + lane / S, i = ls * a.H + d;
  const bool mine = lane < kRows && d < a.H;
  float Ri = 0.0f, g = 0.0f;
  if (mine) {
    Ri = a.R[i], g = a.gamma[i];
    if (a.y) Ri = written(Ri, a.write_w[ls], a.y[d]);
  }
  float acc[kRows][1] = {};
  gemv_accumulate<U, kRows, 1>(rows, a.r, FloatX{lo, a.r}, 1, lane, 32, acc);
  float m = 0.0f;  // this lane's row product
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const float v = warp_sum(acc[k][0]);
    if (lane == k) m = v;
  }
  double rinv_mine = rinv[0];
#pragma unroll
  for (int s = 1; s < S; ++s)
    if (ls == s) rinv_mine = rinv[s];
  const double term = mine ? sigmoid_d(m) * (static_cast<double>(Ri) * rinv_mine * g) : 0.0;
  if (mine && a.y) a.R[i] = Ri;
  double terms[S];
#pragma unroll
  for (int s = 0; s < S; ++s) terms[s] = __shfl_sync(0xffffffffu, term, (lane & ~(S - 1)) + s);
  if (!mine || ls != 0) return;
  double mix = 0;
#pragma unroll
  for (int s = 0; s < S; ++s) mix += terms[s];
  a.x[d] = static_cast<float>(mix / S);
}

// One token's hc_read (model-spec §4.2) in one kernel, down, inject and up rows of unit type U. Phase 1 (down/inject dots a stream at a
// time) and phase 2 (lo, the inject weights, up rows and the mix) meet at a grid barrier, so the
// grid is at most one block an SM: every block is resident by the time any waits there (the next
// kernel is scheduled only after all of this one's blocks passed grid_dependency_wait). Every
// block prefetches its rows of both phases before waiting on the previous kernel.
template <typename U>
__global__ void __launch_bounds__(kDecodeThreads, 1) hc_read_decode_kernel(const HcDecodeArgs a) {
  constexpr int S = kDecodeStreams;
  __shared__ float partial[kDecodeWarps][kDownRows + 1];
  extern __shared__ __align__(16) float lo[];  // [r]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = threadIdx.x / a.group_threads;
  const int t = threadIdx.x % a.group_threads;
  const int64_t row_groups = (a.n_rows + kDownRows - 1) / kDownRows, n_items = S * row_groups;
  const int64_t item_stride = static_cast<int64_t>(gridDim.x) * a.groups;
  const int64_t position_stride = static_cast<int64_t>(gridDim.x) * kDecodeWarps * kUpPositions;
  {  // prefetch: the first item's rows (a stream's share) and the first positions' up rows
    const int64_t item = static_cast<int64_t>(blockIdx.x) * a.groups + group;
    if (group < a.groups && item < n_items) {
      const int64_t s = item / row_groups, i0 = item % row_groups * kDownRows;
      for (int64_t row = i0; row < min(i0 + kDownRows, a.n_rows); ++row) {
        const uint8_t* base = row < a.r ? a.down + row * a.down_pitch : a.inject + (row - a.r) * a.down_pitch;
        prefetch_l2(base + s * a.down_pitch / S, a.down_pitch / S, t, a.group_threads);
      }
    }
    const int64_t d0 = (static_cast<int64_t>(blockIdx.x) * kDecodeWarps + warp) * kUpPositions;
    for (int64_t d = d0; d < min(d0 + kUpPositions, a.H); ++d)
      for (int s = 0; s < S; ++s) prefetch_l2(a.up + (s * a.H + d) * a.up_pitch, a.up_pitch, lane, 32);
  }
  grid_dependency_wait();
  const int64_t rounds = (n_items + item_stride - 1) / item_stride;  // the same in every block
  for (int64_t k = 0; k < rounds; ++k) {
    const int64_t item = k * item_stride + static_cast<int64_t>(blockIdx.x) * a.groups + group;
    down_inject_item<U>(a, group < a.groups ? item : n_items, t, partial);
  }
  grid_barrier(a.barrier);
  // lo = silu(Σ_s rinv_s·part_s / S) from every block's dots (read past L1: other blocks wrote them).
  double rinv[S];  // rsqrt in double: within an ulp of the reference's 1/sqrt, and quicker
#pragma unroll
  for (int s = 0; s < S; ++s) rinv[s] = rsqrt(static_cast<double>(__ldcg(a.sumsq + s)) / a.H + static_cast<double>(a.eps));
  const auto mixed_row = [&](int64_t row) {
    double v = 0;
#pragma unroll
    for (int s = 0; s < S; ++s) v += rinv[s] * __ldcg(a.part + s * a.n_rows + row);
    return v / S;
  };
  for (int64_t i = threadIdx.x; i < a.r; i += blockDim.x) lo[i] = static_cast<float>(silu_d(mixed_row(i)));
  if (blockIdx.x == 0 && a.inject_w && threadIdx.x < a.n_rows - a.r)
    a.inject_w[threadIdx.x] = static_cast<float>(2.0 * sigmoid_d(mixed_row(a.r + threadIdx.x)));
  __syncthreads();
  for (int64_t d0 = (static_cast<int64_t>(blockIdx.x) * kDecodeWarps + warp) * kUpPositions; d0 < a.H; d0 += position_stride)
    up_mix_warp<U>(a, d0, lo, rinv);
}

// Whether the units of a W = 4·H row (cuda_gemv.cuh) fall in streams in order: those of stream s
// are [s·H/16, (s + 1)·H/16). Q4_K's units cover their 256-value block; the others 16 values.
bool units_follow_streams(GgmlType type, int64_t H) { return H % (type == GgmlType::Q4_K ? 256 : kUnit) == 0; }

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

// Whether hc_read of a runs as the decode kernel.
bool CudaBackend::hc_read_decodes(const HcReadArgs& a) {
  const int64_t S = a.n_streams, W = a.R->ne(0), H = W / S, r = a.down->ne[1];
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  return a.R->ne(1) == 1 && S == kDecodeStreams && has_unit_loader(down.type, W) && units_follow_streams(down.type, H) &&
         up.type == down.type && has_unit_loader(up.type, r) && r * sizeof(float) <= kDecodeMaxLoBytes &&
         (!inject || (inject->type == down.type && inject->row_bytes == down.row_bytes));
}

// The decode kernel of hc_read, after the write R += write_w ⊙ y when y is set.
void CudaBackend::hc_read_decode(const HcReadArgs& a, const float* y, const float* write_w) {
  const int64_t S = a.n_streams, W = a.R->ne(0), H = W / S, r = a.down->ne[1];
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  const int64_t n_rows = r + (inject ? S : 0);
  Tensor part = scratch_f32(S * n_rows), sumsq = scratch_f32(S);
  const int group_threads = balanced_threads(H / kUnit, kDownMaxThreads);
  const HcDecodeArgs args{.down = down.data, .inject = inject ? inject->data : nullptr, .up = up.data,
                          .down_pitch = down.row_bytes, .up_pitch = up.row_bytes, .H = H, .r = r, .n_rows = n_rows,
                          .eps = a.eps, .R = a.R->f32(), .y = y, .write_w = write_w, .gamma = values(*a.norm),
                          .part = part.f32(), .sumsq = sumsq.f32(), .x = a.x->f32(),
                          .inject_w = inject ? a.inject_w->f32() : nullptr, .barrier = counters(2),
                          .group_threads = group_threads, .groups = kDecodeThreads / group_threads};
  dispatch_unit(down.type, [&](auto unit) {
    launch(stream_, "hc_read_decode_kernel", hc_read_decode_kernel<decltype(unit)>, multiprocessor_count(), kDecodeThreads, r * sizeof(float), args);
  });
}

void CudaBackend::hc_write_read(Tensor& R, const Tensor& y, const Tensor& inject_w, const HcReadArgs& a) {
  check_hc_write_read(R, y, inject_w, a);
  if (!hc_read_decodes(a)) return Backend::hc_write_read(R, y, inject_w, a);
  OpScope scope(profiler_, "hc_write_read", R.ne(1), stream_);
  hc_read_decode(a, y.f32(), inject_w.f32());
}

void CudaBackend::hc_read(const HcReadArgs& a) {
  OpScope scope(profiler_, "hc_read", a.R->ne(1), stream_);
  check_hc_read(a);
  const Tensor& R = *a.R;
  int64_t S = a.n_streams, W = R.ne(0), T = R.ne(1), H = W / S, r = a.down->ne[1];
  if (T == 0) return;
  if (hc_read_decodes(a)) return hc_read_decode(a, nullptr, nullptr);
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  Tensor n = scratch_f32(W * T).reshaped({W, T, 1, 1}), lo = scratch_f32(r * T);
  rms_norm(R, a.norm, H, a.eps, n);  // grouped: one gamma per position of the W-wide row
  Tensor m = scratch_f32(W * T);
  // The down and inject products read the same n (quantized once for the int8 tile).
  const DeviceMatrix* reads_n[] = {&down, inject};
  float* n_products[] = {lo.f32(), inject ? a.inject_w->f32() : nullptr};
  matmul_shared(std::span(reads_n, inject ? 2 : 1), n.f32(), W, T, std::span(n_products, inject ? 2 : 1));
  launch(stream_, "scaled_silu_kernel", scaled_silu_kernel, blocks_for(r * T, kThreads), kThreads, 0, lo.f32(), r * T, 1.0 / S);
  matmul(up, lo.f32(), T, m.f32());
  launch(stream_, "hc_mix_kernel", hc_mix_kernel, blocks_for(H * T, kThreads), kThreads, 0, m.f32(), n.f32(), H, S, T, a.x->f32());
  if (a.inject)
    launch(stream_, "inject_weights_kernel", inject_weights_kernel, blocks_for(S * T, kThreads), kThreads, 0, a.inject_w->f32(), S * T, 1.0 / S);
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
