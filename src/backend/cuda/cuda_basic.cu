// CUDA generic ops: row gather, elementwise, norms, RoPE, dilated causal conv. Each mirrors the
// reference's arithmetic (FP64 where ref uses FP64) so results differ from it only by rounding.
#include <vector>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "core/parallel.h"
#include "quant/rows.h"

namespace regolith::cuda {

namespace {

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

// The larger of two (value, index) pairs, the smaller index of equal values: std::max_element's
// choice whatever order the pairs are met in. index == N marks no value yet.
struct ArgmaxPair {
  float v;
  int64_t i;
};
__device__ __forceinline__ ArgmaxPair larger(ArgmaxPair a, ArgmaxPair b, int64_t N) {
  if (b.i == N) return a;
  return a.i == N || b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a;
}

constexpr int kArgmaxThreads = 1024;

// One block a column t of x [N, T]: each thread takes rows thread, thread + 1024, ... (with kQuads,
// runs of four rows as one load: a vocabulary's column in a quarter of the loads); then the warps'
// pairs, then the block's.
template <bool kQuads>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* x, int64_t N, int32_t* ids) {
  grid_dependency_wait();
  const float* col = x + static_cast<int64_t>(blockIdx.x) * N;
  ArgmaxPair best{0.0f, N};
  if constexpr (kQuads) {
#pragma unroll 4
    for (int64_t q = threadIdx.x; q < N / 4; q += kArgmaxThreads) {
      const float4 v = reinterpret_cast<const float4*>(col)[q];
      best = larger(larger(larger(larger(best, {v.x, 4 * q}, N), {v.y, 4 * q + 1}, N), {v.z, 4 * q + 2}, N), {v.w, 4 * q + 3}, N);
    }
  } else {
#pragma unroll 8
    for (int64_t i = threadIdx.x; i < N; i += kArgmaxThreads) best = larger(best, {col[i], i}, N);
  }
  const auto warp_larger = [N](ArgmaxPair p) {  // the warp's largest pair, in every lane
#pragma unroll
    for (int o = 16; o > 0; o /= 2)
      p = larger(p, {__shfl_xor_sync(0xffffffffu, p.v, o), __shfl_xor_sync(0xffffffffu, p.i, o)}, N);
    return p;
  };
  best = warp_larger(best);
  __shared__ ArgmaxPair warps[kArgmaxThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warps[warp] = best;
  __syncthreads();
  if (warp != 0) return;
  best = warp_larger(warps[lane]);
  if (lane == 0) ids[blockIdx.x] = static_cast<int32_t>(best.i);
}

__global__ void repeat_streams_kernel(const float* x, int64_t H, int64_t S, int64_t T, float* out) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= H * S * T) return;
  int64_t d = i % H, t = i / (H * S);
  out[i] = x[t * H + d];
}

// One block per group. w: null, one gamma per group position (w_len == group), or per row
// position (w_len == row length n). With q8.codes set (group a multiple of 32), each warp also
// writes the Q8_0 chunks of out it holds (its lanes cover 32 consecutive values a step).
__global__ void rms_norm_kernel(const float* x, const float* w, int64_t group, int64_t n, int64_t w_len, float eps,
                                float* out, QuantizeTarget q8) {
  grid_dependency_wait();
  int64_t gi = blockIdx.x;
  const float* xr = x + gi * group;
  const double r = block_inv_rms(xr, group, eps);
  const float* wp = w ? w + (w_len == n ? (gi * group) % n : 0) : nullptr;
  for (int64_t i = threadIdx.x; i < group; i += blockDim.x) {
    const float v = static_cast<float>(xr[i] * r * (wp ? static_cast<double>(wp[i]) : 1.0));
    out[gi * group + i] = v;
    if (q8.codes) quantize_q8_0_value(v, (gi * group + i) / 32, q8.codes, q8.scales);
  }
}

