// CUDA hyper-connection read/write (model-spec §4.2). hc_read is the grouped norm, down
// projection + SiLU, up projection, sigmoid-weighted stream mix and inject weights. One token with
// four streams and matrices that have unit loaders (decode) runs it as two kernels, the norm
// folded into both by linearity: n = R·gamma·rinv_s on stream s, so a row's product with n is
// Σ_s rinv_s·(row·gamma·R over stream s). The first kernel takes down and inject
// rows a stream at a time (those per-stream dots, and Σ R² per stream); the second combines them
// into lo and the inject weights, then takes up rows with the mix and forms n itself. A pending
// write (hc_write_read) rides along: both kernels read R + w_s·y where they read R, and the second,
// the last to read R, stores it, so the write costs no launch of its own.
// Otherwise each step is a kernel over all tokens.
#include <type_traits>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_gemm_stacked.cuh"

namespace regolith::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void scaled_silu_kernel(float* v, int64_t n, double inv_s) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<float>(silu_d(v[i] * inv_s));
}

// x[d, t] = (1/S) Σ_s sigmoid(m[s·H + d, t]) · n[s·H + d, t]; grid per_token_grid(H, T).
__global__ void hc_mix_kernel(const float* m, const float* nrm, int64_t H, int64_t S, int64_t T, float* x) {
  grid_dependency_wait();
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, W = H * S;
  if (d >= H) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    double acc = 0;
    for (int64_t s = 0; s < S; ++s) acc += sigmoid_d(m[t * W + s * H + d]) * nrm[t * W + s * H + d];
    x[t * H + d] = static_cast<float>(acc / S);
  }
}

__global__ void inject_weights_kernel(float* v, int64_t n, double inv_s) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) v[i] = static_cast<float>(2.0 * sigmoid_d(v[i] * inv_s));
}

// R[t][s][d] += iw[t][s]·y[t][d] for every stream s; grid per_token_grid(H, T).
__global__ void hc_write_kernel(float* R, const float* y, const float* iw, int64_t H, int64_t S, int64_t T) {
  grid_dependency_wait();
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (d >= H) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    const float yv = y[t * H + d];
    for (int64_t s = 0; s < S; ++s) {
      float& r = R[(t * S + s) * H + d];
      r = written(r, iw[t * S + s], yv);
    }
  }
}

// The decode path: one token with four streams.
constexpr int kDecodeStreams = 4;
// Down/inject rows per block of the decode kernel, which takes one stream's share of them: 81 × 4
// blocks for an H200's 132 SMs at the model's 324 rows.
constexpr int kDownRows = 4;
constexpr int kDownMaxThreads = 256;
constexpr int kUpWarps = 4;  // positions per block of the up/mix kernel
// Tokens the decode kernels take at once: one (decode), two, or up to four (batched decode). H200,
// session 51: an instance for up to eight lost 6% at eight sequences against the generic form,
// which reads the rows for every step but holds less for each token.
constexpr int kMaxDecodeTokens = 4;
constexpr int64_t kMaxDecodeLo = 10240;  // floats of lo (every token's) in a block's shared memory: 40 KiB
constexpr int kMaxUnitLo = 32 * kUnit;  // lo of up rows with a unit a lane (at most 32 units)

// R and gamma over a run of 8 activations.
struct Run8 {
  float4 r[2], g[2];
};
__device__ __forceinline__ Run8 load_run(const float* __restrict__ R, const float* __restrict__ gamma) {
  Run8 v;
#pragma unroll
  for (int i = 0; i < 2; ++i) v.r[i] = reinterpret_cast<const float4*>(R)[i], v.g[i] = reinterpret_cast<const float4*>(gamma)[i];
  return v;
}

// A run of 8 activations, R[i] after the pending write w·y[i] when y is set: gr[i] = gamma[i]·R[i];
// returns Σ R[i]².
__device__ __forceinline__ float scaled_run(const Run8& v, const float* __restrict__ y, float w, float* gr) {
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float xs[4] = {v.r[i].x, v.r[i].y, v.r[i].z, v.r[i].w};
    const float gs[4] = {v.g[i].x, v.g[i].y, v.g[i].z, v.g[i].w};
    if (y) {
      const float4 t = reinterpret_cast<const float4*>(y)[i];
      const float ys[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) xs[j] = written(xs[j], w, ys[j]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) gr[4 * i + j] = gs[j] * xs[j], sq = fmaf(xs[j], xs[j], sq);
  }
  return sq;
}

