// CUDA Gated DeltaNet (model-spec §4.4): gates, the delta rule, the sigmoid-gated output norm.
// The scan gives each warp 32 value columns j of one v head: column j of the state S[i][j] only
// ever meets column j (decay, S^T k, the rank-1 update, S^T q), so warps never talk to each other.
// The warp keeps its columns in shared memory in FP64 for the whole call, as the reference does
// per head, and stores FP32 at the end. Prefill uses the same token-by-token scan (the chunked
// WY form computes the same function; a tensor-core chunked scan is later work, issue 7).
#include "backend/cuda/cuda_backend_impl.cuh"

namespace regolith::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void gdn_gates_kernel(const float* alpha, const float* beta_raw, const float* A, const float* dt, int64_t nv,
                                 int64_t T, float* g, float* beta) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nv * T) return;
  int64_t h = i % nv;
  double z = static_cast<double>(alpha[i]) + dt[h];
  double softplus = z > 20 ? z : log1p(exp(z));
  g[i] = static_cast<float>(A[h] * softplus);
  beta[i] = static_cast<float>(sigmoid_d(beta_raw[i]));
}

// Grid (nv, ceil(dv/32)), one warp per block; shared: S slice [dk][32], q [dk], k [dk], FP64.
__global__ void gdn_scan_kernel(const float* qkv, const float* g, const float* beta, float* state, float* out,
                                int64_t T, int64_t nk, int64_t nv, int64_t dk, int64_t dv) {
  extern __shared__ double smem[];
  double* S = smem;             // [dk][32]
  double* q = S + dk * 32;      // [dk]
  double* k = q + dk;           // [dk]
  const int lane = threadIdx.x;
  const int64_t h = blockIdx.x, kh = h % nk, j = static_cast<int64_t>(blockIdx.y) * 32 + lane;
  const bool active = j < dv;
  const int64_t C = 2 * nk * dk + nv * dv;
  float* Sh = state + h * dk * dv;  // [dk][dv]
  for (int64_t i = 0; i < dk; ++i) S[i * 32 + lane] = active ? static_cast<double>(Sh[i * dv + j]) : 0.0;
  const double q_scale = 1.0 / sqrt(static_cast<double>(dk));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv + t * C;
    double ssq = 0, ssk = 0;
    for (int64_t i = lane; i < dk; i += 32) {
      double qi = row[kh * dk + i], ki = row[nk * dk + kh * dk + i];
      q[i] = qi;
      k[i] = ki;
      ssq += qi * qi;
      ssk += ki * ki;
    }
    ssq = warp_sum(ssq);
    ssk = warp_sum(ssk);
    const double rq = q_scale / sqrt(ssq + 1e-6), rk = 1.0 / sqrt(ssk + 1e-6);
    for (int64_t i = lane; i < dk; i += 32) {
      q[i] *= rq;
      k[i] *= rk;
    }
    __syncwarp();
    const double decay = exp(static_cast<double>(g[t * nv + h]));
    const double b = beta[t * nv + h];
    const double v = active ? static_cast<double>(row[2 * nk * dk + h * dv + j]) : 0.0;
    double m = 0;
    for (int64_t i = 0; i < dk; ++i) {
      double s = S[i * 32 + lane] * decay;
      S[i * 32 + lane] = s;
      m += s * k[i];
    }
    const double delta = b * (v - m);
    double o = 0;
    for (int64_t i = 0; i < dk; ++i) {
      double s = S[i * 32 + lane] + k[i] * delta;
      S[i * 32 + lane] = s;
      o += s * q[i];
    }
    if (active) out[t * nv * dv + h * dv + j] = static_cast<float>(o);
    __syncwarp();  // q, k are rewritten for the next token
  }
  if (active)
    for (int64_t i = 0; i < dk; ++i) Sh[i * dv + j] = static_cast<float>(S[i * 32 + lane]);
}