__global__ void rope_kernel(float* x, const int64_t* positions, const float* inv_freq, int64_t hd, int64_t nh,
                            int64_t T, int64_t half) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= half * nh * T) return;
  int64_t pair = i % half, row = i / half, t = row / nh;
  rope_pair(x + row * hd, pair, half, inv_freq[pair], positions[t]);
}

__global__ void swiglu_kernel(const float* g, const float* u, float* out, int64_t n) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<float>(silu_d(g[i]) * u[i]);
}

// acc[t][d] += sigmoid(s[t])·x[t][d]; grid per_token_grid(n, T).
__global__ void add_sigmoid_gated_kernel(float* acc, const float* x, const float* s, int64_t n, int64_t T) {
  grid_dependency_wait();
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= n) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const double gate = sigmoid_d(s[t]);
    acc[t * n + d] = static_cast<float>(acc[t * n + d] + gate * x[t * n + d]);
  }
}

// seq = [history (L rows) | x (T rows)], rows of C channels.
__device__ __forceinline__ float conv_seq(const float* hist, const float* x, int64_t L, int64_t C, int64_t j,
                                          int64_t c) {
  return j < L ? hist[j * C + c] : x[(j - L) * C + c];
}

// Prefill's tokens a thread (a run), and the most taps it takes (the model's convs have 4). 16
// keeps the kernel at 72 registers, three blocks of 256 an SM (32: 110 registers, two blocks),
// and adds 3/16 to the inputs' reads as halos, which L2 serves.
constexpr int kConvRun = 16;
constexpr int kConvTaps = 4;

// Grid per_token_grid(C, n_runs), K <= kConvTaps: thread (c, run) computes channel c at the
// kConvRun tokens t0 + i·dil, t0 = (run / dil)·kConvRun·dil + run % dil, whose taps are one
// another's inputs. It loads those inputs and the K − 1 before them into registers first (a warp's
// loads are 32 consecutive channels of a row; all of a run's are in flight together), so each input
// is read once by its run and once more as the next run's halo.
__global__ void causal_conv_kernel(const float* __restrict__ x, const float* __restrict__ hist,
                                   const float* __restrict__ w, int64_t C, int64_t T, int64_t K, int64_t dil,
                                   int64_t n_runs, float* __restrict__ out) {
  grid_dependency_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, L = (K - 1) * dil;
  if (c >= C) return;
  float wr[kConvTaps];  // wr[p]: tap K − kConvTaps + p
#pragma unroll
  for (int p = 0; p < kConvTaps; ++p) wr[p] = K - kConvTaps + p >= 0 ? w[c * K + K - kConvTaps + p] : 0.0f;
  for (int64_t run = blockIdx.y; run < n_runs; run += gridDim.y) {
    const int64_t t0 = run / dil * kConvRun * dil + run % dil;
    float v[kConvTaps - 1 + kConvRun];  // v[kConvTaps − 1 + i]: the input at token t0 + i·dil
#pragma unroll
    for (int i = 1 - kConvTaps; i < kConvRun; ++i) {
      const int64_t t = t0 + i * dil;
      v[kConvTaps - 1 + i] = i >= 1 - K && t < T ? conv_seq(hist, x, L, C, L + t, c) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kConvRun; ++i) {
      const int64_t t = t0 + i * dil;
      if (t >= T) break;
      double s = 0;
#pragma unroll
      for (int p = 0; p < kConvTaps; ++p)
        if (K - kConvTaps + p >= 0) s += static_cast<double>(wr[p]) * v[i + p];
      out[t * C + c] = conv_silu(s);
    }
  }
}

// The last L rows of [history | x] into next_hist, where x has fewer than L rows.
__global__ void conv_history_kernel(const float* x, const float* hist, int64_t C, int64_t T, int64_t L,
                                    float* next_hist) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= C * L) return;
  int64_t c = i % C, r = i / C;
  next_hist[i] = conv_seq(hist, x, L, C, T + r, c);
}

