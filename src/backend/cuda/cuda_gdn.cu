// CUDA Gated DeltaNet (model-spec §4.4): gates, the delta rule, the sigmoid-gated output norm.
//
// Decode (and heads too wide for the chunk kernels) uses the token-by-token scan: each block owns
// 32 value columns j of one v head. Column j of the state S[i][j] only ever meets column j (decay,
// S^T k, the rank-1 update, S^T q), so blocks never talk to each other; the block keeps its
// columns in registers in FP64 for the whole call, as the reference does per head. For one token,
// gdn_core runs as that one kernel: each block computes its head's gates itself, and the last of a
// head's blocks to finish applies the gated output norm to the head.
//
// Prefill uses the chunked WY form of the CPU backend (cpu_gdn.cpp), in FP32, in two kernels per
// round of chunks. The first works on every (chunk, v head) at once: everything that does not
// depend on the carried state (the decayed Gram matrices, the two triangular solves). The second
// carries the state through the chunks in order, a block per (v head, 16 value columns), with
// three small matrix products per chunk, on the tensor cores where the shape allows
// (gdn_state_pass_mma_kernel). Only the second is sequential in T, 64 tokens a step.
#include <type_traits>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace regolith::cuda {

namespace {

constexpr int kThreads = 256;

// g = A·softplus(alpha + dt), beta = sigmoid(beta_raw), rounded to FP32 as the reference stores them.
__device__ __forceinline__ void gdn_gate_values(float alpha, float beta_raw, float A, float dt, float& g, float& beta) {
  double z = static_cast<double>(alpha) + dt;
  double softplus = z > 20 ? z : log1p(exp(z));
  g = static_cast<float>(A * softplus);
  beta = static_cast<float>(sigmoid_d(beta_raw));
}

__global__ void gdn_gates_kernel(const float* alpha, const float* beta_raw, const float* A, const float* dt, int64_t nv,
                                 int64_t T, float* g, float* beta) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nv * T) return;
  int64_t h = i % nv;
  gdn_gate_values(alpha[i], beta_raw[i], A[h], dt[h], g[i], beta[i]);
}

// One value of the gated norm: x·r (r = 1/rms) rounded to FP32, then w·n·gate in FP64, gate =
// sigmoid(z) in FP32 (sigmoid_f: an FP64 exp and division a value took the FP64 pipe in prefill's
// norm, 50 M values a layer at 8K tokens; every caller takes the same gate, so a verify pass's
// outputs still equal its one-token steps').
__device__ __forceinline__ float gated_norm_value(float x, double r, float w, double gate) {
  const float n = static_cast<float>(x * r);
  return static_cast<float>(w * static_cast<double>(n) * gate);
}

// out = w ⊙ rmsnorm(x) ⊙ sigmoid(z) over one group of dv values, by the whole block (x read
// through L2: the fused scan reads values other blocks wrote). With q8.codes set (dv a multiple of
// 32, as the block's threads are), each warp also writes the Q8_0 chunk of out it holds, chunk
// first_chunk + j / 32. A group of at most a value a thread (the model's 128) takes one trip to
// memory: x, z and w load together, x stays in a register for the norm, and the sigmoid runs beside
// the block's sum (block_inv_rms's sum, in its order); a wider one reads x again after the sum.
__device__ __forceinline__ void gated_norm_group(const float* x, const float* z, const float* w, int64_t dv, float eps,
                                                 float* out, QuantizeTarget q8, int64_t first_chunk) {
  const auto finish = [&](int64_t j, float v) {
    out[j] = v;
    if (q8.codes) quantize_q8_0_value(v, first_chunk + j / 32, q8.codes, q8.scales);
  };
  if (dv <= blockDim.x) {
    const int64_t j = threadIdx.x;
    const bool holds = j < dv;  // whole warps when q8.codes is set
    const float xj = holds ? __ldcg(x + j) : 0.0f, wj = holds ? w[j] : 0.0f;
    const double gate = holds ? sigmoid_f(z[j]) : 0.0;
    const double r = inv_rms(block_sum(static_cast<double>(xj) * xj), dv, eps);
    if (holds) finish(j, gated_norm_value(xj, r, wj, gate));
    return;
  }
  const double r = block_inv_rms(x, dv, eps);
  for (int64_t j = threadIdx.x; j < dv; j += blockDim.x) finish(j, gated_norm_value(__ldcg(x + j), r, w[j], sigmoid_f(z[j])));
}

// What gdn_core adds to the scan kernel (gdn_recurrent passes none of it): gates from their raw
// inputs (alpha set; the first column block of each head stores them to g_out and beta_out), and
// the gated output norm into `normed` (set), by the last of a head's column blocks to finish
// (done[h] counts them and is set back to zero), and, with normed_q8 set, its Q8_0 form (the
// head's dv values, a multiple of 32, are whole chunks).
struct GdnCoreExtras {
  const float *alpha = nullptr, *beta_raw = nullptr, *A = nullptr, *dt = nullptr;
  float *g_out = nullptr, *beta_out = nullptr;
  const float *z = nullptr, *norm_w = nullptr;
  float eps = 0;
  float* normed = nullptr;
  QuantizeTarget normed_q8;
  unsigned* done = nullptr;
  void* states_after = nullptr;  // GdnCoreArgs::states_after (the state's type), with ScanMode::kStatesAfter
};

constexpr int kStepWarps = 8;

// The state is FP32, or BF16 (BackendOptions::gdn_state): widened on load, and rounded to FP32 and
// then to BF16 on store.
__device__ __forceinline__ double load_state(const float* p) { return *p; }
__device__ __forceinline__ double load_state(const uint16_t* p) { return bf16(*p); }
__device__ __forceinline__ void store_state(float* p, double v) { *p = static_cast<float>(v); }
__device__ __forceinline__ void store_state(uint16_t* p, double v) { *p = bf16_bits(static_cast<float>(v)); }
// Stores v at p and returns the value stored: the next token then starts from what a one-token
// step would have loaded.
template <typename State>
__device__ __forceinline__ double store_and_reload(State* p, double v) {
  State stored;
  store_state(&stored, v);
  *p = stored;
  return load_state(&stored);
}

__global__ void widen_bf16_kernel(const uint16_t* in, int64_t n, float* out) {
  grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = bf16(in[i]);
}

__global__ void narrow_bf16_kernel(const float* in, int64_t n, uint16_t* out) {
  grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = bf16_bits(in[i]);
}

// What one scan launch steps: T tokens of one sequence; the same, storing the state after each
// token but the last (a verify pass); or one token each of several sequences (batched decode).
enum class ScanMode { kTokens, kStatesAfter, kColumns };

// The scan's states: one sequence's as a plain pointer (as a struct of eight pointers, the kernel
// of the model's key heads spilled 40 bytes), or one a column (gdn_core_columns): block z's.
template <typename State, bool kColumns>
using ScanStates = std::conditional_t<kColumns, ColumnPointers<State>, State*>;
template <typename State>
__device__ __forceinline__ State* column_state(State* state) { return state; }
template <typename State>
__device__ __forceinline__ State* column_state(const ColumnPointers<State>& states) { return states.at(blockIdx.z); }