__global__ void gated_rms_norm_kernel(const float* x, const float* z, const float* w, int64_t dv, float eps,
                                      float* out) {
  int64_t gi = blockIdx.x;
  const float* xr = x + gi * dv;
  double ss = 0;
  for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) ss += static_cast<double>(xr[j]) * xr[j];
  ss = block_sum(ss);
  double r = 1.0 / sqrt(ss / dv + static_cast<double>(eps));
  for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) {
    float n = static_cast<float>(xr[j] * r);
    out[gi * dv + j] = static_cast<float>(w[j] * static_cast<double>(n) * sigmoid_d(z[gi * dv + j]));
  }
}

void check_scan(const GdnScanArgs& a, const char* op) {
  int64_t T = a.qkv->ne(1), nk = a.n_k_heads, nv = a.n_v_heads;
  if (nk <= 0 || nv <= 0 || nv % nk) fail(op, ": ", nv, " v heads over ", nk, " k heads");
  expect_shape(*a.qkv, {2 * nk * a.dk + nv * a.dv, T, 1, 1}, op, "qkv");
  expect_shape(*a.g, {nv, T, 1, 1}, op, "g");
  expect_shape(*a.beta, {nv, T, 1, 1}, op, "beta");
  expect_shape(*a.state, {a.dv, a.dk, nv, 1}, op, "state");
  expect_shape(*a.out, {a.dv * nv, T, 1, 1}, op, "out");
}

void launch_scan(const GdnScanArgs& a, cudaStream_t stream) {
  size_t smem = static_cast<size_t>(a.dk) * (32 + 2) * sizeof(double);
  if (smem > 48 * 1024)
    check(cudaFuncSetAttribute(gdn_scan_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "gdn_scan_kernel shared memory");
  dim3 grid(static_cast<unsigned>(a.n_v_heads), blocks_for(a.dv, 32));
  gdn_scan_kernel<<<grid, 32, smem, stream>>>(a.qkv->f32(), a.g->f32(), a.beta->f32(), a.state->f32(), a.out->f32(),
                                              a.qkv->ne(1), a.n_k_heads, a.n_v_heads, a.dk, a.dv);
  check_launch("gdn_scan_kernel");
}

}  // namespace

void CudaBackend::gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias,
                            Tensor& g, Tensor& beta) {
  int64_t nv = alpha.ne(0), T = alpha.ne(1);
  if (ssm_a.n_elements() != nv || dt_bias.n_elements() != nv)
    fail("gdn_gates: ", ssm_a.name, " / ", dt_bias.name, " do not have ", nv, " heads");
  expect_shape(beta_raw, alpha.ne(), "gdn_gates", "beta_raw");
  expect_shape(g, alpha.ne(), "gdn_gates", "g");
  expect_shape(beta, alpha.ne(), "gdn_gates", "beta");
  if (nv * T == 0) return;
  gdn_gates_kernel<<<blocks_for(nv * T, kThreads), kThreads, 0, stream_>>>(alpha.f32(), beta_raw.f32(), values(ssm_a),
                                                                           values(dt_bias), nv, T, g.f32(), beta.f32());
  check_launch("gdn_gates_kernel");
}

void CudaBackend::gdn_recurrent(const GdnScanArgs& a) {
  check_scan(a, "gdn_recurrent");
  if (a.qkv->ne(1) > 0) launch_scan(a, stream_);
}

void CudaBackend::gdn_chunked(const GdnScanArgs& a) {
  check_scan(a, "gdn_chunked");
  if (a.qkv->ne(1) > 0) launch_scan(a, stream_);
}

void CudaBackend::gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) {
  int64_t dv = w.n_elements();
  if (dv <= 0 || x.ne(0) % dv) fail("gated_rms_norm: ", w.name, " (", dv, ") does not divide ", x.ne(0));
  expect_shape(z, x.ne(), "gated_rms_norm", "z");
  expect_shape(out, x.ne(), "gated_rms_norm", "out");
  int64_t n_groups = x.n_elements() / dv;
  if (n_groups == 0) return;
  int threads = static_cast<int>(std::min<int64_t>(256, (dv + 31) / 32 * 32));
  gated_rms_norm_kernel<<<static_cast<unsigned>(n_groups), threads, 0, stream_>>>(x.f32(), z.f32(), values(w), dv, eps,
                                                                                  out.f32());
  check_launch("gated_rms_norm_kernel");
}

}  // namespace regolith::cuda
