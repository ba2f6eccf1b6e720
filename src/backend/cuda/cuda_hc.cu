// CUDA hyper-connection read/write (model-spec §4.2) and the PLE gate (§4.8.4). hc_read is the
// unfused composition: grouped norm, down projection + SiLU, up projection, sigmoid-weighted
// stream mix, inject weights; each step a kernel over all tokens.
#include "backend/cuda/cuda_backend_impl.cuh"

namespace regolith::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void scaled_silu_kernel(float* v, int64_t n, double inv_s) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<float>(silu_d(v[i] * inv_s));
}

// x[d, t] = (1/S) Σ_s sigmoid(m[s·H + d, t]) · n[s·H + d, t]
__global__ void hc_mix_kernel(const float* m, const float* nrm, int64_t H, int64_t S, int64_t T, float* x) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= H * T) return;
  int64_t d = i % H, t = i / H, W = H * S;
  double acc = 0;
  for (int64_t s = 0; s < S; ++s) acc += sigmoid_d(m[t * W + s * H + d]) * nrm[t * W + s * H + d];
  x[i] = static_cast<float>(acc / S);
}

__global__ void inject_weights_kernel(float* v, int64_t n, double inv_s) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<float>(2.0 * sigmoid_d(v[i] * inv_s));
}

__global__ void hc_write_kernel(float* R, const float* y, const float* iw, int64_t H, int64_t S, int64_t T) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t W = H * S;
  if (i >= W * T) return;
  int64_t t = i / W, c = i % W;
  R[i] = static_cast<float>(R[i] + static_cast<double>(iw[t * S + c / H]) * y[t * H + c % H]);
}

// One block per (token, stream).
__global__ void ple_gate_kernel(const float* key, const float* qry, const float* val, int64_t H, int64_t S,
                                float* out) {
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
  const Tensor& R = *a.R;
  int64_t S = a.n_streams, W = R.ne(0), T = R.ne(1), H = S > 0 ? W / S : 0, r = a.down->ne[1];
  if (S <= 0 || W % S) fail("hc_read: ", S, " streams do not divide ", W);
  if (a.norm->n_elements() != W || a.down->ne[0] != W || a.up->ne[0] != r || a.up->ne[1] != W)
    fail("hc_read: weights ", a.norm->name, ", ", a.down->name, ", ", a.up->name, " do not fit width ", W);
  expect_shape(*a.x, {H, T, 1, 1}, "hc_read", "x");
  if (a.inject) {
    if (a.inject->ne[0] != W || a.inject->ne[1] != S) fail("hc_read: ", a.inject->name, " does not fit");
    expect_shape(*a.inject_w, {S, T, 1, 1}, "hc_read", "inject_w");
  }
  if (T == 0) return;
  Tensor n = scratch_f32(W * T).reshaped({W, T, 1, 1}), lo = scratch_f32(r * T), m = scratch_f32(W * T);
  rms_norm(R, a.norm, H, a.eps, n);  // grouped: one gamma per position of the W-wide row
  matmul(matrix(*a.down), n.f32(), T, lo.f32());
  scaled_silu_kernel<<<blocks_for(r * T, kThreads), kThreads, 0, stream_>>>(lo.f32(), r * T, 1.0 / S);
  check_launch("scaled_silu_kernel");
  matmul(matrix(*a.up), lo.f32(), T, m.f32());
  hc_mix_kernel<<<blocks_for(H * T, kThreads), kThreads, 0, stream_>>>(m.f32(), n.f32(), H, S, T, a.x->f32());
  check_launch("hc_mix_kernel");
  if (a.inject) {
    matmul(matrix(*a.inject), n.f32(), T, a.inject_w->f32());
    inject_weights_kernel<<<blocks_for(S * T, kThreads), kThreads, 0, stream_>>>(a.inject_w->f32(), S * T, 1.0 / S);
    check_launch("inject_weights_kernel");
  }
}

void CudaBackend::hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) {
  int64_t W = R.ne(0), T = R.ne(1), H = y.ne(0), S = inject_w.ne(0);
  if (H * S != W) fail("hc_write: ", S, " streams of ", H, " do not make ", W);
  expect_shape(y, {H, T, 1, 1}, "hc_write", "y");
  expect_shape(inject_w, {S, T, 1, 1}, "hc_write", "inject_w");
  if (W * T == 0) return;
  hc_write_kernel<<<blocks_for(W * T, kThreads), kThreads, 0, stream_>>>(R.f32(), y.f32(), inject_w.f32(), H, S, T);
  check_launch("hc_write_kernel");
}

void CudaBackend::ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) {
  int64_t W = key.ne(0), T = key.ne(1), H = val.ne(0);
  if (H * n_streams != W) fail("ple_gate: ", n_streams, " streams of ", H, " do not make ", W);
  expect_shape(qry, key.ne(), "ple_gate", "qry");
  expect_shape(val, {H, T, 1, 1}, "ple_gate", "val");
  expect_shape(out, key.ne(), "ple_gate", "out");
  if (n_streams * T == 0) return;
  dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(n_streams));
  ple_gate_kernel<<<grid, 128, 0, stream_>>>(key.f32(), qry.f32(), val.f32(), H, n_streams, out.f32());
  check_launch("ple_gate_kernel");
}

}  // namespace regolith::cuda