// Decode, split by stream: with n = R·gamma·rinv_s on stream s, a row's product with n is
// Σ_s rinv_s·dot_s, dot_s = row·gamma·R over stream s. Block (i, s) finds dot_s of rows kRows·i ..
// of [down; inject] over the units of stream s (units_follow_streams), so it reads a quarter of R
// and gamma rather than all of them; part[(t·S + s)·n_rows + row] = dot_s of token t < T <= TB,
// and blocks (0, s) store Σ R² over stream s of each token. With a unit a thread (the model's
// rows) the rows are read once for all tokens; longer rows are fetched again for each token (from
// L2, where the first token's fetch left them). hc_up_mix_kernel combines the four. With y set, R
// is read as R + write_w[t·S + s]·y.
template <typename U, int kRows, int TB>
__global__ void __launch_bounds__(kDownMaxThreads) hc_down_inject_kernel(
    const uint8_t* __restrict__ down, const uint8_t* __restrict__ inject, uint64_t pitch, int64_t H, int64_t r, int T,
    const float* __restrict__ R, const float* __restrict__ y, const float* __restrict__ write_w,
    const float* __restrict__ gamma, float* __restrict__ part, float* __restrict__ sumsq) {
  constexpr int S = kDecodeStreams;
  const int64_t s = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * kRows, n_rows = r + (inject ? S : 0);
  const uint8_t* rows[kRows];
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const int64_t row = i0 + k;
    rows[k] = row >= n_rows ? nullptr : row < r ? down + row * pitch : inject + (row - r) * pitch;
  }
  const uint8_t* src[kRows];
  rows_to_fetch(rows, src);  // row i0 is present in every block
  const int64_t u_begin = s * H / kUnit + threadIdx.x, u_end = (s + 1) * H / kUnit;
  // With at most a unit a thread (the model's streams of 2,560 values: 160 units, 160 threads) its
  // rows' units are loaded before the wait; otherwise the rows go to L2 then.
  const bool one_unit = u_begin + blockDim.x >= u_end;
  typename U::Raw raw[kRows];
  if (!one_unit) {
#pragma unroll
    for (int k = 0; k < kRows; ++k)
      if (rows[k]) prefetch_l2(rows[k] + s * pitch / S, pitch / S);  // about the stream's share
  } else if (u_begin < u_end) {
#pragma unroll
    for (int k = 0; k < kRows; ++k) raw[k] = U::fetch(src[k], u_begin, S * H);
  }
  // With a pending write (y set) the previous kernel wrote only y: R and write_w come from the read
  // before the sublayer, so for one token a thread's one unit of R, gamma and write_w load before
  // the wait too.
  const bool early = TB == 1 && one_unit && y && u_begin < u_end;
  Run8 early_runs[2];
  int64_t early_x[2] = {};
  float early_w = 0.0f;
  if (early) {
    U::runs(u_begin, early_x[0], early_x[1]);
    early_runs[0] = load_run(R + early_x[0], gamma + early_x[0]), early_runs[1] = load_run(R + early_x[1], gamma + early_x[1]);
    early_w = write_w[s];
  }
  // Two tokens likewise: both tokens' units of R and write weights (gamma once, in early_runs), so
  // that the second token's loads do not wait behind the first. (Four tokens' took 174 registers,
  // which would leave an SM two blocks instead of five: the model's 324 blocks in two waves.)
  constexpr bool kEarlyTokens = TB == 2;
  constexpr int kTokens = kEarlyTokens ? TB : 1;
  const bool early_tokens = kEarlyTokens && one_unit && y && u_begin < u_end;
  float4 tokens_R[kTokens][2][2];  // [token][run][half]
  float tokens_w[kTokens] = {};
  if (early_tokens) {
    U::runs(u_begin, early_x[0], early_x[1]);
#pragma unroll
    for (int k = 0; k < 2; ++k) early_runs[k] = load_run(R + early_x[k], gamma + early_x[k]);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {
      if (t >= T) break;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float4* run = reinterpret_cast<const float4*>(R + t * S * H + early_x[k]);
        tokens_R[t][k][0] = run[0], tokens_R[t][k][1] = run[1];
      }
      tokens_w[t] = write_w[t * S + s];
    }
  }
  grid_dependency_wait();
  constexpr int kSums = kRows + 1;
  float sums[kSums] = {};  // a token's: the rows' dots, then Σ R²
  const auto add_unit = [&](int64_t u, int64_t x0, int64_t x1, const Run8& a, const Run8& b, const float* ys, float w) {
    float gr[16];
    sums[kRows] += scaled_run(a, ys ? ys + x0 : nullptr, w, gr) + scaled_run(b, ys ? ys + x1 : nullptr, w, gr + 8);
    const typename U::Sums gr_sums = U::sums(gr);
#pragma unroll
    for (int k = 0; k < kRows; ++k) sums[k] += U::dot(raw[k], u, gr, gr_sums);
  };
  // A token's sums from its R (Rt), its y at position i of stream s (ys[i]) and write weight w.
  const auto token_sums = [&](const float* Rt, const float* ys, float w) {
    if (early) return add_unit(u_begin, early_x[0], early_x[1], early_runs[0], early_runs[1], ys, w);
#pragma unroll 1
    for (int64_t u = u_begin; u < u_end; u += blockDim.x) {
      if (!one_unit)
#pragma unroll
        for (int k = 0; k < kRows; ++k) raw[k] = U::fetch(src[k], u, S * H);
      int64_t x0, x1;
      U::runs(u, x0, x1);
      add_unit(u, x0, x1, load_run(Rt + x0, gamma + x0), load_run(Rt + x1, gamma + x1), ys, w);
    }
  };
  if constexpr (TB == 1) {
    token_sums(R, y ? y - s * H : nullptr, early ? early_w : y ? write_w[s] : 0.0f);
    block_reduce_to_first(sums);
    if (threadIdx.x != 0) return;
#pragma unroll
    for (int k = 0; k < kRows; ++k)
      if (i0 + k < n_rows) part[s * n_rows + i0 + k] = sums[k];
    if (blockIdx.x == 0) sumsq[s] = sums[kRows];
    return;
  }
  // Each token's sums over the block: by warps, then over the warps in order (as
  // block_reduce_to_first adds them for one token).
  __shared__ float warp_sums[kDownMaxThreads / 32][TB][kSums];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const auto sums_of_token = [&](int t) {
    if constexpr (kEarlyTokens) {
      if (early_tokens) {
        Run8 a = early_runs[0], b = early_runs[1];  // gamma, with token t's R
        a.r[0] = tokens_R[t][0][0], a.r[1] = tokens_R[t][0][1], b.r[0] = tokens_R[t][1][0], b.r[1] = tokens_R[t][1][1];
        return add_unit(u_begin, early_x[0], early_x[1], a, b, y + (t - s) * H, tokens_w[t]);
      }
    }
    token_sums(R + t * S * H, y ? y + (t - s) * H : nullptr, y ? write_w[t * S + s] : 0.0f);
  };
  const auto token_warp_sums = [&](int t) {
#pragma unroll
    for (int k = 0; k < kSums; ++k) sums[k] = 0.0f;
    sums_of_token(t);
#pragma unroll
    for (int k = 0; k < kSums; ++k) {
      const float v = warp_sum(sums[k]);
      if (lane == 0) warp_sums[warp][t][k] = v;
    }
  };
  if constexpr (kEarlyTokens) {
#pragma unroll
    for (int t = 0; t < TB; ++t)
      if (t < T) token_warp_sums(t);
  } else {
#pragma unroll 1
    for (int t = 0; t < T; ++t) token_warp_sums(t);
  }
  __syncthreads();
  for (int j = threadIdx.x; j < T * kSums; j += blockDim.x) {
    const int t = j / kSums, k = j % kSums;
    float v = warp_sums[0][t][k];
    for (int w = 1; w < n_warps; ++w) v += warp_sums[w][t][k];
    if (k == kRows) {
      if (blockIdx.x == 0) sumsq[t * S + s] = v;
    } else if (i0 + k < n_rows) {
      part[(t * S + s) * n_rows + i0 + k] = v;
    }
  }
}