// Channel c of T tokens over one history: its outputs, then its history moved forward, so the
// history is updated in the same launch.
__device__ __forceinline__ void conv_step_channel(const float* x, float* hist, const float* w, int64_t C, int64_t T,
                                                  int64_t K, int64_t dil, float* out, int64_t c) {
  const int64_t L = (K - 1) * dil;
  for (int64_t t = 0; t < T; ++t) {
    double s = 0;
    for (int64_t k = 0; k < K; ++k)
      s += static_cast<double>(w[c * K + k]) * conv_seq(hist, x, L, C, L + t - (K - 1 - k) * dil, c);
    out[t * C + c] = conv_silu(s);
  }
  // The new history is the last L rows of [history | x]; row j of it is row T + j of the old
  // sequence, so ascending j reads each old row before it is overwritten.
  for (int64_t j = 0; j < L; ++j) hist[j * C + c] = conv_seq(hist, x, L, C, T + j, c);
}

constexpr int kThreads = 256;
constexpr int kConvStepTokens = 8;

// A channel of a decode conv with dilation 1 and at most kConvTaps taps (the model's GDN conv),
// for at most kConvStepTokens tokens, in registers: its weights and history do not depend on the
// kernel before (the product that wrote x; the history was last written by this op a step ago),
// so they load before the wait and only x waits for it. The sums are conv_step_channel's, in its
// order, so the outputs are the same.
struct ShortConvChannel {
  float w[kConvTaps];  // w[p]: tap K − kConvTaps + p; 0 before tap 0
  float v[kConvTaps - 1 + kConvStepTokens];  // [history | x] from history row L − (kConvTaps − 1)
};
__device__ __forceinline__ bool is_short_conv(int64_t K, int64_t dil) { return dil == 1 && K <= kConvTaps; }

__device__ __forceinline__ ShortConvChannel load_short_conv(const float* hist, const float* w, int64_t C, int64_t K,
                                                            int64_t c) {
  ShortConvChannel ch;
  const int64_t L = K - 1;
#pragma unroll
  for (int p = 0; p < kConvTaps; ++p) ch.w[p] = K - kConvTaps + p >= 0 ? w[c * K + K - kConvTaps + p] : 0.0f;
#pragma unroll
  for (int i = 0; i < kConvTaps - 1; ++i) {
    const int64_t row = L - (kConvTaps - 1) + i;
    ch.v[i] = row >= 0 ? hist[row * C + c] : 0.0f;
  }
  return ch;
}

__device__ __forceinline__ void short_conv(ShortConvChannel& ch, const float* x, float* hist, int64_t C, int T,
                                           int64_t K, float* out, int64_t c) {
#pragma unroll
  for (int t = 0; t < kConvStepTokens; ++t)
    if (t < T) ch.v[kConvTaps - 1 + t] = x[t * C + c];
#pragma unroll
  for (int t = 0; t < kConvStepTokens; ++t) {
    if (t >= T) break;
    double s = 0;
#pragma unroll
    for (int p = 0; p < kConvTaps; ++p)
      if (K - kConvTaps + p >= 0) s += static_cast<double>(ch.w[p]) * ch.v[t + p];
    out[t * C + c] = conv_silu(s);
  }
  // History row j becomes position T + j of [history | x], v[T + j + kConvTaps − 1 − L]: picked by
  // constant indices (a register array indexed at run time would go to local memory).
  const int L = static_cast<int>(K) - 1;
#pragma unroll
  for (int j = 0; j < kConvTaps - 1; ++j) {
    if (j >= L) break;
    const int at = T + j + kConvTaps - 1 - L;
    float value = 0.0f;
#pragma unroll
    for (int i = 0; i < kConvTaps - 1 + kConvStepTokens; ++i)
      if (i == at) value = ch.v[i];
    hist[j * C + c] = value;
  }
}