// Grid (nv, ceil(dv/32), columns), kStepWarps warps a block: lane l is value column j = 32·blockIdx.y + l,
// warp w holds the key rows i ≡ w (mod kStepWarps) of those columns in registers, in FP64 as the
// reference computes (kRows per thread bounds dk). Every row load is one 128-byte line, and the
// 8 warps × kRows loads of a block are all in flight at once. The two sums over i (S^T k, S^T q)
// are per-warp partials added in warp order through shared memory. The block takes the T tokens
// in order, or in ScanMode::kColumns only token col0 + z (z = blockIdx.z), a sequence of its own. With
// ScanMode::kStatesAfter (a verify pass) it also stores the state after each token but the last in
// x.states_after; decode's instance is compiled without that code.
template <int kRows, typename State, ScanMode kMode>
__global__ void __launch_bounds__(kStepWarps * 32)
    gdn_scan_kernel(const float* qkv, const float* g, const float* beta, ScanStates<State, kMode == ScanMode::kColumns> states,
                    float* out, int64_t T, int64_t col0, int64_t nk, int64_t nv, int64_t dk, int64_t dv,
                    GdnCoreExtras x) {
  __shared__ double q[kStepWarps * kRows], k[kStepWarps * kRows];
  __shared__ double part[kStepWarps][32];
  __shared__ double token_gates[2];  // the decay e^g and beta
  constexpr bool kColumns = kMode == ScanMode::kColumns;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t h = blockIdx.x, kh = h % nk, j = static_cast<int64_t>(blockIdx.y) * 32 + lane;
  const bool active = j < dv;
  const int64_t C = 2 * nk * dk + nv * dv;
  const int64_t t_begin = kColumns ? col0 + blockIdx.z : 0, t_end = kColumns ? t_begin + 1 : T;
  State* Sh = column_state(states) + h * dk * dv;  // [dk][dv]
  // The previous kernel does not write the state: its rows go to L2 while that kernel ends (lane r
  // asks for row warp + r·kStepWarps, the block's 32 columns of it).
  if (const int64_t i = warp + lane * kStepWarps; lane < kRows && i < dk)
    prefetch_l2(Sh + i * dv + static_cast<int64_t>(blockIdx.y) * 32, min(static_cast<int64_t>(32), dv - 32 * static_cast<int64_t>(blockIdx.y)) * sizeof(State), 0, 1);
  const float A = x.alpha ? x.A[h] : 0.0f, dt = x.alpha ? x.dt[h] : 0.0f;  // weights: before the wait
  grid_dependency_wait();
  double S[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = warp + r * kStepWarps;
    S[r] = active && i < dk ? load_state(Sh + i * dv + j) : 0.0;
  }
  const double q_scale = 1.0 / sqrt(static_cast<double>(dk));
  for (int64_t t = t_begin; t < t_end; ++t) {
    const float* row = qkv + t * C;
    // The token's v and gate inputs load with q and k, not after the norms: one memory trip.
    const double v = active ? static_cast<double>(row[2 * nk * dk + h * dv + j]) : 0.0;
    const float gate_a = x.alpha ? x.alpha[t * nv + h] : g[t * nv + h];
    const float gate_b = x.alpha ? x.beta_raw[t * nv + h] : beta[t * nv + h];
    for (int64_t i = threadIdx.x; i < dk; i += blockDim.x) {
      q[i] = row[kh * dk + i];
      k[i] = row[nk * dk + kh * dk + i];
    }
    __syncthreads();
    // Three warps at once: warp 0 normalizes q and warp 1 k (each lane the values it summed) while
    // warp 2 forms the token's gates; one barrier publishes all three, which keeps the FP64 gate
    // chain off the products' critical path.
    static_assert(kStepWarps >= 3, "the token's gates are warp 2's");
    if (warp < 2) {
      double* qk = warp == 0 ? q : k;
      double ss = 0;
      for (int64_t i = lane; i < dk; i += 32) ss += qk[i] * qk[i];
      ss = warp_sum(ss);
      const double scale = (warp == 0 ? q_scale : 1.0) / sqrt(ss + 1e-6);
      for (int64_t i = lane; i < dk; i += 32) qk[i] *= scale;
    } else if (warp == 2 && lane == 0) {
      float gt = gate_a, bt = gate_b;
      if (x.alpha) {
        gdn_gate_values(gate_a, gate_b, A, dt, gt, bt);
        if (blockIdx.y == 0) x.g_out[t * nv + h] = gt, x.beta_out[t * nv + h] = bt;
      }
      token_gates[0] = exp(static_cast<double>(gt));
      token_gates[1] = bt;
    }
    __syncthreads();
    const double decay = token_gates[0], b = token_gates[1];
    double m = 0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = warp + r * kStepWarps;
      if (i < dk) {
        S[r] *= decay;
        m += S[r] * k[i];
      }
    }
    part[warp][lane] = m;
    __syncthreads();
    m = 0;
    for (int w = 0; w < kStepWarps; ++w) m += part[w][lane];
    const double delta = b * (v - m);
    double o = 0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t i = warp + r * kStepWarps;
      if (i < dk) {
        S[r] += k[i] * delta;
        o += S[r] * q[i];
      }
    }
    if constexpr (kMode == ScanMode::kStatesAfter) {
      if (t + 1 < T) {
        State* after = static_cast<State*>(x.states_after) + (t * nv + h) * dk * dv;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const int64_t i = warp + r * kStepWarps;
          if (active && i < dk) S[r] = store_and_reload(after + i * dv + j, S[r]);
        }
      }
    }
    __syncthreads();  // every warp has read part
    part[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && active) {
      o = 0;
      for (int w = 0; w < kStepWarps; ++w) o += part[w][lane];
      out[t * nv * dv + h * dv + j] = static_cast<float>(o);
    }
    __syncthreads();  // q, k and part are rewritten for the next token
  }
  // The count comes before the state's stores, so that its fence waits only for the outputs.
  const bool norms = x.normed && last_block_to_finish(x.done + (kColumns ? blockIdx.z * nv : 0) + h, gridDim.y);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t i = warp + r * kStepWarps;
    if (active && i < dk) store_state(Sh + i * dv + j, S[r]);
  }
  if (!norms) return;
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int64_t o = t * nv * dv + h * dv;
    gated_norm_group(out + o, x.z + o, x.norm_w, dv, x.eps, x.normed + o, x.normed_q8, o / 32);
  }
}

// One block per group; q8 as gated_norm_group's.
__global__ void gated_rms_norm_kernel(const float* x, const float* z, const float* w, int64_t dv, float eps,
                                      float* out, QuantizeTarget q8) {
  grid_dependency_wait();
  const int64_t o = static_cast<int64_t>(blockIdx.x) * dv;
  gated_norm_group(x + o, z + o, w, dv, eps, out + o, q8, o / 32);
}