// Decode: x[d] = (1/S) Σ_s sigmoid(up[s·H + d]·lo) · n[s·H + d] of each token t < T <= TB, a
// warp per position d (kWarps to a block), S = 4 streams, n[s·H + d] = R·gamma·rinv_s. Every block
// first forms lo = silu(Σ_s rinv_s·part_s / S) of each token (shared memory) from
// hc_down_inject_kernel's per-stream dots and sums of squares; block 0 also writes the inject
// weights 2·sigmoid(Σ_s rinv_s·part_s / S). Up rows of at most 32 units are a unit a lane, loaded
// into registers before the wait on the previous kernel (kUnitInRegisters); longer ones are
// prefetched into L2 (and fetched from there for each token). With y set, R is first written
// (R += write_w[t·S + s]·y), a warp storing its position of each stream. Lane t·S + s forms
// token t's stream-s term (its loads go out with the up rows'), all tokens' at once, and each
// token's four are added in stream order. With x8 set
// (kWarps = 32), a block's positions are one Q8_0 chunk of each token's x, which it also writes
// for the next op's products in place of a quantization kernel. H200, paired, three rounds: the
// registers and the routed down kernel's items ahead together 197.2 -> 198.9 tok/s, the Q8_0
// codes 198.9 -> 205.2. In decode's instance (one token, up rows in registers, x8) the chain after
// the wait (1/rms, SiLU, the sigmoids) is FP32 (rsqrtf, expf), where FP64 rsqrt, exp and divisions
// took about 0.25 µs of dependent latency a call: H100, three paired rounds, decode 250.3 / 249.9 /
// 250.1 -> 253.0 / 253.0 / 253.0 tok/s. The other instances keep FP64 (prefill's tile does not:
// hc_up_mix_tile_kernel). With kInt8Lo (that instance on Q8_0 up rows with int8 products, r a
// multiple of 32) the warps that form lo quantize it to Q8_0 in shared memory, a chunk a warp, and
// the up products take dp4a on it (Int8Unit), as the decode products read their activations and as
// the CPU backend's products read lo: four dp4a a row and unit where FP32 lo took 16 conversions
// and 16 multiply-adds. H100, paired, three rounds: decode 265.1 / 265.0 / 264.5 -> 269.6 / 269.1 /
// 269.5 tok/s. The down kernel's like form (gamma·R in Q8_0, its rows by dp4a) lost 0.4% beside it.
template <typename U, bool kUnitInRegisters, int kWarps, int TB, bool kInt8Lo = false>
__global__ void __launch_bounds__(32 * kWarps) hc_up_mix_kernel(
    const uint8_t* __restrict__ up, uint64_t pitch, int64_t r, int64_t n_rows, int64_t H, float eps, int T,
    const float* __restrict__ part, const float* __restrict__ sumsq, float* __restrict__ R,
    const float* __restrict__ y, const float* __restrict__ write_w, const float* __restrict__ gamma,
    float* __restrict__ x, float* __restrict__ inject_w, QuantizeTarget x8) {
  constexpr int S = kDecodeStreams;
  constexpr bool kFloatMath = TB == 1 && kUnitInRegisters && kWarps == 32;
  static_assert(!kInt8Lo || (kFloatMath && std::is_same_v<U, Unit<GgmlType::Q8_0>>), "int8 lo: one token's Q8_0 up rows");
  extern __shared__ __align__(16) float lo[];  // [T][r]
  // With kInt8Lo, lo in Q8_0 (codes and chunk scales as QuantizedX lays them out) instead.
  __shared__ __align__(16) int8_t lo_codes[kInt8Lo ? kMaxUnitLo : 1];
  __shared__ float2 lo_scales[kInt8Lo ? kMaxUnitLo / 32 : 1];
  const int64_t d = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32, W = S * H;
  const int lane = threadIdx.x % 32;
  const uint8_t* rows[S];
#pragma unroll
  for (int s = 0; s < S; ++s) {
    rows[s] = d < H ? up + (s * H + d) * pitch : nullptr;
    if (rows[s] && !kUnitInRegisters) prefetch_l2(rows[s], pitch, lane, 32);
  }
  const int64_t n_units = r / kUnit;
  typename U::Raw raw[S];
  if (kUnitInRegisters && d < H && lane < n_units)
#pragma unroll
    for (int s = 0; s < S; ++s) raw[s] = U::fetch(rows[s], lane, r);
  // Lane t·S + s forms token t's stream-s term; its R, gamma and y load beside the rows, before
  // the wait: only part and sumsq come from the kernel just before (hc_down_inject_kernel), and
  // this one is scheduled once all of that kernel's blocks have passed their wait, so what was
  // written before it (R, y, write_w) is complete.
  const int64_t i = (lane % S) * H + d;
  const int lane_token = TB == 1 ? 0 : lane / S;
  const bool holds_term = lane < (TB == 1 ? 1 : T) * S && d < H;
  const auto lane_R = [&] {  // the lane's R, after the pending write
    const float v = R[lane_token * W + i];
    return y ? written(v, write_w[lane], y[lane_token * H + d]) : v;
  };
  const float g = holds_term ? gamma[i] : 0.0f, R_lane = holds_term ? lane_R() : 0.0f;
  grid_dependency_wait();
  // One token with a thread for each row of [down; inject] (the model's 324 rows, 1,024 threads):
  // thread j's four partials load beside sumsq, one trip to L2 where the loop below takes two
  // (sumsq, then the partials). Block 0 alone keeps the inject rows. H100, four paired rounds:
  // decode 246.7 / 246.4 / 246.7 / 246.5 -> 248.0 / 248.1 / 248.0 / 247.5 tok/s.
  const bool row_a_thread = TB == 1 && n_rows <= blockDim.x;
  const bool holds_row = row_a_thread && (threadIdx.x < r || (blockIdx.x == 0 && inject_w && threadIdx.x < n_rows));
  float row_parts[S];
#pragma unroll
  for (int s = 0; s < S; ++s) row_parts[s] = holds_row ? part[s * n_rows + threadIdx.x] : 0.0f;
  // Each token's 1/rms of each stream, once a block: by rsqrtf (kFloatMath) or rsqrt in double
  // (within an ulp of the reference's 1/sqrt and quicker). One token's stay in registers; several
  // tokens' in shared memory.
  const auto stream_rinv = [&](int j) -> double {
    if constexpr (kFloatMath) return rsqrtf(sumsq[j] / static_cast<float>(H) + eps);
    return rsqrt(static_cast<double>(sumsq[j]) / H + static_cast<double>(eps));
  };
  double rinv_one[S];
  __shared__ double rinv_tokens[TB > 1 ? TB : 1][S];
  if constexpr (TB == 1) {
#pragma unroll
    for (int s = 0; s < S; ++s) rinv_one[s] = stream_rinv(s);
  } else {
    if (threadIdx.x < T * S) rinv_tokens[threadIdx.x / S][threadIdx.x % S] = stream_rinv(threadIdx.x);
    __syncthreads();
  }
  const auto rinv = [&](int t, int s) {
    if constexpr (TB == 1) return rinv_one[s];
    else return rinv_tokens[t][s];
  };
  // Σ_s rinv_s·part_s / S of token t, part_s = part_of(s).
  const auto mixed = [&](int t, auto part_of) {
    double v = 0;
#pragma unroll
    for (int s = 0; s < S; ++s) v += rinv(t, s) * part_of(s);
    return v / S;
  };
  const auto mixed_row = [&](int t, int64_t row) { return mixed(t, [&](int s) { return part[(t * S + s) * n_rows + row]; }); };
  const int n_tokens = TB == 1 ? 1 : T;  // a constant for one token: no loops, no divisions
  const int lo_size = static_cast<int>(r), n_inject = static_cast<int>(n_rows - r);
  if (row_a_thread) {
    if (holds_row) {
      const double v = mixed(0, [&](int s) { return row_parts[s]; });
      if (threadIdx.x >= lo_size)
        inject_w[threadIdx.x - lo_size] = kFloatMath ? 2.0f * sigmoid_f(static_cast<float>(v)) : static_cast<float>(2.0 * sigmoid_d(v));
      else if constexpr (kInt8Lo)  // whole warps (r a multiple of 32): warp w quantizes chunk w
        quantize_q8_0_value<false>(silu_f(static_cast<float>(v)), threadIdx.x / 32, lo_codes, lo_scales);
      else
        lo[threadIdx.x] = kFloatMath ? silu_f(static_cast<float>(v)) : static_cast<float>(silu_d(v));
    }
  } else {
    for (int j = threadIdx.x; j < n_tokens * lo_size; j += blockDim.x)
      lo[j] = static_cast<float>(silu_d(TB == 1 ? mixed_row(0, j) : mixed_row(j / lo_size, j % lo_size)));
    if (blockIdx.x == 0 && inject_w && threadIdx.x < n_tokens * n_inject) {
      const int t = TB == 1 ? 0 : threadIdx.x / n_inject, k = TB == 1 ? threadIdx.x : threadIdx.x % n_inject;
      inject_w[t * n_inject + k] = static_cast<float>(2.0 * sigmoid_d(mixed_row(t, r + k)));
    }
  }
  __syncthreads();
  if (d >= H) return;  // never with 32 warps (H % 32 == 0 there)
  __shared__ float chunk[TB][32];  // with x8: token t's x over the block's 32 positions
  if constexpr (TB == 1) {
    float acc[S][1] = {};
    if constexpr (kInt8Lo) {
      if (lane < n_units) accumulate_unit<Int8Unit<GgmlType::Q8_0>, S, 1>(raw, lane, Int8X{{lo_codes, lo_scales}, r}, 1, acc);
    } else if (kUnitInRegisters) {
      if (lane < n_units) accumulate_unit<U, S, 1>(raw, lane, FloatX{lo, r}, 1, acc);
    } else {
      gemv_accumulate<U, S, 1>(rows, r, FloatX{lo, r}, 1, lane, 32, acc);
    }
    float m = 0.0f;  // lane s: up row s's product
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const float v = warp_sum(acc[s][0]);
      if (lane == s) m = v;
    }
    double rinv_lane = rinv_one[0];  // lane s: stream s's (selected, not indexed: an indexed register array is local memory)
#pragma unroll
    for (int s = 1; s < S; ++s)
      if (lane == s) rinv_lane = rinv_one[s];
    double term;  // lane s: stream s's term of the mix
    if constexpr (kFloatMath) {
      const double gate = sigmoid_f(m);  // every lane's: cheaper than a branch around it
      term = lane < S ? gate * (static_cast<double>(R_lane) * rinv_lane * g) : 0.0;
    } else {
      term = lane < S ? sigmoid_d(m) * (static_cast<double>(R_lane) * rinv_lane * g) : 0.0;
    }
    if (lane < S && y) R[i] = R_lane;
    double terms[S];
#pragma unroll
    for (int s = 0; s < S; ++s) terms[s] = __shfl_sync(0xffffffffu, term, s);
    double mix = 0;
#pragma unroll
    for (int s = 0; s < S; ++s) mix += terms[s];
    const float xd = static_cast<float>(mix / S);
    if (lane == 0) x[d] = xd;
    if (kWarps == 32 && x8.codes && lane == 0) chunk[0][threadIdx.x / 32] = xd;
  } else {
    // Every token's products first, a token at a time (the rows' registers are free after them: a
    // loop over tokens around the whole term kept them beside the FP64 sigmoid, and spilled), then
    // all the tokens' terms at once.
    float acc[S][TB];
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      float acc_t[S][1] = {};
      if (t < T) {
        if (kUnitInRegisters) {
          if (lane < n_units) accumulate_unit<U, S, 1>(raw, lane, FloatX{lo + t * r, r}, 1, acc_t);
        } else {
          gemv_accumulate<U, S, 1>(rows, r, FloatX{lo + t * r, r}, 1, lane, 32, acc_t);
        }
      }
#pragma unroll
      for (int s = 0; s < S; ++s) acc[s][t] = acc_t[s][0];
    }
    float m = 0.0f;  // lane t·S + s: token t's up row s product