// Channel c of a decode conv split at the kernel's wait: a short conv's weights and history load
// before it (short_conv), any other conv reads everything after it (conv_step_channel).
struct StepConvChannel {
  bool early;  // a short conv, c < C
  ShortConvChannel values;
};
__device__ __forceinline__ StepConvChannel conv_before_wait(const float* hist, const float* w, int64_t C, int64_t K,
                                                            int64_t dil, int64_t c) {
  StepConvChannel ch;
  ch.early = c < C && is_short_conv(K, dil);
  if (ch.early) ch.values = load_short_conv(hist, w, C, K, c);
  return ch;
}
__device__ __forceinline__ void conv_after_wait(StepConvChannel& ch, const float* x, float* hist, const float* w,
                                                int64_t C, int64_t T, int64_t K, int64_t dil, float* out, int64_t c) {
  if (ch.early)
    short_conv(ch.values, x, hist, C, static_cast<int>(T), K, out, c);
  else if (c < C)
    conv_step_channel(x, hist, w, C, T, K, dil, out, c);
}

// A few tokens (decode): one thread per channel.
__global__ void causal_conv_step_kernel(const float* x, float* hist, const float* w, int64_t C, int64_t T, int64_t K,
                                        int64_t dil, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  StepConvChannel ch = conv_before_wait(hist, w, C, K, dil, c);
  grid_dependency_wait();
  conv_after_wait(ch, x, hist, w, C, T, K, dil, out, c);
}

// One token of each of gridDim.y sequences: column b over its own history.
__global__ void causal_conv_columns_kernel(const float* x, ColumnPointers<float> hists, const float* w, int64_t C,
                                           int64_t K, int64_t dil, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, b = blockIdx.y;
  float* hist = hists.at(b);
  StepConvChannel ch = conv_before_wait(hist, w, C, K, dil, c);
  grid_dependency_wait();
  conv_after_wait(ch, x + b * C, hist, w, C, 1, K, dil, out + b * C, c);
}

// Rows ids[t] of a device table of K values a row: thread x decodes 32-value chunk x of token t's
// row (the last chunk may be partial).
template <typename D, typename Id>
__global__ void get_rows_kernel(const uint8_t* __restrict__ table, uint64_t row_bytes, int64_t K,
                                const Id* __restrict__ ids, int64_t n_ids, float* __restrict__ out) {
  grid_dependency_wait();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c * 32 >= K) return;
  const int n = K - c * 32 < 32 ? static_cast<int>(K - c * 32) : 32;
  for (int64_t t = blockIdx.y; t < n_ids; t += gridDim.y) {
    float y[32];
    D::chunk(table + static_cast<uint64_t>(ids[t]) * row_bytes, c, K, y);
    float* dst = out + t * K + c * 32;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      if (j < n) dst[j] = y[j];
  }
}

}  // namespace

// out = rows `ids` (n_ids of them, on the device) of a table on the device.
template <typename Id>
void CudaBackend::get_device_rows(const Weight& table, const Id* ids, int64_t n_ids, Tensor& out) {
  const DeviceMatrix& m = matrix(table);
  const int64_t n = table.ne[0], chunks = (n + 31) / 32;
  dispatch_weight_type(m.type, [&](auto dq) {
    using D = decltype(dq);
    launch(stream_, "get_rows_kernel", get_rows_kernel<D, Id>, per_token_grid(chunks, n_ids, kThreads), kThreads, 0,
           m.data, m.row_bytes, n, ids, n_ids, out.f32());
  });
}

void CudaBackend::get_rows_by(const Weight& table, const Tensor& ids, Tensor& out) {
  if (table.stays_on_host) return Backend::get_rows_by(table, ids, out);  // gathered on the host
  OpScope scope(profiler_, "get_rows", out.ne(1), stream_);
  if (ids.dtype() != DType::I32) fail("get_rows_by: ids are not I32");
  expect_elements(out, table.ne[0] * ids.n_elements(), "get_rows", "out");
  q8_output_ = {};
  if (ids.n_elements() > 0) get_device_rows(table, ids.i32(), ids.n_elements(), out);
}