// The same for groups of dv = 128·kQuads values (prefill's heads): a warp a group, each lane's
// kQuads runs of 4 values loaded together, the FP64 sum of squares by shuffles, and the Q8_0
// codes 8 lanes a chunk. A block per group waited a memory trip and two barriers per group.
template <int kQuads>
__global__ void __launch_bounds__(256)
    gated_rms_norm_warp_kernel(const float* __restrict__ x, const float* __restrict__ z, const float* __restrict__ w,
                               int64_t n_groups, float eps, float* __restrict__ out, QuantizeTarget q8) {
  grid_dependency_wait();
  constexpr int kDv = 128 * kQuads;
  const int64_t group = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (group >= n_groups) return;  // whole warps
  const int lane = threadIdx.x % 32;
  const int64_t o4 = group * (kDv / 4);  // the group's first float4
  float4 xs[kQuads], zs[kQuads], ws[kQuads];
#pragma unroll
  for (int k = 0; k < kQuads; ++k) {
    xs[k] = reinterpret_cast<const float4*>(x)[o4 + k * 32 + lane];
    zs[k] = reinterpret_cast<const float4*>(z)[o4 + k * 32 + lane];
    ws[k] = reinterpret_cast<const float4*>(w)[k * 32 + lane];
  }
  double ss = 0;
#pragma unroll
  for (int k = 0; k < kQuads; ++k) {
    const float v[4] = {xs[k].x, xs[k].y, xs[k].z, xs[k].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) ss += static_cast<double>(v[e]) * v[e];
  }
  const double r = inv_rms(warp_sum(ss), kDv, eps);
#pragma unroll
  for (int k = 0; k < kQuads; ++k) {
    const float xv[4] = {xs[k].x, xs[k].y, xs[k].z, xs[k].w}, zv[4] = {zs[k].x, zs[k].y, zs[k].z, zs[k].w},
                wv[4] = {ws[k].x, ws[k].y, ws[k].z, ws[k].w};
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = gated_norm_value(xv[e], r, wv[e], sigmoid_f(zv[e]));
    const int64_t q = o4 + k * 32 + lane;
    reinterpret_cast<float4*>(out)[q] = make_float4(v[0], v[1], v[2], v[3]);
    if (q8.codes) quantize_q8_0_quad(v, q / 8, q8.codes, q8.scales);
  }
}

template <typename State>
State* state_data(Tensor& t);
template <>
float* state_data<float>(Tensor& t) { return t.f32(); }
template <>
uint16_t* state_data<uint16_t>(Tensor& t) { return t.bf16(); }

// With x.alpha set, a.g and a.beta are where the kernel stores the gates it computes. With columns,
// column t of a's tensors is one token of a sequence with state columns[t], kMaxColumns a launch.
template <int kRows, typename State>
void launch_scan_typed(const GdnScanArgs& a, const GdnCoreExtras& x, cudaStream_t stream, std::span<Tensor* const> columns) {
  const auto scan = [&](auto kernel, const auto& states, size_t n, int64_t col0) {
    const dim3 grid(static_cast<unsigned>(a.n_v_heads), blocks_for(a.dv, 32), static_cast<unsigned>(n));
    launch(stream, "gdn_scan_kernel", kernel, grid, kStepWarps * 32, 0, a.qkv->f32(), a.g->f32(), a.beta->f32(), states, a.out->f32(), a.qkv->ne(1), col0, a.n_k_heads, a.n_v_heads, a.dk, a.dv, x);
  };
  if (x.states_after) return scan(gdn_scan_kernel<kRows, State, ScanMode::kStatesAfter>, state_data<State>(*a.state), 1, 0);
  if (columns.empty()) return scan(gdn_scan_kernel<kRows, State, ScanMode::kTokens>, state_data<State>(*a.state), 1, 0);
  for_each_column_group<State>(columns, state_data<State>, [&](size_t b0, size_t n, const ColumnPointers<State>& states) {
    scan(gdn_scan_kernel<kRows, State, ScanMode::kColumns>, states, n, static_cast<int64_t>(b0));
  });
}

template <int kRows>
void launch_scan_rows(const GdnScanArgs& a, const GdnCoreExtras& x, cudaStream_t stream, std::span<Tensor* const> columns) {
  if (a.state->dtype() == DType::BF16)
    launch_scan_typed<kRows, uint16_t>(a, x, stream, columns);
  else
    launch_scan_typed<kRows, float>(a, x, stream, columns);
}

// a.state is the state of every column's type (columns[0] with columns).
void launch_scan(const GdnScanArgs& a, cudaStream_t stream, const GdnCoreExtras& x = {},
                 std::span<Tensor* const> columns = {}) {
  if (a.dk <= 4 * kStepWarps) return launch_scan_rows<4>(a, x, stream, columns);
  if (a.dk <= 16 * kStepWarps) return launch_scan_rows<16>(a, x, stream, columns);
  if (a.dk <= 64 * kStepWarps) return launch_scan_rows<64>(a, x, stream, columns);
  fail("gdn_recurrent: key heads of ", a.dk, " exceed the CUDA kernel's ", 64 * kStepWarps);
}

constexpr int kChunk = 64;  // tokens per chunk, as the CPU and reference backends
constexpr int kChunkThreads = 256;
// Value columns per block of the state pass: 16 puts nv·dv/16 blocks (256 for the model) on the
// GPU, two an SM, where 32 left one an SM waiting on its panel loads.
constexpr int kPassCols = 16;
constexpr int64_t kRoundChunks = 32;  // chunks prepared per round: bounds the scratch

// What the state pass needs of each (chunk, v head) of a round, item = chunk·nv + head; G is the
// within-chunk cumulative log decay and L the chunk's last token (padding tokens have g = β = 0).
struct ChunkTerms {
  float* Wk;     // [64][dk] (I + A)^-1 diag(β e^G) K, A[t][s] = β_t (k_t·k_s) e^(G_t − G_s) for s < t
  float* U;      // [64][dv] (I + A)^-1 diag(β) V
  float* Qd;     // [64][dk] q_t e^(G_t)
  float* Kd;     // [64][dk] k_t e^(G_L − G_t)
  float* P;      // [64][64] (q_t·k_s) e^(G_t − G_s) for s <= t, else 0
  float* decay;  // [1] e^(G_L)
};

size_t prep_shared_bytes(int64_t dk, int64_t dv) {
  return kChunk * sizeof(double) + 4 * kChunk * sizeof(float) +
         kChunk * (dk + 1 + std::max(dk, dv) + 1 + kChunk) * sizeof(float);
}

size_t simt_pass_shared_bytes(int64_t dk) {
  return (dk * kPassCols + kChunk * (dk + 1) + kChunk * (kChunk + 1) + kChunk * kPassCols) * sizeof(float);
}