#pragma unroll
    for (int t = 0; t < TB; ++t)
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (t >= T) continue;
        const float v = warp_sum(acc[s][t]);
        if (lane == t * S + s) m = v;
      }
    const double term =
        holds_term ? sigmoid_d(m) * (static_cast<double>(R_lane) * rinv_tokens[lane_token][lane % S] * g) : 0.0;
    if (holds_term && y) R[lane_token * W + i] = R_lane;
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      if (t >= T) break;
      double mix = 0;  // token t's terms in stream order
#pragma unroll
      for (int s = 0; s < S; ++s) mix += __shfl_sync(0xffffffffu, term, t * S + s);
      const float xd = static_cast<float>(mix / S);
      if (lane == 0) x[t * H + d] = xd;
      if (kWarps == 32 && x8.codes && lane == 0) chunk[t][threadIdx.x / 32] = xd;
    }
  }
  if (kWarps != 32 || !x8.codes) return;
  // The block's 32 positions are Q8_0 chunk blockIdx.x of each token's x: warp t quantizes token t's.
  __syncthreads();
  if (const int t = threadIdx.x / 32; t < n_tokens) quantize_q8_0_value(chunk[t][lane], t * (H / 32) + blockIdx.x, x8.codes, x8.scales);
}

// Whether the units of a W = 4·H row (cuda_gemv.cuh) fall in streams in order: those of stream s
// are [s·H/16, (s + 1)·H/16). Q4_K's units cover their 256-value block; the others 16 values.
bool units_follow_streams(GgmlType type, int64_t H) { return H % (type == GgmlType::Q4_K ? 256 : kUnit) == 0; }

