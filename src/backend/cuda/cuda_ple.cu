// CUDA PLE injection (model-spec §4.8.4): the gate of the n-gram value by its keys' agreement with
// each stream, and for one token the whole injection as one kernel. Unfused, one token's injection
// took eight kernels a token on the decode chain (the pending HC write, three norms, the gate, the
// conv and two adds: 43 µs, H100); fused, one block a stream holds its 2,560 values in registers
// through the norms, the gate, the conv and the residual update.
#include "backend/cuda/cuda_backend_impl.cuh"

namespace regolith::cuda {

namespace {

// sigmoid(ssqrt(dot / sqrt(H))), ssqrt(x) = sign(x)·sqrt(max(|x|, 1e-6)): a stream's gate from
// the dot product of its normed key and query.
__device__ __forceinline__ double ple_gate_value(double dot, int64_t H) {
  const double score = dot / sqrt(static_cast<double>(H));
  const double ss = score == 0 ? 0.0 : copysign(sqrt(fmax(fabs(score), 1e-6)), score);
  return sigmoid_d(ss);
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
  const double gate = ple_gate_value(block_sum(dot), H);
  for (int64_t d = threadIdx.x; d < H; d += blockDim.x) out[t * W + s * H + d] = static_cast<float>(gate * val[t * H + d]);
}

// The fused one-token injection: values d = threadIdx.x + i·blockDim.x (i < kPleValues) of stream
// blockIdx.x, a conv of kPleTaps taps kPleDilation apart (the model's: 4 taps, dilation 3, so 9
// history rows). Each value is computed as the unfused kernels compute it (FP64 norms and gate,
// FP32 adds in their order); only the block sums add in another order.
constexpr int kPleValues = 5, kPleThreads = 512, kPleTaps = 4, kPleDilation = 3;
constexpr int kPleHistory = (kPleTaps - 1) * kPleDilation;

struct PleInjectParams {
  float* R;               // [W]
  const float* y;         // [H] pending write, or null
  const float* inject_w;  // [S]
  const float* key_proj;  // [W]
  const float* val;       // [H]
  const float *norm_key, *norm_query, *norm_conv;  // [W]
  const float* conv;      // [W][kPleTaps]
  float* history;         // [kPleHistory][W], oldest row first
  float* conv_inputs;     // [W], or null
  int64_t H, W;
  float eps;
};

__global__ void __launch_bounds__(kPleThreads) ple_inject_kernel(PleInjectParams p) {
  const int64_t s = blockIdx.x, base = s * p.H;
  const auto live = [&](int i) { return threadIdx.x + i * blockDim.x < p.H; };
  const auto at = [&](int i) { return base + threadIdx.x + i * blockDim.x; };  // index into [W]
  // Before the wait: everything but the PLE products (the kernel just before). R and the pending
  // write are two or more kernels back, the weights and the history are this op's own.
  float r[kPleValues], q[kPleValues], wk[kPleValues], wn[kPleValues], taps[kPleValues][kPleTaps];
  float hist[kPleValues][kPleHistory];
  double ss_r = 0;
#pragma unroll
  for (int i = 0; i < kPleValues; ++i) {
    if (!live(i)) continue;
    const int64_t c = at(i);
    r[i] = p.R[c];
    if (p.y) r[i] = written(r[i], p.inject_w[s], p.y[c - base]);
    ss_r += static_cast<double>(r[i]) * r[i];
    q[i] = p.norm_query[c], wk[i] = p.norm_key[c], wn[i] = p.norm_conv[c];
#pragma unroll
    for (int k = 0; k < kPleTaps; ++k) taps[i][k] = p.conv[c * kPleTaps + k];
#pragma unroll
    for (int j = 0; j < kPleHistory; ++j) hist[i][j] = p.history[j * p.W + c];
  }
  const double r_query = inv_rms(block_sum(ss_r), p.H, p.eps);
#pragma unroll
  for (int i = 0; i < kPleValues; ++i)
    if (live(i)) q[i] = static_cast<float>(r[i] * r_query * static_cast<double>(q[i]));
  grid_dependency_wait();
  float key[kPleValues], val[kPleValues];
  double ss_key = 0;
#pragma unroll
  for (int i = 0; i < kPleValues; ++i) {
    if (!live(i)) continue;
    key[i] = p.key_proj[at(i)], val[i] = p.val[at(i) - base];
    ss_key += static_cast<double>(key[i]) * key[i];
  }
  const double r_key = inv_rms(block_sum(ss_key), p.H, p.eps);
  double dot = 0;
#pragma unroll
  for (int i = 0; i < kPleValues; ++i)
    if (live(i)) dot += static_cast<double>(static_cast<float>(key[i] * r_key * static_cast<double>(wk[i]))) * q[i];
  const double gate = ple_gate_value(block_sum(dot), p.H);
  float g[kPleValues];
  double ss_g = 0;
#pragma unroll
  for (int i = 0; i < kPleValues; ++i) {
    if (!live(i)) continue;
    g[i] = static_cast<float>(gate * val[i]);
    ss_g += static_cast<double>(g[i]) * g[i];
  }
  const double r_conv = inv_rms(block_sum(ss_g), p.H, p.eps);
#pragma unroll
  for (int i = 0; i < kPleValues; ++i) {
    if (!live(i)) continue;
    const int64_t c = at(i);
    const float n = static_cast<float>(g[i] * r_conv * static_cast<double>(wn[i]));
    // Tap k reads position kPleHistory − (kPleTaps − 1 − k)·kPleDilation of [history | n].
    double sum = 0;
#pragma unroll
    for (int k = 0; k < kPleTaps; ++k) {
      const int pos = kPleHistory - (kPleTaps - 1 - k) * kPleDilation;
      sum += static_cast<double>(taps[i][k]) * (pos < kPleHistory ? hist[i][pos] : n);
    }
    const float conv = conv_silu(sum);
    p.R[c] = (r[i] + g[i]) + conv;
    if (p.conv_inputs) p.conv_inputs[c] = n;
#pragma unroll
    for (int j = 0; j < kPleHistory; ++j) p.history[j * p.W + c] = j + 1 < kPleHistory ? hist[i][j + 1] : n;
  }
}

}  // namespace

void CudaBackend::ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) {
  OpScope scope(profiler_, "ple_gate", val.ne(1), stream_);
  check_ple_gate(key, qry, val, n_streams, out);
  int64_t T = key.ne(1), H = val.ne(0);
  if (n_streams * T == 0) return;
  dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(n_streams));
  launch(stream_, "ple_gate_kernel", ple_gate_kernel, grid, 128, 0, key.f32(), qry.f32(), val.f32(), H, n_streams, out.f32());
}