// Grid (chunks of the round, nv). Shared: G, the per-token factors, k [64][dk+1], q then v
// [64][max(dk,dv)+1], and A by columns, Ac[s][t] = A[t][s] [64][64] (rows 16-byte aligned for the
// solve's float4 reads).
__global__ void __launch_bounds__(kChunkThreads)
    gdn_chunk_prep_kernel(const float* __restrict__ qkv, const float* __restrict__ g, const float* __restrict__ beta,
                          int64_t T, int64_t first_chunk, int64_t nk, int64_t nv, int64_t dk, int64_t dv,
                          ChunkTerms terms) {
  grid_dependency_wait();
  extern __shared__ double shared_d[];
  constexpr int kWarps = kChunkThreads / 32;
  const int64_t h = blockIdx.y, kh = h % nk, t0 = (first_chunk + blockIdx.x) * kChunk;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * nv + h, C = 2 * nk * dk + nv * dv;
  const int L = static_cast<int>(T - t0 < kChunk ? T - t0 : kChunk);
  const int64_t ldk = dk + 1, ldq = (dk > dv ? dk : dv) + 1;
  double* G = shared_d;                              // [64]
  float* bt = reinterpret_cast<float*>(G + kChunk);  // [64] β
  float* eG = bt + kChunk;                           // [64] e^(G_t)
  float* eL = eG + kChunk;                           // [64] e^(G_L − G_t)
  float* bg = eL + kChunk;                           // [64] β e^(G_t)
  float* Ks = bg + kChunk;                           // [64][ldk] k, then Wk's right-hand side
  float* QV = Ks + kChunk * ldk;                     // [64][ldq] q, then U's right-hand side
  float* Ac = QV + kChunk * ldq;                     // [64][64]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // Warp 0 asks for the gates of tokens lane and lane + 32 first, so that they arrive with q and k.
  float gate[2] = {}, b[2] = {};
  if (warp == 0)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      if (const int t = lane + 32 * half; t < L) gate[half] = g[(t0 + t) * nv + h], b[half] = beta[(t0 + t) * nv + h];

  // q and k to shared, a warp per token, by cp.async so that all of a warp's copies are in flight
  // at once; padding rows are 0. The token's v row goes to L2 for the right-hand side of U.
  for (int t = warp; t < kChunk; t += kWarps) {
    float *q = QV + t * ldq, *k = Ks + t * ldk;
    if (t < L) {
      const float* row = qkv + (t0 + t) * C;
      for (int64_t i = lane; i < dk; i += 32) {
        cp_async_4(q + i, row + kh * dk + i);
        cp_async_4(k + i, row + nk * dk + kh * dk + i);
      }
      prefetch_l2(row + 2 * nk * dk + h * dv, dv * sizeof(float), lane, 32);
    } else {
      for (int64_t i = lane; i < dk; i += 32) q[i] = k[i] = 0.0f;
    }
  }
  cp_async_commit();
  cp_async_wait<0>();

  // q and k l2-normalised (q also scaled by 1/sqrt(dk)); a lane reads back only what it copied, so
  // no barrier is needed.
  for (int t = warp; t < kChunk; t += kWarps) {
    float ssq = 0, ssk = 0;
    for (int64_t i = lane; i < dk; i += 32) {
      const float q = QV[t * ldq + i], k = Ks[t * ldk + i];
      ssq += q * q;
      ssk += k * k;
    }
    ssq = warp_sum(ssq);
    ssk = warp_sum(ssk);
    const float rq = static_cast<float>(1.0 / sqrt(static_cast<double>(dk)) / sqrt(static_cast<double>(ssq) + 1e-6));
    const float rk = static_cast<float>(1.0 / sqrt(static_cast<double>(ssk) + 1e-6));
    for (int64_t i = lane; i < dk; i += 32) {
      QV[t * ldq + i] *= rq;
      Ks[t * ldk + i] *= rk;
    }
  }

  // G, the inclusive sum of g in FP64, by warp 0: the two halves of the chunk scanned side by side,
  // then the upper half offset by the lower half's total. Padding tokens add g = 0.
  if (warp == 0) {
    double run[2] = {gate[0], gate[1]};
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const double lo = __shfl_up_sync(0xffffffffu, run[0], d), hi = __shfl_up_sync(0xffffffffu, run[1], d);
      if (lane >= d) run[0] += lo, run[1] += hi;
    }
    run[1] += __shfl_sync(0xffffffffu, run[0], 31);
    const double last = __shfl_sync(0xffffffffu, run[1], 31);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int t = lane + 32 * half;
      const double e = exp(run[half]);
      G[t] = run[half];
      bt[t] = b[half];
      eG[t] = static_cast<float>(e);
      eL[t] = static_cast<float>(exp(last - run[half]));
      bg[t] = static_cast<float>(b[half] * e);
    }
    if (lane == 0) terms.decay[item] = static_cast<float>(exp(last));
  }
  __syncthreads();

  // k·kᵀ and q·kᵀ, 4×4 entries per thread (rows t = ty + 16r, columns s = tx + 16c), decayed into
  // Ac (shared) and P (scratch). k·kᵀ is symmetric, so the entry (t, s) with t < s is A[s][t], which
  // Ac holds at [t][s]: 16 lanes store 16 consecutive floats.
  {
    const int tx = tid % 16, ty = tid / 16;
    float kk[4][4] = {}, qk[4][4] = {};
    for (int64_t i = 0; i < dk; ++i) {
      float kt[4], qt[4], ks[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        kt[r] = Ks[(ty + 16 * r) * ldk + i];
        qt[r] = QV[(ty + 16 * r) * ldq + i];
        ks[r] = Ks[(tx + 16 * r) * ldk + i];
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          kk[r][c] = fmaf(kt[r], ks[c], kk[r][c]);
          qk[r][c] = fmaf(qt[r], ks[c], qk[r][c]);
        }
    }
    float* P = terms.P + item * kChunk * kChunk;
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int t = ty + 16 * r, s = tx + 16 * c;
        const double d = exp(s <= t ? G[t] - G[s] : G[s] - G[t]);
        Ac[t * kChunk + s] = t < s ? static_cast<float>(bt[s] * static_cast<double>(kk[r][c]) * d) : 0.0f;
        P[t * kChunk + s] = s <= t ? static_cast<float>(qk[r][c] * d) : 0.0f;
      }
  }
  __syncthreads();

  // Qd and Kd to the scratch; then the right-hand sides: diag(β e^G) k for Wk in place of k, and
  // diag(β) v for U in place of q. A warp per token again: a lane overwrites only q values it has
  // read itself.
  float* Qd = terms.Qd + item * kChunk * dk;
  float* Kd = terms.Kd + item * kChunk * dk;
  for (int t = warp; t < kChunk; t += kWarps)
    for (int64_t i = lane; i < dk; i += 32) {
      const float k = Ks[t * ldk + i];
      Qd[t * dk + i] = QV[t * ldq + i] * eG[t];
      Kd[t * dk + i] = k * eL[t];
      Ks[t * ldk + i] = k * bg[t];
    }
  for (int64_t j = lane; j < dv; j += 32)
#pragma unroll
    for (int r = 0; r < kChunk / kWarps; ++r) {  // the lane's tokens innermost: their loads overlap
      const int t = warp + kWarps * r;
      QV[t * ldq + j] = t < L ? bt[t] * qkv[(t0 + t) * C + 2 * nk * dk + h * dv + j] : 0.0f;
    }
  __syncthreads();

  // (I + A) X = RHS by forward substitution, a thread per column of [Wk | U] (columns are
  // independent), the column in registers. Column-oriented: once x_s is final it is subtracted from
  // every later row, so a step's FMAs are independent of each other, and each x_t still takes its
  // terms in the order s = 0, 1, ... of the row-by-row form. Column s of A is one float4 broadcast
  // per 4 rows. The results go from registers to the scratch, a warp's 32 columns one row at a time.
  for (int64_t col = tid; col < dk + dv; col += kChunkThreads) {
    const bool is_k = col < dk;
    const float* X = is_k ? Ks + col : QV + (col - dk);
    const int64_t ld = is_k ? ldk : ldq;
    float x[kChunk];
#pragma unroll
    for (int t = 0; t < kChunk; ++t) x[t] = X[t * ld];
#pragma unroll
    for (int s = 0; s < kChunk - 1; ++s) {
#pragma unroll
      for (int t4 = (s + 1) / 4 * 4; t4 < kChunk; t4 += 4) {
        const float4 a = *reinterpret_cast<const float4*>(Ac + s * kChunk + t4);
        const float as[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (t4 + e > s) x[t4 + e] = fmaf(-as[e], x[s], x[t4 + e]);
      }
      // Without this the compiler hoists later steps' reads of A above these FMAs and runs out of
      // registers (255 and spills, against 106).
      asm volatile("" ::: "memory");
    }
    float* out = is_k ? terms.Wk + item * kChunk * dk + col : terms.U + item * kChunk * dv + (col - dk);
    const int64_t ld_out = is_k ? dk : dv;
#pragma unroll
    for (int t = 0; t < kChunk; ++t) out[t * ld_out] = x[t];
  }
}