// Prefill on int8 products (hc_read_tiles): a block of up rows holds kTilePositions positions of
// every stream, so that its epilogue can mix the streams into x.
constexpr int kTilePositions = kGemmRows / kDecodeStreams;

// Prefill norm, a block of kNormThreads per (token, stream), up to kNormQuads runs of 4 values a
// thread held in registers: the pending write R += w·y (stored) when y is set, rinv = 1/rms (for
// the up tiles), and n = R·rinv·gamma as Q8_0 codes for the down and inject products, rounded as
// rms_norm_kernel rounds n. n itself never goes to memory.
constexpr int kNormThreads = 256, kNormQuads = 4;  // streams of up to 4,096 values
__global__ void __launch_bounds__(kNormThreads)
    hc_norm_q8_kernel(float* __restrict__ R, const float* __restrict__ y, const float* __restrict__ write_w,
                      const float* __restrict__ gamma, int64_t H, int64_t S, float eps, double* __restrict__ rinv,
                      QuantizeTarget n8) {
  grid_dependency_wait();
  const int64_t gi = blockIdx.x, t = gi / S, s = gi % S;
  float4* Rg = reinterpret_cast<float4*>(R + gi * H);
  const float4* yt = reinterpret_cast<const float4*>(y + t * H);
  const float4* gs = reinterpret_cast<const float4*>(gamma + s * H);
  const float w = y ? write_w[gi] : 0.0f;
  float v[kNormQuads][4];
  double ss = 0;
#pragma unroll
  for (int k = 0; k < kNormQuads; ++k) {
    const int64_t q = threadIdx.x + k * kNormThreads;  // values 4q .. 4q + 3
    if (4 * q >= H) continue;
    float4 r4 = Rg[q];
    if (y) {
      const float4 y4 = yt[q];
      r4 = make_float4(written(r4.x, w, y4.x), written(r4.y, w, y4.y), written(r4.z, w, y4.z), written(r4.w, w, y4.w));
      Rg[q] = r4;
    }
    v[k][0] = r4.x, v[k][1] = r4.y, v[k][2] = r4.z, v[k][3] = r4.w;
#pragma unroll
    for (int e = 0; e < 4; ++e) ss += static_cast<double>(v[k][e]) * v[k][e];
  }
  const double r = inv_rms(block_sum(ss), H, eps);
#pragma unroll
  for (int k = 0; k < kNormQuads; ++k) {
    const int64_t q = threadIdx.x + k * kNormThreads;
    if (4 * q >= H) continue;  // whole chunks of 8 lanes (H % 32 == 0)
    const float4 g4 = gs[q];
    const float g[4] = {g4.x, g4.y, g4.z, g4.w};
    float n[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) n[e] = static_cast<float>(v[k][e] * r * static_cast<double>(g[e]));
    quantize_q8_0_quad(n, (gi * H + 4 * q) / 32, n8.codes, n8.scales);
  }
  if (threadIdx.x == 0) rinv[gi] = r;
}