void CudaBackend::ple_inject(const PleInjectArgs& a) {
  check_ple_inject(a);
  const int64_t W = a.R->ne(0), T = a.R->ne(1), S = a.n_streams, H = W / S;
  const bool fused = T == 1 && a.conv->ne[0] == kPleTaps && a.dilation == kPleDilation &&
                     H <= static_cast<int64_t>(kPleValues) * kPleThreads && S <= 65535;
  if (!fused) return Backend::ple_inject(a);
  OpScope scope(profiler_, "ple_inject", T, stream_);
  const int threads = static_cast<int>(std::min<int64_t>(kPleThreads, (H + kPleValues * 32 - 1) / (kPleValues * 32) * 32));
  const PleInjectParams p{.R = a.R->f32(), .y = a.y ? a.y->f32() : nullptr, .inject_w = a.y ? a.inject_w->f32() : nullptr,
                          .key_proj = a.key_proj->f32(), .val = a.val->f32(), .norm_key = values(*a.norm_key),
                          .norm_query = values(*a.norm_query), .norm_conv = values(*a.norm_conv),
                          .conv = values(*a.conv), .history = a.history->f32(),
                          .conv_inputs = a.conv_inputs ? a.conv_inputs->f32() : nullptr, .H = H, .W = W, .eps = a.eps};
  launch(stream_, "ple_inject_kernel", ple_inject_kernel, static_cast<unsigned>(S), threads, 0, p);
}

}  // namespace regolith::cuda