// Grid (nv, value-column blocks of kCols): carries S[:, j0 .. j0+kCols-1] of one head through the
// chunks of the round with FP32 FMAs (for the shapes mma_pass_fits refuses). Per chunk, with
// kCols / 4 outputs per thread (rows ty + 32r, columns tx + 8c):
//   Vn = U − Wk·S     the part of the new values the carried state does not already predict
//   O  = Qd·S + P·Vn
//   S  = e^(G_L)·S + Kdᵀ·Vn
// acc[r][c] += Σ_i X[ty + 32r][i]·S[i][tx + 8c]: the thread's 2 × kCols/8 tile of a panel (rows of
// ldk) times the state slice (rows of kCols).
template <int kCols>
__device__ __forceinline__ void panel_times_state(const float* X, int64_t ldk, const float* S, int64_t dk, int tx,
                                                  int ty, float (&acc)[2][kCols / 8]) {
  for (int64_t i = 0; i < dk; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < kCols / 8; ++c) acc[r][c] = fmaf(X[(ty + 32 * r) * ldk + i], S[i * kCols + tx + 8 * c], acc[r][c]);
}

template <int kCols>
__global__ void __launch_bounds__(kChunkThreads)
    gdn_state_pass_kernel(ChunkTerms terms, int64_t T, int64_t first_chunk, int64_t n_chunks, int64_t nv, int64_t dk,
                          int64_t dv, float* __restrict__ state, float* __restrict__ out) {
  grid_dependency_wait();
  extern __shared__ float shared_f[];
  const int64_t h = blockIdx.x, j0 = static_cast<int64_t>(blockIdx.y) * kCols, ldk = dk + 1;
  const int nj = static_cast<int>(dv - j0 < kCols ? dv - j0 : kCols);
  float* S = shared_f;                     // [dk][kCols]
  float* X = S + dk * kCols;           // [64][ldk]: Wk, then Qd, then Kd
  float* Pm = X + kChunk * ldk;            // [64][65]
  float* Vn = Pm + kChunk * (kChunk + 1);  // [64][kCols]
  const int tid = threadIdx.x, tx = tid % 8, ty = tid / 8;
  float* Sh = state + h * dk * dv + j0;
  for (int64_t idx = tid; idx < dk * kCols; idx += kChunkThreads)
    S[idx] = idx % kCols < nj ? Sh[(idx / kCols) * dv + idx % kCols] : 0.0f;
  auto load_panel = [&](const float* src) {
    for (int64_t idx = tid; idx < kChunk * dk; idx += kChunkThreads) X[(idx / dk) * ldk + idx % dk] = src[idx];
  };

  for (int64_t rc = 0; rc < n_chunks; ++rc) {
    const int64_t item = rc * nv + h, t0 = (first_chunk + rc) * kChunk;
    const int L = static_cast<int>(T - t0 < kChunk ? T - t0 : kChunk);
    load_panel(terms.Wk + item * kChunk * dk);
    for (int idx = tid; idx < kChunk * kChunk; idx += kChunkThreads)
      Pm[(idx / kChunk) * (kChunk + 1) + idx % kChunk] = terms.P[item * kChunk * kChunk + idx];
    for (int idx = tid; idx < kChunk * kCols; idx += kChunkThreads)
      Vn[idx] =
          idx % kCols < nj ? terms.U[item * kChunk * dv + (idx / kCols) * dv + j0 + idx % kCols] : 0.0f;
    __syncthreads();
    {
      float acc[2][kCols / 8] = {};
      panel_times_state<kCols>(X, ldk, S, dk, tx, ty, acc);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < kCols / 8; ++c) Vn[(ty + 32 * r) * kCols + tx + 8 * c] -= acc[r][c];
    }
    __syncthreads();
    load_panel(terms.Qd + item * kChunk * dk);
    __syncthreads();
    {
      float acc[2][kCols / 8] = {};
      panel_times_state<kCols>(X, ldk, S, dk, tx, ty, acc);
      for (int s = 0; s < kChunk; ++s)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int c = 0; c < kCols / 8; ++c)
            acc[r][c] = fmaf(Pm[(ty + 32 * r) * (kChunk + 1) + s], Vn[s * kCols + tx + 8 * c], acc[r][c]);
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < kCols / 8; ++c) {
          const int t = ty + 32 * r, j = tx + 8 * c;
          if (t < L && j < nj) out[(t0 + t) * nv * dv + h * dv + j0 + j] = acc[r][c];
        }
    }
    __syncthreads();
    load_panel(terms.Kd + item * kChunk * dk);
    __syncthreads();
    const float decay = terms.decay[item];
    for (int64_t i0 = 0; i0 < dk; i0 += kChunk) {
      float acc[2][kCols / 8] = {};
      for (int s = 0; s < kChunk; ++s)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t i = i0 + ty + 32 * r;
          const float k = i < dk ? X[s * ldk + i] : 0.0f;
#pragma unroll
          for (int c = 0; c < kCols / 8; ++c) acc[r][c] = fmaf(k, Vn[s * kCols + tx + 8 * c], acc[r][c]);
        }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t i = i0 + ty + 32 * r;
        if (i < dk)
#pragma unroll
          for (int c = 0; c < kCols / 8; ++c)
            S[i * kCols + tx + 8 * c] = fmaf(decay, S[i * kCols + tx + 8 * c], acc[r][c]);
      }
    }
    __syncthreads();
  }
  for (int64_t idx = tid; idx < dk * kCols; idx += kChunkThreads)
    if (idx % kCols < nj) Sh[(idx / kCols) * dv + idx % kCols] = S[idx];
}