// Prefill: token t's block sums the split partials of the down (rows < r) and inject products
// (gemm_int8_kernel's layout: split z of down at part + z·T·n_rows, [T][r], of inject after T·r
// values of it, [T][S]) in split order as sum_splits_kernel sums them, then writes lo = silu(v / S)
// as Q8_0 codes for the up tiles (a warp a chunk; r a multiple of 32) and the inject weights
// 2·sigmoid(v / S).
__global__ void hc_lo_inject_kernel(const float* __restrict__ part, int splits, int64_t T, int64_t r, int64_t n_rows,
                                    double inv_s, QuantizeTarget lo8, float* __restrict__ inject_w) {
  grid_dependency_wait();
  const int64_t t = blockIdx.x, row = threadIdx.x, S = n_rows - r;
  if (row >= n_rows) return;
  const int64_t at = row < r ? t * r + row : T * r + t * S + row - r;
  float v = part[at];
  for (int z = 1; z < splits; ++z) v += part[z * T * n_rows + at];
  if (row < r)
    quantize_q8_0_value(static_cast<float>(silu_d(v * inv_s)), t * (r / 32) + row / 32, lo8.codes, lo8.scales);
  else
    inject_w[t * S + row - r] = static_cast<float>(2.0 * sigmoid_d(v * inv_s));
}

// Prefill up product with the mix as its epilogue. Block (token tile, position tile) takes up rows
// s·H + p0 + i (i < kTilePositions) of every stream s on lo's codes, so its sums are m_s of
// kTilePositions positions × 64 tokens, and forms x = (1/S) Σ_s sigmoid(m_s)·n_s in stream order,
// n_s = R·rinv·gamma: hc_mix_kernel's sums, without m or n in memory. The tile's R rows are asked
// of L2 before its products, and a thread's eight tokens load theirs together (one after another,
// the epilogue waited a memory trip per token: 241 µs a pp2048 call). The epilogue is FP32 (expf
// and a division for the sigmoids, as in one-token decode): its 32 FP64 sigmoids a thread, each an
// exp and a division, kept the FP64 pipe busy (session 39's ncu: 755 µs a pp8192 call, issue 64%).
template <typename I>
__global__ void __launch_bounds__(kGemmThreads, kGemmInt8BlocksPerSm)
    hc_up_mix_tile_kernel(const uint8_t* __restrict__ up, uint64_t row_bytes, int64_t r, int64_t H, int64_t T,
                          QuantizedX lo8, const float* __restrict__ R, const double* __restrict__ rinv,
                          const float* __restrict__ gamma, float* __restrict__ x) {
  grid_dependency_wait();
  constexpr int S = kDecodeStreams, kPasses = kGemmCols * kTilePositions / kGemmThreads;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kGemmCols, p0 = static_cast<int64_t>(blockIdx.y) * kTilePositions;
  const int n_cols = T - t0 < kGemmCols ? static_cast<int>(T - t0) : kGemmCols;
  for (int j = threadIdx.x; j < n_cols * S; j += kGemmThreads)  // a stream's 16 positions: 64 bytes
    prefetch_l2(R + (t0 + j / S) * S * H + (j % S) * H + p0, kTilePositions * sizeof(float), 0, 1);
  gemm_int8_tile_rows<I, 1>(  // the mix epilogue needs the registers
      [=](int row) { return up + ((row / kTilePositions) * H + p0 + row % kTilePositions) * row_bytes; }, kGemmRows, r,
      0, r / 32, n_cols, lo8, [=](int c) { return t0 + c; },
      [&](const float(&acc)[2][4][4], int warp_row, int warp_col, int g, int t) {
        const float* m = tile_sums_to_shared(acc, warp_row, warp_col, g, t);
        const int i = threadIdx.x % kTilePositions, c0 = threadIdx.x / kTilePositions;
        const int64_t p = p0 + i;
        float gam[S];
#pragma unroll
        for (int s = 0; s < S; ++s) gam[s] = gamma[s * H + p];
        float Rv[kPasses][S], rv[kPasses][S];
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {  // past n_cols, the last token's values (not stored)
          const int64_t tok = t0 + min(c0 + k * (kGemmThreads / kTilePositions), n_cols - 1);
#pragma unroll
          for (int s = 0; s < S; ++s)
            Rv[k][s] = R[tok * S * H + s * H + p], rv[k][s] = static_cast<float>(rinv[tok * S + s]);
        }
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
          const int c = c0 + k * (kGemmThreads / kTilePositions);
          float mix = 0;
#pragma unroll
          for (int s = 0; s < S; ++s)
            mix += sigmoid_f(m[(s * kTilePositions + i) * kTileSumsPitch + min(c, n_cols - 1)]) * (Rv[k][s] * rv[k][s] * gam[s]);
          if (c < n_cols) x[(t0 + c) * H + p] = mix / S;
        }
      });
}

}  // namespace