void CudaBackend::get_rows(const Weight& table, std::span<const int64_t> ids, Tensor& out) {
  OpScope scope(profiler_, "get_rows", out.ne(1), stream_);
  check_get_rows(table, ids, out);
  const int64_t n = table.ne[0], n_ids = static_cast<int64_t>(ids.size());
  q8_output_ = {};
  if (n_ids == 0) return;
  if (!table.stays_on_host) {
    Tensor dev_ids = upload_scratch(ids);
    get_device_rows(table, reinterpret_cast<const int64_t*>(dev_ids.f32()), n_ids, out);
    return;
  }
  // Gathered on the host from the mapped file, on all cores, into pinned memory.
  upload_gathered(out.data(), static_cast<size_t>(n * n_ids) * sizeof(float), [&](uint8_t* host) {
    float* rows = reinterpret_cast<float*>(host);
    parallel_for(n_ids, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        dequantize_row(table.type, table.data + static_cast<uint64_t>(ids[i]) * table.row_bytes, n, rows + i * n);
    }, 64);
  });
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  OpScope scope(profiler_, "add", a.ne(1), stream_);
  check_add(a, b, out);
  int64_t n = a.n_elements();
  if (n == 0) return;
  launch(stream_, "add_kernel", add_kernel, blocks_for(n, kThreads), kThreads, 0, a.f32(), b.f32(), out.f32(), n);
}

void CudaBackend::argmax(const Tensor& x, Tensor& ids) {
  OpScope scope(profiler_, "argmax", x.ne(1), stream_);
  check_argmax(x, ids);
  if (x.ne(1) == 0) return;
  const bool quads = x.ne(0) % 4 == 0 && reinterpret_cast<uintptr_t>(x.f32()) % alignof(float4) == 0;
  launch(stream_, "argmax_kernel", quads ? argmax_kernel<true> : argmax_kernel<false>, static_cast<unsigned>(x.ne(1)),
         kArgmaxThreads, 0, x.f32(), x.ne(0), ids.i32());
}

void CudaBackend::repeat_streams(const Tensor& x, int64_t n_streams, Tensor& out) {
  OpScope scope(profiler_, "repeat_streams", x.ne(1), stream_);
  check_repeat_streams(x, n_streams, out);
  int64_t H = x.ne(0), T = x.ne(1);
  int64_t n = H * n_streams * T;
  if (n == 0) return;
  launch(stream_, "repeat_streams_kernel", repeat_streams_kernel, blocks_for(n, kThreads), kThreads, 0, x.f32(), H, n_streams, T, out.f32());
}

void CudaBackend::rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out) {
  rms_norm_q8(x, w, group, eps, out, {});
}

void CudaBackend::rms_norm_q8(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out, QuantizeTarget q8) {
  OpScope scope(profiler_, "rms_norm", -1, stream_);
  check_rms_norm(x, w, group, out);
  if (q8.codes && group % 32 != 0) fail("rms_norm: groups of ", group, " values do not fill Q8_0 chunks");
  int64_t n = x.ne(0);
  const float* wv = w ? values(*w) : nullptr;
  int64_t w_len = w ? w->n_elements() : 0;
  int64_t n_groups = x.n_elements() / group;
  if (n_groups == 0) return;
  int threads = static_cast<int>(std::min<int64_t>(256, (group + 31) / 32 * 32));
  launch(stream_, "rms_norm_kernel", rms_norm_kernel, static_cast<unsigned>(n_groups), threads, 0, x.f32(), wv, group, n, w_len, eps, out.f32(), q8);
}

void CudaBackend::rope(Tensor& x, std::span<const int64_t> positions, int64_t n_rot, float theta) {
  OpScope scope(profiler_, "rope", static_cast<int64_t>(positions.size()), stream_);
  check_rope(x, positions, n_rot);
  int64_t hd = x.ne(0), nh = x.ne(1), T = x.ne(2);
  int64_t half = n_rot / 2, n = half * nh * T;
  if (n == 0) return;
  std::vector<float> inv = rope_inv_freq(n_rot, theta);
  launch(stream_, "rope_kernel", rope_kernel, blocks_for(n, kThreads), kThreads, 0, x.f32(), cached_upload(positions), cached_upload(std::span<const float>(inv)), hd, nh, T, half);
}