// The tensor-core state pass (mma_pass_fits): the same grid, block and products as
// gdn_state_pass_kernel, on m16n8k8 TF32 mma.sync with every operand split into hi + lo
// (cuda_mma.cuh), so the products keep FP32 accuracy. Each warp owns output tiles:
//   1. Vn = U − Wk·S          rows 16·(w/2) .., columns 8·(w%2) .. of the 64 × 16 result
//   2. O  = Qd·S + P·Vn       the same tile
//   3. S  = e^(G_L)·S + Kdᵀ·Vn rows 16·(w + 8q) .. of the dk × 16 state, both column halves, so
//                              the Kd fragment is split once for two tiles
// Warp w keeps its rows of S in registers (FP32, accumulator layout) for the whole pass; shared
// memory holds S already split, for the 4 warps × 2 products that read each value per chunk, and Vn
// in FP32. The panels stream through two buffers with cp.async, each phase overlapping the next
// one's load: Qd and P while phase 1 runs, Kd while phase 2 runs, the next chunk's Wk while phase 3
// runs. Each 32 values of k are summed into a fresh partial (the tensor cores may truncate when
// they accumulate) and added to the FP32 accumulator with an ordinary add.
//
// Pitches keep the fragment loads free of bank conflicts: Wk, Qd and P are read along rows (lanes
// g, t at g·pitch + t: pitch ≡ 4 or 20 mod 32), Kd down its columns (t·pitch + g: pitch ≡ 8 or 24
// mod 32), Vn and the split state as B fragments (t·pitch + g, 8-byte pairs for the state).
constexpr int kMmaStatePitch = 20;  // {hi, lo} pairs a state row
constexpr int kMmaVnPitch = 24;
constexpr int kMmaPPitch = kChunk + 4;
constexpr int kMmaMaxKeyTiles = 2;  // m16 tiles of the state per warp: dk <= 16 · 8 warps · 2

// dk in m16 tiles of the state, at most two a warp; dv even, so U, the output and the state move
// in float2 pairs (a block's columns from nj on, nj even, are masked a pair at a time). dk = 128
// takes 113,664 bytes of shared memory: two blocks an SM.
bool mma_pass_fits(int64_t dk, int64_t dv) { return dk > 0 && dk % 16 == 0 && dk <= 256 && dv % 2 == 0; }

size_t mma_pass_shared_bytes(int64_t dk) {
  return dk * kMmaStatePitch * sizeof(uint2) + kChunk * (kMmaVnPitch + kMmaPPitch + 2 * (dk + 8)) * sizeof(float);
}

// Shared memory of the state pass that chunked_scan picks for the shape.
size_t pass_shared_bytes(int64_t dk, int64_t dv) {
  return mma_pass_fits(dk, dv) ? mma_pass_shared_bytes(dk) : simt_pass_shared_bytes(dk);
}

// A fragment, split, of rows r0 .. r0+15 and columns k0 .. k0+7 of a row-major array.
__device__ __forceinline__ void a_fragment_rows(const float* X, int ld, int r0, int k0, int g, int t,
                                                SplitTf32 (&a)[4]) {
  const float* p = X + (r0 + g) * ld + k0 + t;
  a[0] = split_tf32(p[0]);
  a[1] = split_tf32(p[8 * ld]);
  a[2] = split_tf32(p[4]);
  a[3] = split_tf32(p[8 * ld + 4]);
}

// The same of the transpose, A[i][s] = X[s][i]: rows i0 .. of A are columns of X.
__device__ __forceinline__ void a_fragment_cols(const float* X, int ld, int i0, int s0, int g, int t,
                                                SplitTf32 (&a)[4]) {
  const float* p = X + (s0 + t) * ld + i0 + g;
  a[0] = split_tf32(p[0]);
  a[1] = split_tf32(p[8]);
  a[2] = split_tf32(p[4 * ld]);
  a[3] = split_tf32(p[4 * ld + 8]);
}

// B fragment, split, of rows k0 .. k0+7 and columns n0 .. n0+7 of a row-major array.
__device__ __forceinline__ void b_fragment(const float* Y, int ld, int k0, int n0, int g, int t, SplitTf32 (&b)[2]) {
  const float* p = Y + (k0 + t) * ld + n0 + g;
  b[0] = split_tf32(p[0]);
  b[1] = split_tf32(p[4 * ld]);
}

// acc += X·S for the warp's tile (rows r0 .., columns n0 ..) of a panel (rows of ld) times the
// split state.
__device__ __forceinline__ void panel_times_split_state(const float* X, int ld, const uint2* S2, int dk, int r0,
                                                        int n0, int g, int t, float (&acc)[4]) {
#pragma unroll 1
  for (int k0 = 0; k0 < dk; k0 += 32) {
    float part[4] = {};
#pragma unroll
    for (int kk = 0; kk < 32; kk += 8) {
      if (k0 + kk >= dk) break;  // dk is a multiple of 16, not always of 32
      SplitTf32 a[4];
      a_fragment_rows(X, ld, r0, k0 + kk, g, t, a);
      const uint2* p = S2 + (k0 + kk + t) * kMmaStatePitch + n0 + g;
      const uint2 s0 = p[0], s1 = p[4 * kMmaStatePitch];
      const SplitTf32 b[2] = {{s0.x, s0.y}, {s1.x, s1.y}};
      mma_split_tf32(part, a, b);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] += part[e];
  }
}