// Whether hc_read of a runs as the two decode kernels.
bool CudaBackend::hc_read_decodes(const HcReadArgs& a) {
  const int64_t S = a.n_streams, W = a.R->ne(0), H = W / S, r = a.down->ne[1];
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  const int64_t T = a.R->ne(1);
  return T >= 1 && T <= kMaxDecodeTokens && r * T <= kMaxDecodeLo && S == kDecodeStreams && has_unit_loader(down.type, W) &&
         units_follow_streams(down.type, H) &&
         has_unit_loader(up.type, r) && (!inject || (inject->type == down.type && inject->row_bytes == down.row_bytes));
}

// The two decode kernels of hc_read, after the write R += write_w ⊙ y when y is set: an instance
// for one token, one for two, one for up to kMaxDecodeTokens.
void CudaBackend::hc_read_decode(const HcReadArgs& a, const float* y, const float* write_w) {
  if (a.R->ne(1) == 1) return launch_hc_read_decode<1>(a, y, write_w);
  if (a.R->ne(1) == 2) return launch_hc_read_decode<2>(a, y, write_w);
  launch_hc_read_decode<kMaxDecodeTokens>(a, y, write_w);
}

template <int TB>
void CudaBackend::launch_hc_read_decode(const HcReadArgs& a, const float* y, const float* write_w) {
  const int64_t S = a.n_streams, W = a.R->ne(0), H = W / S, r = a.down->ne[1];
  const int T = static_cast<int>(a.R->ne(1));
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  const int64_t n_rows = r + (inject ? S : 0);
  Tensor part = scratch_f32(T * S * n_rows), sumsq = scratch_f32(T * S);
  const float* gamma = values(*a.norm);
  float* R = a.R->f32();
  dispatch_unit(down.type, [&](auto unit) {
    launch(stream_, "hc_down_inject_kernel", hc_down_inject_kernel<decltype(unit), kDownRows, TB>, dim3(blocks_for(n_rows, kDownRows), kDecodeStreams), balanced_threads(H / kUnit, kDownMaxThreads), 0, down.data, inject ? inject->data : nullptr, down.row_bytes, H, r, T, R, y, write_w, gamma, part.f32(), sumsq.f32());
  });
  // Up rows of at most 32 units (r <= 512: the model's 320) are a unit a lane, loaded before the wait.
  const bool unit_in_registers = r % kUnit == 0 && r / kUnit <= 32;
  // With int8 products, blocks of 32 positions also write x's Q8_0 codes for the next op's products.
  const QuantizeTarget x8 = H % 32 == 0 ? q8_output(*a.x) : QuantizeTarget{};
  dispatch_unit(up.type, [&](auto unit) {
    using Un = decltype(unit);
    auto* kernel = x8.codes ? (unit_in_registers ? hc_up_mix_kernel<Un, true, 32, TB> : hc_up_mix_kernel<Un, false, 32, TB>)
                            : (unit_in_registers ? hc_up_mix_kernel<Un, true, kUpWarps, TB> : hc_up_mix_kernel<Un, false, kUpWarps, TB>);
    // Int8 lo lives in static shared memory as Q8_0 (no FP32 lo to allocate), formed only where the
    // block has a thread for each row of [down; inject].
    bool int8_lo = false;
    if constexpr (TB == 1 && std::is_same_v<Un, Unit<GgmlType::Q8_0>>) {
      int8_lo = x8.codes && unit_in_registers && r % 32 == 0 && n_rows <= 32 * 32 && int8_decode(up.type);
      if (int8_lo) kernel = hc_up_mix_kernel<Un, true, 32, 1, true>;
    }
    const int warps = x8.codes ? 32 : kUpWarps;
    const size_t lo_bytes = int8_lo ? 0 : r * T * sizeof(float);
    launch(stream_, "hc_up_mix_kernel", kernel, blocks_for(H, warps), 32 * warps, lo_bytes, up.data, up.row_bytes, r, n_rows, H, a.eps, T, part.f32(), sumsq.f32(), R, y, write_w, gamma, a.x->f32(), inject ? a.inject_w->f32() : nullptr, x8);
  });
}

// Whether hc_read of a runs on the prefill tiles (hc_read_tiled): four streams, and down, inject
// and up products on int8 tiles with Q8_0 activations, the only form of n and lo they are given.
bool CudaBackend::hc_read_tiles(const HcReadArgs& a) {
  const int64_t S = a.n_streams, W = a.R->ne(0), H = W / S, r = a.down->ne[1];
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const auto on_q8_0 = [&](const DeviceMatrix& m) { return int8_product(m.type) && !int8_block256(m.type); };
  const bool inject_like_down =
      !a.inject || (matrix(*a.inject).type == down.type && matrix(*a.inject).row_bytes == down.row_bytes);
  return a.R->ne(1) > kMatvecMaxTokens && S == kDecodeStreams && H % kTilePositions == 0 && H % 32 == 0 &&
         H <= 4 * kNormThreads * kNormQuads && r % 32 == 0 && r + S <= 1024 && on_q8_0(down) && on_q8_0(up) &&
         inject_like_down;
}