void CudaBackend::swiglu(const Tensor& g, const Tensor& u, Tensor& out) {
  OpScope scope(profiler_, "swiglu", g.ne(1), stream_);
  check_swiglu(g, u, out);
  int64_t n = g.n_elements();
  if (n == 0) return;
  launch(stream_, "swiglu_kernel", swiglu_kernel, blocks_for(n, kThreads), kThreads, 0, g.f32(), u.f32(), out.f32(), n);
}

void CudaBackend::add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& s) {
  OpScope scope(profiler_, "add_sigmoid_gated", x.ne(1), stream_);
  check_add_sigmoid_gated(acc, x, s);
  int64_t n = acc.ne(0), T = acc.ne(1);
  if (n * T == 0) return;
  launch(stream_, "add_sigmoid_gated_kernel", add_sigmoid_gated_kernel, per_token_grid(n, T, kThreads), kThreads, 0, acc.f32(), x.f32(), s.f32(), n, T);
}

void CudaBackend::causal_conv_columns(const Tensor& x, std::span<Tensor* const> histories, const Weight& w,
                                      int64_t dilation, Tensor& out) {
  OpScope scope(profiler_, "causal_conv_columns", x.ne(1), stream_);
  check_columns(x.ne(1), histories.size(), "causal_conv_columns");
  for (Tensor* h : histories) check_causal_conv(x, *h, w, dilation, out);
  const int64_t C = x.ne(0), K = w.ne[0];
  const auto history_data = [](Tensor& h) { return h.f32(); };
  for_each_column_group<float>(histories, history_data, [&](size_t b0, size_t nb, const ColumnPointers<float>& hists) {
    const dim3 grid(blocks_for(C, kThreads), static_cast<unsigned>(nb));
    const int64_t first = static_cast<int64_t>(b0) * C;
    launch(stream_, "causal_conv_columns_kernel", causal_conv_columns_kernel, grid, kThreads, 0, x.f32() + first, hists, values(w), C, K, dilation, out.f32() + first);
  });
}

void CudaBackend::causal_conv(const Tensor& x, Tensor& history, const Weight& w, int64_t dilation, Tensor& out) {
  OpScope scope(profiler_, "causal_conv", x.ne(1), stream_);
  check_causal_conv(x, history, w, dilation, out);
  int64_t C = x.ne(0), T = x.ne(1), K = w.ne[0], L = (K - 1) * dilation;
  const float* wv = values(w);
  if (T <= kConvStepTokens || K > kConvTaps) {  // more taps than the prefill kernel's: no model has them
    if (C * T > 0) {
      launch(stream_, "causal_conv_step_kernel", causal_conv_step_kernel, blocks_for(C, kThreads), kThreads, 0, x.f32(), history.f32(), wv, C, T, K, dilation, out.f32());
    }
    return;
  }
  if (C * T > 0) {
    const int64_t n_runs = (T + kConvRun * dilation - 1) / (kConvRun * dilation) * dilation;
    launch(stream_, "causal_conv_kernel", causal_conv_kernel, per_token_grid(C, n_runs, kThreads), kThreads, 0, x.f32(), history.f32(), wv, C, T, K, dilation, n_runs, out.f32());
  }
  if (C * L == 0) return;
  if (T >= L) return copy(x, (T - L) * C, history, 0, C * L);  // the new history is x's last L rows
  Tensor next = scratch_f32(C * L);
  launch(stream_, "conv_history_kernel", conv_history_kernel, blocks_for(C * L, kThreads), kThreads, 0, x.f32(), history.f32(), C, T, L, next.f32());
  copy(next, 0, history, 0, C * L);
}

}  // namespace regolith::cuda