__global__ void __launch_bounds__(kChunkThreads, 2)
    gdn_state_pass_mma_kernel(ChunkTerms terms, int64_t T, int64_t first_chunk, int64_t n_chunks, int64_t nv,
                              int64_t dk64, int64_t dv, float* __restrict__ state, float* __restrict__ out) {
  grid_dependency_wait();
  extern __shared__ __align__(16) float shared_mma[];
  const int dk = static_cast<int>(dk64), ld_rows = dk + 4, ld_cols = dk + 8;
  const int64_t h = blockIdx.x, j0 = static_cast<int64_t>(blockIdx.y) * kPassCols;
  const int nj = static_cast<int>(dv - j0 < kPassCols ? dv - j0 : kPassCols);  // even, as dv
  uint2* S2 = reinterpret_cast<uint2*>(shared_mma);                            // [dk][kMmaStatePitch]
  float* Vn = shared_mma + 2 * dk * kMmaStatePitch;                            // [64][kMmaVnPitch]
  float* Pm = Vn + kChunk * kMmaVnPitch;                                       // [64][kMmaPPitch]
  float* const panels = Pm + kChunk * kMmaPPitch;                             // 2 × [64][ld_cols]
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, t = lane % 4;
  const int tile_row = 16 * (warp / 2), tile_col = 8 * (warp % 2);  // phases 1 and 2

  // The warp's rows of S, accumulator layout: S_own[q][n][e] is row 16·(warp + 8q) + g + 8·(e/2),
  // column 8n + 2t + e%2. Columns from nj on stay 0 (so do those of U and Vn).
  float S_own[kMmaMaxKeyTiles][2][4] = {};
  float* Sh = state + h * dk64 * dv + j0;
  // fn(pair, row, col) for the warp's pairs of state values: pair = S_own[q][n] + 2r, row i0 + g +
  // 8r of key tile q, columns col and col + 1 (col = 8n + 2t).
  auto for_state_pairs = [&](auto&& fn) {
#pragma unroll
    for (int q = 0; q < kMmaMaxKeyTiles; ++q) {
      const int i0 = 16 * (warp + 8 * q);
      if (i0 >= dk) break;
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int r = 0; r < 2; ++r) fn(S_own[q][n] + 2 * r, i0 + g + 8 * r, 8 * n + 2 * t);
    }
  };
  for_state_pairs([&](float* pair, int row, int col) {
    if (col >= nj) return;
    const float2 v = *reinterpret_cast<const float2*>(Sh + row * dv + col);
    pair[0] = v.x, pair[1] = v.y;
  });
  auto store_split_state = [&] {
    for_state_pairs([&](const float* pair, int row, int col) {
      const SplitTf32 x = split_tf32(pair[0]), y = split_tf32(pair[1]);
      *reinterpret_cast<uint4*>(S2 + row * kMmaStatePitch + col) = make_uint4(x.hi, x.lo, y.hi, y.lo);
    });
  };
  store_split_state();

  // A [64][dk] panel into rows of ld, 16 bytes a copy.
  const int quads = dk / 4;
  auto load_panel = [&](float* dst, int ld, const float* src) {
    for (int idx = tid; idx < kChunk * quads; idx += kChunkThreads) {
      const int r = idx / quads;
      cp_async_16(dst + r * ld + 4 * (idx - r * quads), src + 4 * idx);
    }
  };
  const int64_t panel = kChunk * dk64;
  load_panel(panels, ld_rows, terms.Wk + h * panel);
  cp_async_commit();

  for (int64_t rc = 0; rc < n_chunks; ++rc) {
    const int64_t item = rc * nv + h, t0 = (first_chunk + rc) * kChunk;
    const int L = static_cast<int>(T - t0 < kChunk ? T - t0 : kChunk);
    // Wk and then Kd in one buffer, Qd and then the next chunk's Wk in the other.
    float* const own = panels + (rc % 2) * kChunk * ld_cols;
    float* const other = panels + (1 - rc % 2) * kChunk * ld_cols;
    float u[4] = {};  // U at the warp's tile, read now for phase 1
    const float* Ui = terms.U + item * kChunk * dv + j0;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (const int col = tile_col + 2 * t; col < nj) {
        const float2 v = *reinterpret_cast<const float2*>(Ui + (tile_row + g + 8 * r) * dv + col);
        u[2 * r] = v.x, u[2 * r + 1] = v.y;
      }
    const float decay = terms.decay[item];

    cp_async_wait<0>();  // Wk
    __syncthreads();     // ... from every thread; the previous chunk's phase 3 is done with Vn and `other`
    load_panel(other, ld_rows, terms.Qd + item * panel);
    for (int idx = tid; idx < kChunk * kChunk / 4; idx += kChunkThreads)
      cp_async_16(Pm + (idx / 16) * kMmaPPitch + 4 * (idx % 16), terms.P + item * kChunk * kChunk + 4 * idx);
    cp_async_commit();
    {  // 1. Vn = U − Wk·S
      float acc[4] = {};
      panel_times_split_state(own, ld_rows, S2, dk, tile_row, tile_col, g, t, acc);
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<float2*>(Vn + (tile_row + g + 8 * r) * kMmaVnPitch + tile_col + 2 * t) =
            make_float2(u[2 * r] - acc[2 * r], u[2 * r + 1] - acc[2 * r + 1]);
    }

    cp_async_wait<0>();  // Qd and P
    __syncthreads();     // ... and Vn from every thread; Wk is read
    load_panel(own, ld_cols, terms.Kd + item * panel);
    cp_async_commit();
    {  // 2. O = Qd·S + P·Vn
      float o[4] = {};
      panel_times_split_state(other, ld_rows, S2, dk, tile_row, tile_col, g, t, o);
#pragma unroll
      for (int s0 = 0; s0 < kChunk; s0 += 32) {
        float part[4] = {};
#pragma unroll
        for (int kk = 0; kk < 32; kk += 8) {
          SplitTf32 a[4], b[2];
          a_fragment_rows(Pm, kMmaPPitch, tile_row, s0 + kk, g, t, a);
          b_fragment(Vn, kMmaVnPitch, s0 + kk, tile_col, g, t, b);
          mma_split_tf32(part, a, b);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) o[e] += part[e];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
        if (const int row = tile_row + g + 8 * r, col = tile_col + 2 * t; row < L && col < nj)
          *reinterpret_cast<float2*>(out + (t0 + row) * nv * dv + h * dv + j0 + col) =
              make_float2(o[2 * r], o[2 * r + 1]);
    }

    cp_async_wait<0>();  // Kd
    __syncthreads();     // ... from every thread; Qd and the split state are read
    if (rc + 1 < n_chunks) {
      load_panel(other, ld_rows, terms.Wk + (item + nv) * panel);
      cp_async_commit();
    }
    // 3. S = decay·S + Kdᵀ·Vn
#pragma unroll
    for (int q = 0; q < kMmaMaxKeyTiles; ++q) {
      const int i0 = 16 * (warp + 8 * q);
      if (i0 >= dk) break;
      float acc[2][4] = {};
#pragma unroll 1  // unrolled, the loads hoisted ahead spill
      for (int s0 = 0; s0 < kChunk; s0 += 32) {
        float part[2][4] = {};
#pragma unroll
        for (int kk = 0; kk < 32; kk += 8) {
          SplitTf32 a[4];
          a_fragment_cols(own, ld_cols, i0, s0 + kk, g, t, a);
#pragma unroll
          for (int n = 0; n < 2; ++n) {
            SplitTf32 b[2];
            b_fragment(Vn, kMmaVnPitch, s0 + kk, 8 * n, g, t, b);
            mma_split_tf32(part[n], a, b);
          }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[n][e] += part[n][e];
      }
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) S_own[q][n][e] = fmaf(decay, S_own[q][n][e], acc[n][e]);
    }
    store_split_state();  // read after the next chunk's first barrier
  }

  for_state_pairs([&](const float* pair, int row, int col) {
    if (col < nj) *reinterpret_cast<float2*>(Sh + row * dv + col) = make_float2(pair[0], pair[1]);
  });
}

// Opts a kernel into more than 48 KB of dynamic shared memory where it needs it.
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* what) {
  if (bytes > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
}

}  // namespace

void CudaBackend::gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias,
                            Tensor& g, Tensor& beta) {
  OpScope scope(profiler_, "gdn_gates", alpha.ne(1), stream_);
  check_gdn_gates(alpha, beta_raw, ssm_a, dt_bias, g, beta);
  int64_t nv = alpha.ne(0), T = alpha.ne(1);
  if (nv * T == 0) return;
  launch(stream_, "gdn_gates_kernel", gdn_gates_kernel, blocks_for(nv * T, kThreads), kThreads, 0, alpha.f32(), beta_raw.f32(), values(ssm_a), values(dt_bias), nv, T, g.f32(), beta.f32());
}

void CudaBackend::gdn_recurrent(const GdnScanArgs& a) {
  OpScope scope(profiler_, "gdn_recurrent", a.qkv->ne(1), stream_);
  check_gdn_scan(a, "gdn_recurrent");
  if (a.qkv->ne(1) > 0) launch_scan(a, stream_);
}