// Prefill hc_read on int8 tiles, after the write R += write_w ⊙ y when y is set: the norm kernel
// (write, rinv, n's codes), the down and inject products, lo's codes, and the up tiles that mix
// the streams into x. Against a norm that stores n, an up product that stores m and a mix kernel,
// n and m (each T × W floats) are neither written nor read back, and the write needs no launch.
void CudaBackend::hc_read_tiled(const HcReadArgs& a, const float* y, const float* write_w) {
  const int64_t S = a.n_streams, W = a.R->ne(0), T = a.R->ne(1), H = W / S, r = a.down->ne[1];
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  const float* gamma = values(*a.norm);
  Tensor rinv = scratch_bytes(static_cast<size_t>(S * T) * sizeof(double));
  auto* rinv_d = reinterpret_cast<double*>(rinv.f32());
  QuantizedActivations n8 = q8_scratch(W * T);
  launch(stream_, "hc_norm_q8_kernel", hc_norm_q8_kernel, static_cast<unsigned>(S * T), kNormThreads, 0, a.R->f32(), y, write_w, gamma, H, S, a.eps, rinv_d, n8.target());
  const DeviceMatrix* reads_n[] = {&down, inject};
  float* no_outputs[] = {nullptr, nullptr};  // the partials are the outputs
  StackedProduct lo_inject;
  dispatch_int8_type(down.type, [&](auto i8) {
    lo_inject = launch_int8_stacked<decltype(i8)>(*this, std::span(reads_n, inject ? 2 : 1), no_outputs, n8, T, true);
  });
  const int64_t n_rows = lo_inject.rows;
  QuantizedActivations lo8 = q8_scratch(r * T);
  launch(stream_, "hc_lo_inject_kernel", hc_lo_inject_kernel, static_cast<unsigned>(T), static_cast<unsigned>((n_rows + 31) / 32 * 32), 0, lo_inject.part.f32(), lo_inject.splits, T, r, n_rows, 1.0 / S, lo8.target(), inject ? a.inject_w->f32() : nullptr);
  dispatch_int8_type(up.type, [&](auto i8) {
    using I = decltype(i8);
    [[maybe_unused]] static const bool shared_ready =
        allow_max_shared(hc_up_mix_tile_kernel<I>, kGemmInt8SharedBytes, "hc_up_mix_tile_kernel shared memory");
    const dim3 grid(blocks_for(T, kGemmCols), static_cast<unsigned>(H / kTilePositions));
    launch(stream_, "hc_up_mix_tile_kernel", hc_up_mix_tile_kernel<I>, grid, kGemmThreads, kGemmInt8SharedBytes, up.data, up.row_bytes, r, H, T, lo8.view(), a.R->f32(), rinv_d, gamma, a.x->f32());
  });
}

void CudaBackend::hc_write_read(Tensor& R, const Tensor& y, const Tensor& inject_w, const HcReadArgs& a) {
  check_hc_write_read(R, y, inject_w, a);
  const bool decodes = hc_read_decodes(a);
  if (!decodes && !hc_read_tiles(a)) return Backend::hc_write_read(R, y, inject_w, a);
  OpScope scope(profiler_, "hc_write_read", R.ne(1), stream_);
  if (decodes) return hc_read_decode(a, y.f32(), inject_w.f32());
  hc_read_tiled(a, y.f32(), inject_w.f32());
}

void CudaBackend::hc_read(const HcReadArgs& a) {
  OpScope scope(profiler_, "hc_read", a.R->ne(1), stream_);
  check_hc_read(a);
  const Tensor& R = *a.R;
  int64_t S = a.n_streams, W = R.ne(0), T = R.ne(1), H = W / S, r = a.down->ne[1];
  if (T == 0) return;
  if (hc_read_decodes(a)) return hc_read_decode(a, nullptr, nullptr);
  if (hc_read_tiles(a)) return hc_read_tiled(a, nullptr, nullptr);
  const DeviceMatrix &down = matrix(*a.down), &up = matrix(*a.up);
  const DeviceMatrix* inject = a.inject ? &matrix(*a.inject) : nullptr;
  Tensor n = scratch_f32(W * T).reshaped({W, T, 1, 1}), lo = scratch_f32(r * T);
  // The down and inject products read the same n, in Q8_0 (written by the norm) when their int8
  // products take Q8_0 activations.
  const bool q8_n = int8_product(down.type) && !int8_block256(down.type) && H % 32 == 0;
  QuantizedActivations n8;
  if (q8_n) n8 = q8_scratch(W * T);
  rms_norm_q8(R, a.norm, H, a.eps, n, n8.target());  // grouped: one gamma per position of the W-wide row
  Tensor m = scratch_f32(W * T);
  const DeviceMatrix* reads_n[] = {&down, inject};
  float* n_products[] = {lo.f32(), inject ? a.inject_w->f32() : nullptr};
  matmul_shared(std::span(reads_n, inject ? 2 : 1), n.f32(), W, T, std::span(n_products, inject ? 2 : 1), q8_n ? &n8 : nullptr);
  launch(stream_, "scaled_silu_kernel", scaled_silu_kernel, blocks_for(r * T, kThreads), kThreads, 0, lo.f32(), r * T, 1.0 / S);
  matmul(up, lo.f32(), T, m.f32());
  launch(stream_, "hc_mix_kernel", hc_mix_kernel, per_token_grid(H, T, kThreads), kThreads, 0, m.f32(), n.f32(), H, S, T, a.x->f32());
  if (a.inject)
    launch(stream_, "inject_weights_kernel", inject_weights_kernel, blocks_for(S * T, kThreads), kThreads, 0, a.inject_w->f32(), S * T, 1.0 / S);
}

void CudaBackend::hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) {
  OpScope scope(profiler_, "hc_write", y.ne(1), stream_);
  check_hc_write(R, y, inject_w);
  int64_t W = R.ne(0), T = R.ne(1), H = y.ne(0), S = inject_w.ne(0);
  if (W * T == 0) return;
  launch(stream_, "hc_write_kernel", hc_write_kernel, per_token_grid(H, T, kThreads), kThreads, 0, R.f32(), y.f32(), inject_w.f32(), H, S, T);
}

}  // namespace regolith::cuda