// gdn_core in the scan kernel: one token (T = 1), or T tokens with a.states_after; columns: one
// token each of several sequences.
void CudaBackend::gdn_core_step(const GdnCoreArgs& a, std::span<Tensor* const> columns) {
  check_gdn_gates(*a.alpha, *a.beta_raw, *a.ssm_a, *a.dt_bias, *a.g, *a.beta);
  check_gated_rms_norm(*a.core, *a.z, *a.norm, *a.out);
  if (a.norm->n_elements() != a.dv) fail("gdn_core: norm weight of ", a.norm->n_elements(), " for value heads of ", a.dv);
  GdnScanArgs scan{.qkv = a.qkv, .g = a.g, .beta = a.beta, .state = columns.empty() ? a.state : columns[0],
                   .out = a.core, .n_k_heads = a.n_k_heads, .n_v_heads = a.n_v_heads, .dk = a.dk, .dv = a.dv};
  for (Tensor* state : columns) {
    GdnScanArgs column = scan;
    column.state = state;
    check_gdn_scan(column, "gdn_core_columns");
    if (state->dtype() != scan.state->dtype()) fail("gdn_core_columns: the sequences' states differ in type");
  }
  if (columns.empty()) check_gdn_scan(scan, "gdn_core");
  const GdnCoreExtras x{.alpha = a.alpha->f32(), .beta_raw = a.beta_raw->f32(), .A = values(*a.ssm_a),
                        .dt = values(*a.dt_bias), .g_out = a.g->f32(), .beta_out = a.beta->f32(), .z = a.z->f32(),
                        .norm_w = values(*a.norm), .eps = a.eps, .normed = a.out->f32(),
                        .normed_q8 = a.dv % 32 == 0 ? q8_output(*a.out) : QuantizeTarget{},
                        .done = counters(a.n_v_heads * (columns.empty() ? 1 : kMaxColumns)),
                        .states_after = !a.states_after                      ? nullptr
                                        : a.state->dtype() == DType::BF16 ? static_cast<void*>(a.states_after->bf16())
                                                                          : static_cast<void*>(a.states_after->f32())};
  launch_scan(scan, stream_, x, columns);
}

void CudaBackend::gdn_core(const GdnCoreArgs& a) {
  if (a.qkv->ne(1) != 1 && !a.states_after) return Backend::gdn_core(a);
  OpScope scope(profiler_, "gdn_core", a.qkv->ne(1), stream_);
  if (a.states_after) check_states_after(a);
  gdn_core_step(a, {});
}

void CudaBackend::gdn_core_columns(const GdnCoreArgs& a, std::span<Tensor* const> states) {
  OpScope scope(profiler_, "gdn_core_columns", a.qkv->ne(1), stream_);
  check_columns(a.qkv->ne(1), states.size(), "gdn_core_columns");
  if (!states.empty()) gdn_core_step(a, states);
}

void CudaBackend::gdn_chunked(const GdnScanArgs& a) {
  OpScope scope(profiler_, "gdn_chunked", a.qkv->ne(1), stream_);
  check_gdn_scan(a, "gdn_chunked");
  if (a.qkv->ne(1) == 0) return;
  const size_t prep_bytes = prep_shared_bytes(a.dk, a.dv), pass_bytes = pass_shared_bytes(a.dk, a.dv);
  int device = 0, max_shared = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "shared memory limit");
  if (std::max(prep_bytes, pass_bytes) > static_cast<size_t>(max_shared)) return launch_scan(a, stream_);
  if (a.state->dtype() == DType::BF16) {  // the state pass carries FP32: widen, scan, round back once
    const int64_t n = a.state->n_elements();
    Tensor wide = scratch_f32(n).reshaped(a.state->ne());
    launch(stream_, "widen_bf16_kernel", widen_bf16_kernel, blocks_for(n, kThreads), kThreads, 0, a.state->bf16(), n, wide.f32());
    GdnScanArgs f32_state = a;
    f32_state.state = &wide;
    chunked_scan(f32_state, prep_bytes, pass_bytes);
    launch(stream_, "narrow_bf16_kernel", narrow_bf16_kernel, blocks_for(n, kThreads), kThreads, 0, wide.f32(), n, a.state->bf16());
    return;
  }
  chunked_scan(a, prep_bytes, pass_bytes);
}

// gdn_chunked's kernels with an FP32 state, after the checks.
void CudaBackend::chunked_scan(const GdnScanArgs& a, size_t prep_bytes, size_t pass_bytes) {
  const int64_t T = a.qkv->ne(1), nv = a.n_v_heads, dk = a.dk, dv = a.dv;
  allow_shared(gdn_chunk_prep_kernel, prep_bytes, "gdn_chunk_prep_kernel shared memory");
  const bool mma_pass = mma_pass_fits(dk, dv);
  if (mma_pass) {  // two blocks an SM need the largest shared-memory carveout
    allow_max_shared(gdn_state_pass_mma_kernel, pass_bytes, "gdn_state_pass_mma_kernel shared memory");
  } else {
    allow_shared(gdn_state_pass_kernel<kPassCols>, pass_bytes, "gdn_state_pass_kernel shared memory");
  }

  const int64_t n_chunks = (T + kChunk - 1) / kChunk, round = std::min(kRoundChunks, n_chunks), items = round * nv;
  Tensor scratch = scratch_f32(items * (kChunk * (3 * dk + dv) + kChunk * kChunk + 1));
  ChunkTerms terms;
  terms.Wk = scratch.f32();
  terms.Qd = terms.Wk + items * kChunk * dk;
  terms.Kd = terms.Qd + items * kChunk * dk;
  terms.U = terms.Kd + items * kChunk * dk;
  terms.P = terms.U + items * kChunk * dv;
  terms.decay = terms.P + items * kChunk * kChunk;
  for (int64_t c0 = 0; c0 < n_chunks; c0 += round) {
    const int64_t n = std::min(round, n_chunks - c0);
    launch(stream_, "gdn_chunk_prep_kernel", gdn_chunk_prep_kernel, dim3(static_cast<unsigned>(n), static_cast<unsigned>(nv)), kChunkThreads, prep_bytes, a.qkv->f32(), a.g->f32(), a.beta->f32(), T, c0, a.n_k_heads, nv, dk, dv, terms);
    const dim3 pass_grid(static_cast<unsigned>(nv), blocks_for(dv, kPassCols));
    if (mma_pass)
      launch(stream_, "gdn_state_pass_mma_kernel", gdn_state_pass_mma_kernel, pass_grid, kChunkThreads, pass_bytes, terms, T, c0, n, nv, dk, dv, a.state->f32(), a.out->f32());
    else
      launch(stream_, "gdn_state_pass_kernel", gdn_state_pass_kernel<kPassCols>, pass_grid, kChunkThreads, pass_bytes, terms, T, c0, n, nv, dk, dv, a.state->f32(), a.out->f32());
  }
}

void CudaBackend::gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) {
  OpScope scope(profiler_, "gated_rms_norm", -1, stream_);
  check_gated_rms_norm(x, z, w, out);
  int64_t dv = w.n_elements();
  int64_t n_groups = x.n_elements() / dv;
  if (n_groups == 0) return;
  const QuantizeTarget q8 = dv % 32 == 0 ? q8_output(out) : QuantizeTarget{};  // for the product after it
  auto by_warps = [&](auto kernel) {
    launch(stream_, "gated_rms_norm_warp_kernel", kernel, blocks_for(n_groups, 8), 256, 0, x.f32(), z.f32(), values(w), n_groups, eps, out.f32(), q8);
  };
  switch (dv % 128 == 0 ? dv / 128 : 0) {
    case 1: return by_warps(gated_rms_norm_warp_kernel<1>);
    case 2: return by_warps(gated_rms_norm_warp_kernel<2>);
    case 4: return by_warps(gated_rms_norm_warp_kernel<4>);
  }
  int threads = static_cast<int>(std::min<int64_t>(256, (dv + 31) / 32 * 32));
  launch(stream_, "gated_rms_norm_kernel", gated_rms_norm_kernel, static_cast<unsigned>(n_groups), threads, 0, x.f32(), z.f32(), values(w), dv, eps, out.f32(), q8);
}

}  // namespace regolith::cuda
