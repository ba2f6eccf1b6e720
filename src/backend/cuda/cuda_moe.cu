// CUDA MoE (model-spec §4.6): softmax router with renormalised top-k, and the routed SwiGLU experts:
// gate and up, SwiGLU, down, then the weighted sum over the k slots in slot order. A few tokens:
// two fused kernels over the unit loaders of cuda_gemv.cuh (gate + up + SwiGLU, then down + the
// weighted sum), which in moe_ffn also carry the shared expert as one more slot per token, or,
// for types without a unit loader, expert-indexed matvecs, each (token, slot) pair reading its
// expert's rows once. More: the pairs
// are grouped by expert on the device and each expert runs the prefill tile (cuda_gemm.cuh) over
// its own pairs, so an expert's weights are read once per 64 of its tokens.
#include <algorithm>
#include <array>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_gemm_int8.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_quant.cuh"
#include "quant/dot.h"

namespace regolith::cuda {

namespace {

constexpr int kWarps = 4;

// The matrices of the decode kernels: the routed experts' (stacked, expert e's rows after e·rows
// rows) and, when shared.data is set, the shared expert's, which rides along as slot k of every token
// (slots per token k + 1). Each has its own type, read through dispatch_unit.
struct SlotMatrix {
  const uint8_t* data = nullptr;
  uint64_t pitch = 0;
  GgmlType type = GgmlType::F32;
};
struct SlotMatrices {
  SlotMatrix routed, shared;  // shared.data null: routed slots only
};

// x [T][K] quantized for the expert kernels' int8 units (Int8Unit, cuda_gemv.cuh): Q8_0 for
// Q8_0 rows, Q8_K for Q4_K rows; a format's codes are null when no slot reads it.
struct ExpertX8 {
  QuantizedX q8_0, q8_k;
};

// FP32 bits as an unsigned key in the floats' order (negatives reversed below the positives; -0
// keyed as +0, which it equals).
__device__ __forceinline__ unsigned order_key(float f) {
  const unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float from_order_key(unsigned key) {
  return __uint_as_float(key & 0x80000000u ? key & 0x7fffffffu : ~key);
}

// A warp's view of one token's E <= 32·kPerLane router logits, in registers: lane l holds experts
// l, l + 32, ... (`load` reads each once, so a caller can bypass L1), so that each pick is a pass
// over registers and two warp reductions, not over memory.
template <int kPerLane>
struct WarpLogits {
  float v[kPerLane];
  int64_t E;
  template <typename Load>
  __device__ WarpLogits(Load load, int64_t n_experts) : E(n_experts) {
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) v[i] = lane + 32 * i < E ? load(lane + 32 * i) : -INFINITY;
  }
  // The top n experts by logit (softmax is monotone), equal logits to the lower id, in order:
  // on_pick(j, expert, logit) in every lane for j = 0 .. n-1.
  template <typename OnPick>
  __device__ void pick(int64_t n, OnPick on_pick) const {
    const int lane = threadIdx.x % 32;
    uint64_t taken = 0;  // bit i: expert lane + 32i is already picked
    for (int64_t j = 0; j < n; ++j) {
      float best_l = -INFINITY;
      int best_e = -1;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const bool open = lane + 32 * i < E && !(taken >> i & 1u);
        if (open && (best_e < 0 || v[i] > best_l)) best_l = v[i], best_e = lane + 32 * i;
      }
      // Two warp reductions: the largest logit's key, then the lowest expert holding it. They
      // replaced five rounds of two shuffles and a select: routing at decode 12.0 -> 9.9 µs a call
      // in the profile, decode 193.8 -> 197.5 tok/s on an H200.
      const unsigned key = best_e < 0 ? 0u : order_key(best_l);
      const unsigned top = __reduce_max_sync(0xffffffffu, key);
      const unsigned e = __reduce_min_sync(0xffffffffu, best_e >= 0 && key == top ? static_cast<unsigned>(best_e) : ~0u);
      best_e = e == ~0u ? -1 : static_cast<int>(e);
      if (best_e % 32 == lane) taken |= uint64_t{1} << (best_e / 32);
      on_pick(j, best_e, best_e < 0 ? -INFINITY : from_order_key(top));
    }
  }
};

// One warp routes one token: the top k experts (ids) and their softmax probabilities renormalised
// over the k (weights); the softmax sums in FP64.
template <int kPerLane>
__device__ void route_token(const WarpLogits<kPerLane>& logits, int64_t k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x % 32;
  float mxf = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) mxf = fmaxf(mxf, logits.v[i]);
  const double mx = warp_max(mxf);
  double sum = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i)
    if (lane + 32 * i < logits.E) sum += exp(static_cast<double>(logits.v[i]) - mx);
  sum = warp_sum(sum);
  // The pick's logit waits in weights[j] for the final normalisation.
  logits.pick(k, [&](int64_t j, int e, float l) {
    if (lane == 0) ids[j] = e, weights[j] = l;
  });
  __syncwarp();  // lane 0's logits are read by every lane
  // The picks' probabilities, a lane each, summed in pick order (as the reference sums them): the
  // exponentials run side by side rather than one after another on the critical path. The first 32
  // stay in their lanes for the normalisation.
  const auto probability = [&](int64_t j) { return exp(static_cast<double>(weights[j]) - mx) / sum; };
  double top = 0, first_p = 0;
  for (int64_t j0 = 0; j0 < k; j0 += 32) {
    const double p = j0 + lane < k ? probability(j0 + lane) : 0.0;
    if (j0 == 0) first_p = p;
    for (int i = 0; i < 32 && j0 + i < k; ++i) top += __shfl_sync(0xffffffffu, p, i);
  }
  __syncwarp();  // every lane has read the logits before they are overwritten
  for (int64_t j = lane; j < k; j += 32) weights[j] = static_cast<float>((j < 32 ? first_p : probability(j)) / top);
}

// One warp per token.
template <int kPerLane>
__global__ void moe_route_kernel(const float* logits, int64_t E, int64_t T, int64_t k, int32_t* ids, float* weights) {
  grid_dependency_wait();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (t >= T) return;
  const float* l = logits + t * E;
  route_token(WarpLogits<kPerLane>([=](int64_t e) { return l[e]; }, E), k, ids + t * k, weights + t * k);
}

// fn(std::integral_constant<int, kPerLane>) with route_token's logits per lane for E experts: 2,
// or 16 up to 512 (this model family's most), or 64 up to 2048.
constexpr int64_t kMaxRoutedExperts = 2048;
template <typename Fn>
void with_logits_per_lane(int64_t E, Fn&& fn) {
  if (E > kMaxRoutedExperts) fail("cuda moe routing: ", E, " experts (at most ", kMaxRoutedExperts, ")");
  if (E <= 64) return fn(std::integral_constant<int, 2>{});
  if (E <= 512) return fn(std::integral_constant<int, 16>{});
  fn(std::integral_constant<int, 64>{});
}

// Decode: rows n0 .. n0+R-1 (n0 = R·blockIdx.x) of [router; shared gate] times x for T <= TB
// tokens, giving the logits [E, T] and the shared expert's gate logit s [T]; the routing itself is
// left to the expert kernels' blocks (expert_gate_up_kernel). The blocks past the rows quantize x
// to the targets set for the expert kernels (a Q8_K block or a Q8_0 chunk a warp), beside the rows.
template <int R, int TB>
__global__ void __launch_bounds__(128)
    moe_router_kernel(SlotMatrix router, SlotMatrix gate_inp, int64_t K, int64_t E, const float* __restrict__ x, int T,
                      float* logits, float* s, QuantizeTarget q8_0, QuantizeTarget q8_k) {
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * R;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    rows[r] = n0 + r < E ? router.data + (n0 + r) * router.pitch : n0 + r == E ? gate_inp.data : nullptr;
    if (rows[r]) prefetch_l2(rows[r], router.pitch);
  }
  grid_dependency_wait();
  if (n0 > E) {
    const int64_t n_k = q8_k.codes ? T * K / 256 : 0, n_0 = q8_0.codes ? T * K / 32 : 0;
    const int64_t warps = blockDim.x / 32, row_blocks = E / R + 1;
    for (int64_t w = (blockIdx.x - row_blocks) * warps + threadIdx.x / 32; w < n_k + n_0; w += (gridDim.x - row_blocks) * warps) {
      if (w < n_k)
        quantize_q8_k_block(x, w, q8_k.codes, q8_k.scales);
      else
        quantize_q8_0_chunk(x, w - n_k, q8_0.codes, q8_0.scales);
    }
    return;
  }
  float acc[R][TB] = {};
  dispatch_unit(router.type, [&](auto unit) { gemv_accumulate<decltype(unit), R, TB>(rows, K, FloatX{x, K}, T, threadIdx.x, blockDim.x, acc); });
  float sums[R * TB];
  block_reduce_rows(acc, sums);
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      if (n0 + r < E) logits[t * E + n0 + r] = sums[r * TB + t];
      if (n0 + r == E) s[t] = sums[r * TB + t];
    }
}

// out[pair][n] = W_e[n]·x, pair = t·k + j, e = ids[pair]; x is per token (x_per_pair false) or
// per pair. Grid (pairs, row blocks).
template <typename D>
__global__ void expert_matvec_kernel(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t N,
                                     int64_t E, const int32_t* ids, int64_t k, const float* __restrict__ x,
                                     bool x_per_pair, float* __restrict__ out) {
  grid_dependency_wait();
  const int64_t pair = blockIdx.x, n = static_cast<int64_t>(blockIdx.y) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const int64_t e = ids[pair];
  if (e < 0 || e >= E) {
    if (lane == 0) out[pair * N + n] = 0.0f;
    return;
  }
  const uint8_t* row = W + (e * N + n) * row_bytes;
  const float* xr = x + (x_per_pair ? pair : pair / k) * K;
  float acc = 0.0f;
  for (int64_t c = lane; c < (K + 31) / 32; c += 32) {
    float w[32];
    D::chunk(row, c, K, w);
    int valid = static_cast<int>(K - c * 32 < 32 ? K - c * 32 : 32);
    for (int jj = 0; jj < valid; ++jj) acc += w[jj] * xr[c * 32 + jj];
  }
  acc = warp_sum(acc);
  if (lane == 0) out[pair * N + n] = acc;
}

// Row `row` of slot j of token t, or null for a routed slot with an invalid expert id.
__device__ __forceinline__ const uint8_t* slot_row(const SlotMatrices& m, int64_t j, int64_t k, int64_t e, int64_t E,
                                                   int64_t rows, int64_t row) {
  if (j == k) return m.shared.data + row * m.shared.pitch;
  return e >= 0 && e < E ? m.routed.data + (e * rows + row) * m.routed.pitch : nullptr;
}

// Σ a_i·b_i over the 16 signed bytes of a and b, exactly.
__device__ __forceinline__ int dot16_bytes(const uint4& a, const uint4& b) {
  return __dp4a(static_cast<int>(a.w), static_cast<int>(b.w),
                __dp4a(static_cast<int>(a.z), static_cast<int>(b.z),
                       __dp4a(static_cast<int>(a.y), static_cast<int>(b.y), __dp4a(static_cast<int>(a.x), static_cast<int>(b.x), 0))));
}

// The low nibbles of 16 bytes, each as a byte.
__device__ __forceinline__ uint4 low_nibbles(const uint4& q) {
  constexpr uint32_t kLow = 0x0F0F0F0Fu;
  return {q.x & kLow, q.y & kLow, q.z & kLow, q.w & kLow};
}

// Σ hi_i·b_i over the high nibbles hi_i of the 16 bytes of q and the signed bytes of b, exactly:
// the nibbles stay in place (bytes 16·hi_i, unsigned: dp4a.u32.s32), so each word takes a mask and
// no shift, and the sum, a multiple of 16, is shifted once.
__device__ __forceinline__ int dot16_high_nibbles(const uint4& q, const uint4& b) {
  constexpr uint32_t kHigh = 0xF0F0F0F0u;
  int sum = 0;
  const uint32_t qs[4] = {q.x, q.y, q.z, q.w}, bs[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(sum) : "r"(qs[i] & kHigh), "r"(bs[i]));
  return sum >> 4;
}

// gate·x and up·x of one Q4_K row pair on Q8_K activations, by a warp, into lane sums. Eight lanes
// take a 256-value block: lane l holds the 16 code bytes qs[32g + 16h ..] (g = (l % 8) / 2, h =
// l % 2), whose low nibbles are values 16h .. 16h + 15 of sub-block 2g and high nibbles the same
// of sub-block 2g + 1, so a lane decodes one scale/min pair for 32 values and loads its codes and
// activations 16 bytes at a time; a warp covers four blocks a step. Each sub-block's sum stays in
// integers until its scale: x.d·(d·(s₀·Σq₀x + s₁·Σq₁x) − dmin·(m₀·Σx₀ + m₁·Σx₁)). Against the
// 16-value units (Int8Unit<Q4_K>) this takes about a third of the instructions a row.
__device__ __forceinline__ void q4k_row_pair_dots(const uint8_t* gate_row, const uint8_t* up_row, int64_t K,
                                                  const int8_t* __restrict__ xq, const float2* __restrict__ x_scales,
                                                  float& g_acc, float& u_acc) {
  constexpr int kBlockBytes = sizeof(quant::BlockQ4_K);
  constexpr uint4 kOnes = {0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u};
  const int lane = threadIdx.x % 32, pair = (lane % 8) / 2, half = lane % 2;
  const int n_blocks = static_cast<int>(K / 256);
  const int code_offset = 16 + 32 * pair + 16 * half;  // past d, dmin and the 12 scale bytes
  const int x_offset = 64 * pair + 16 * half;
#pragma unroll 1
  for (int b = lane / 8; b < n_blocks; b += 4) {
    const uint8_t* gb = gate_row + b * kBlockBytes;
    const uint8_t* ub = up_row + b * kBlockBytes;
    const uint4 gh = __ldg(reinterpret_cast<const uint4*>(gb)), uh = __ldg(reinterpret_cast<const uint4*>(ub));
    const uint4 gq = __ldg(reinterpret_cast<const uint4*>(gb + code_offset));
    const uint4 uq = __ldg(reinterpret_cast<const uint4*>(ub + code_offset));
    const int8_t* xb = xq + b * 256 + x_offset;
    const uint4 x0 = *reinterpret_cast<const uint4*>(xb), x1 = *reinterpret_cast<const uint4*>(xb + 32);
    const float xd = x_scales[b * 8].x;
    const int xs0 = dot16_bytes(x0, kOnes), xs1 = dot16_bytes(x1, kOnes);
    const auto row_dot = [&](const uint4& header, const uint4& q) {
      const int lo = dot16_bytes(low_nibbles(q), x0), hi = dot16_high_nibbles(q, x1);
      uint32_t scales, mins;
      k4_scale_min_pair(header, pair, scales, mins);
      const int sc = static_cast<int>(scales & 0xFF) * lo + static_cast<int>(scales >> 8) * hi;
      const int m = static_cast<int>(mins & 0xFF) * xs0 + static_cast<int>(mins >> 8) * xs1;
      const float d = f16(static_cast<uint16_t>(header.x)), dmin = f16(static_cast<uint16_t>(header.x >> 16));
      return xd * (d * static_cast<float>(sc) - dmin * static_cast<float>(m));
    };
    g_acc += row_dot(gh, gq);
    u_acc += row_dot(uh, uq);
  }
}

// Where the expert kernels find token t's k routed experts: ids and weights [T][k] as given, or,
// with logits set (the router's, [T][E]), picked by the gate/up kernel, whose blocks each find
// their slot's expert; the first block of each token's last routed slot picks all k anyway, and
// writes ids and weights for the down kernel. The router kernel then ends with its rows: no block
// of it waits for the others to finish in order to route. H200, paired, three rounds: decode 236.6
// -> 244.0 tok/s (medians); a call's chain share, router 6.6 -> 2.9 µs, gate/up 10.4 -> 12.4.
struct SlotRouting {
  int32_t* ids;
  float* weights;
  const float* logits;  // null: ids and weights are given
};

// Slot j's expert for token t, in every thread of the block (-1 for the shared slot j == k).
template <int kPerLane>
__device__ int64_t slot_expert(const SlotRouting& routing, int64_t E, int64_t k, int64_t t, int64_t j) {
  if constexpr (kPerLane == 0) {
    return j < k ? routing.ids[t * k + j] : -1;
  } else {
    __shared__ int32_t picked;
    if (j < k && threadIdx.x < 32) {
      const float* l = routing.logits + t * E;
      const WarpLogits<kPerLane> logits([=](int64_t i) { return l[i]; }, E);
      if (blockIdx.x == 0 && j == k - 1) {
        route_token(logits, k, routing.ids + t * k, routing.weights + t * k);
        if (threadIdx.x == 0) picked = routing.ids[t * k + j];  // lane 0 wrote it
      } else {
        logits.pick(j + 1, [&](int64_t i, int e, float) {
          if (i == j && threadIdx.x == 0) picked = e;
        });
      }
    }
    __syncthreads();
    return j < k ? picked : -1;
  }
}

// Decode, fused: h[pair][n] = silu(gate[n]·x) · up[n]·x for pair = t·slots + j (slot j
// of token t; x its input), a warp per row n: the gate and up rows share each lane's activations.
// A routed slot with an invalid id gets zeros. A warp per row (a row of K = 2560 gives each lane 5
// units) decoded 7% faster on an H200 than two rows per 128-thread block, which left three
// quarters of the threads a single unit and paid a block reduction (114.8 -> 123.3 tok/s).
// At most 64 registers (then 8 blocks of 4 warps an SM; the compiler's choice was 72, 7 blocks):
// decode 143.6 / 144.8 -> 145.6 tok/s on an H200, 151.6 with the down kernel's cap below. A slot
// whose rows have an int8 unit reads x8 when it holds x in that unit's format, else x; Q4_K rows on
// Q8_K x take q4k_row_pair_dots instead of the units (decode 221.1 -> 225.4 tok/s on an H200).
// With kPerLane > 0 the block routes its slot itself from the router's logits (slot_expert).
// A warp takes kGateUpPasses row pairs, one after the other, all of them asked of L2 once
// the slot's expert is known: half the blocks of one pair a warp, so the model's blocks ran as one
// wave on an H200 (880 blocks of 4 warps; 1,760 took 1.7) and each slot is routed by half as many
// blocks. H200, paired, three rounds: decode 247.2 / 250.1 / 252.3 -> 252.9 / 250.9 / 255.1 tok/s.
// Blocks of 16 warps (2 an SM at 64 registers; the model's 220 blocks are one wave): a block's 32
// rows are one Q8_0 chunk of h, which its first warp quantizes for the down kernel when h8 is given
// (F a multiple of 32) and writes instead of h (down_reads_h8).
constexpr int kGateUpWarps = 16, kGateUpPasses = 2, kGateUpRows = kGateUpWarps * kGateUpPasses;
static_assert(kGateUpRows == 32, "a gate/up block's rows are one Q8_0 chunk of h");
template <int kPerLane>
__global__ void __launch_bounds__(32 * kGateUpWarps, 2)
    expert_gate_up_kernel(SlotMatrices gate, SlotMatrices up, int64_t K, int64_t F, int64_t E, SlotRouting routing,
                          int64_t k, const float* __restrict__ x, ExpertX8 x8, float* __restrict__ h,
                          QuantizeTarget h8) {
  // Slots run last to first (blockIdx.y = t·slots + slots-1-j): the blocks that start first (in
  // index order) take the shared slot, which does not route, and the slots that pick the most
  // experts, so that the second wave of blocks holds the quickest routing. Slots first to last,
  // the gate/up kernel took 14.5 µs a call, not 12.4 (H200).
  const int64_t slots = k + (gate.shared.data ? 1 : 0), t = blockIdx.y / slots, j = slots - 1 - blockIdx.y % slots;
  const int64_t pair = t * slots + j;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGateUpRows + warp;  // pass p's row: n0 + p·kGateUpWarps
  // The block's rows of slot j's expert e into L2: its rows of each matrix are one run, asked for
  // by one bulk request (thread 0 the gate's, thread 32 the up's) where every lane asked for lines
  // of its warp's rows. H100, paired, five rounds: decode 262.6 / 263.1 / 262.9 / 262.9 / 263.3 ->
  // 264.2 / 265.0 / 264.9 / 265.4 / 265.5 tok/s (as landed, against its parent on another H100:
  // 263.4 / 263.8 / 263.8 -> 264.5 / 264.5 / 265.2); traced, the routed down kernel's chain share
  // 9.34 -> 8.92 µs a call, this kernel's level (12.95 / 12.88). The same requests for the routed
  // down rows, the dense products', the router's and the QSA combine's fetch gained nothing; the
  // block's share of its slot's down matrix asked for here lost 2.2%.
  const auto prefetch_rows = [&](int64_t e) {
    if (threadIdx.x % 32 != 0 || threadIdx.x >= 64) return;
    const int64_t first = static_cast<int64_t>(blockIdx.x) * kGateUpRows, n = min(static_cast<int64_t>(kGateUpRows), F - first);
    const bool g = threadIdx.x == 0;
    const uint64_t gate_pitch = j == k ? gate.shared.pitch : gate.routed.pitch;
    const uint64_t up_pitch = j == k ? up.shared.pitch : up.routed.pitch;
    bulk_prefetch_l2(slot_row(g ? gate : up, j, k, e, E, F, first), n * (g ? gate_pitch : up_pitch));
  };
  if (j == k) prefetch_rows(-1);  // the shared expert's rows do not wait for the routing
  grid_dependency_wait();
  const int64_t e = slot_expert<kPerLane>(routing, E, k, t, j);
  const bool valid = j == k || (e >= 0 && e < E);  // the same for the whole block
  if (j < k && valid) prefetch_rows(e);
  const GgmlType type = j == k ? gate.shared.type : gate.routed.type;
  const QuantizedX xq = type == GgmlType::Q4_K ? x8.q8_k : x8.q8_0;
  // The FP64 SiLU by one thread a row, not by lane 0 of every warp (each of its instructions a
  // warp's issue slot in a kernel bound by its instruction count).
  __shared__ float gu[2][kGateUpRows];
#pragma unroll 1
  for (int p = 0; p < kGateUpPasses; ++p) {
    const int64_t n = n0 + p * kGateUpWarps;
    const bool live = valid && n < F;  // warps past F only join the barrier below
    const uint8_t* rows[2] = {live ? slot_row(gate, j, k, e, E, F, n) : nullptr,
                              live ? slot_row(up, j, k, e, E, F, n) : nullptr};
    float acc[2][1] = {};
    if (type == GgmlType::Q4_K && xq.codes && K % 256 == 0) {
      if (live) q4k_row_pair_dots(rows[0], rows[1], K, xq.codes + t * K, xq.chunk_scales + t * K / 32, acc[0][0], acc[1][0]);
    } else {
      const bool int8 = xq.codes && dispatch_int8_unit(type, [&](auto unit) {
        gemv_accumulate<decltype(unit), 2, 1>(rows, K, Int8X{xq, K}.from_token(t), 1, lane, 32, acc);
      });
      if (!int8) dispatch_unit(type, [&](auto unit) { gemv_accumulate<decltype(unit), 2, 1>(rows, K, FloatX{x, K}.from_token(t), 1, lane, 32, acc); });
    }
    const float g = warp_sum(acc[0][0]), u = warp_sum(acc[1][0]);
    if (lane == 0) gu[0][p * kGateUpWarps + warp] = g, gu[1][p * kGateUpWarps + warp] = u;
  }
  __syncthreads();
  if (threadIdx.x >= kGateUpRows) return;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGateUpRows + threadIdx.x;
  const float g = gu[0][threadIdx.x], u = gu[1][threadIdx.x];
  const float v = valid && row < F ? static_cast<float>(silu_d(g) * u) : 0.0f;
  if (h8.codes)
    quantize_q8_0_value(v, pair * (F / 32) + blockIdx.x, h8.codes, h8.scales);
  else if (row < F)
    h[pair * F + row] = v;
}

// The weight of slot j of token t in the down kernels: its routing weight, or for the shared slot
// (j == k) the sigmoid of the shared expert's gate logit.
__device__ __forceinline__ float slot_weight(int64_t j, int64_t k, int64_t t, const float* __restrict__ weights,
                                             const float* __restrict__ shared_logit) {
  return j < k ? weights[t * k + j] : static_cast<float>(sigmoid_d(shared_logit[t]));
}

// The down kernels' end: acc summed over the block, rows n0 .. n0+R-1 (< H) of token t stored.
template <int R>
__device__ __forceinline__ void store_block_rows(float (&acc)[R], int64_t t, int64_t n0, int64_t H, float* __restrict__ out) {
  block_reduce_to_first(acc);
  if (threadIdx.x != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (n0 + r < H) out[t * H + n0 + r] = acc[r];
}

// Decode, fused: out[t][n] = Σ_j w[t,j] · down_j[n]·h[t·slots + j] for rows n0 .. n0+R-1 of token
// blockIdx.y, w the routing weights and, for the shared slot, sigmoid(shared_logit[t]). The
// (slot, unit) items are spread over the threads; each item's partial products are scaled by its
// slot's weight before the block sums them. At most 96 registers (5 blocks an SM): the model's 640
// blocks then run as one wave on an H200's 132 SMs, where the compiler's choice (128 registers, 4
// blocks an SM) left 112 blocks for a second wave. Decode 143.6 / 144.8 -> 150.7 tok/s (80
// registers: 148.8).
template <int R>
__global__ void __launch_bounds__(128, 5)
    expert_down_kernel(SlotMatrices down, int64_t F, int64_t H, int64_t E, const int32_t* __restrict__ ids,
                       const float* __restrict__ weights, int64_t k, const float* __restrict__ shared_logit,
                       const float* __restrict__ h, float* __restrict__ out) {
  grid_dependency_wait();
  const int64_t t = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * R;
  // Item arithmetic in 32 bits, as in expert_down_ahead_kernel (a 64-bit division an item before).
  const int n_units = static_cast<int>(F / kUnit), slots = static_cast<int>(k) + (down.shared.data ? 1 : 0);
  float acc[R] = {};
  for (int item = threadIdx.x; item < slots * n_units; item += blockDim.x) {
    const int j = item / n_units, u = item % n_units;
    const int64_t e = j < k ? ids[t * k + j] : -1;
    if (j < k && (e < 0 || e >= E)) continue;
    const uint8_t* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = n0 + r < H ? slot_row(down, j, k, e, E, H, n0 + r) : nullptr;
    float part[R][1] = {};
    dispatch_unit(j == k ? down.shared.type : down.routed.type, [&](auto unit) {
      gemv_accumulate<decltype(unit), R, 1>(rows, F, FloatX{h + (t * slots + j) * F, F}, 1, u, n_units, part);
    });
    const float wj = slot_weight(j, k, t, weights, shared_logit);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = fmaf(wj, part[r][0], acc[r]);
  }
  store_block_rows(acc, t, n0, H, out);
}

// expert_down_kernel for slots of one unit type U: a thread puts the loads of kAhead items in flight
// before it adds the first, where the generic kernel's branch on each item's type keeps one in
// flight at a time. An item's results are added in the same order, so the sums are the same. H200,
// paired: 2 items ahead +1% to +3% tok/s, 1 (the type alone) +1.7%, 3 -4% (spills at 96 registers);
// its rows staged in shared memory by cp.async instead lost 3%. h is read through X: FloatX on h,
// or Int8X on its Q8_0 codes (U an Int8Unit), pair p's values at row p of ld F.
// Token t's routed experts come from ids after the wait or, with kPerLane > 0, from the block's
// own picks on the router's logits (as the gate/up kernel picks them, so the same experts
// in the same order): the router is the kernel before gate/up, so its logits are complete once this
// kernel is scheduled, and the block fetches its first items' rows before its wait. Blocks that
// start beside gate/up's last blocks then have their rows when it ends. H100, five paired rounds
// in one call: decode 247.1 / 247.1 / 247.5 / 247.1 / 247.5 -> 248.7 / 248.9 / 248.8 / 248.8 / 248.9.
constexpr int kMaxEarlyPicks = 32;  // routed slots a block picks before its wait
template <typename U, int R, int kAhead, typename X, int kPerLane = 0>
__global__ void __launch_bounds__(128, 5)
    expert_down_ahead_kernel(SlotMatrices down, int64_t F, int64_t H, int64_t E, const int32_t* __restrict__ ids,
                             const float* __restrict__ weights, const float* __restrict__ logits, int64_t k,
                             const float* __restrict__ shared_logit, X h, float* __restrict__ out) {
  const int64_t t = blockIdx.y, n0 = static_cast<int64_t>(blockIdx.x) * R;
  // Item arithmetic in 32 bits (a 64-bit division an item, and spills, before).
  const int n_units = static_cast<int>(F / kUnit), slots = static_cast<int>(k) + (down.shared.data ? 1 : 0);
  const int n_items = slots * n_units;
  __shared__ int32_t picked[kPerLane > 0 ? kMaxEarlyPicks : 1];
  if constexpr (kPerLane > 0) {
    if (threadIdx.x < 32) {
      const float* l = logits + t * E;
      const WarpLogits<kPerLane> token_logits([=](int64_t i) { return l[i]; }, E);
      token_logits.pick(k, [&](int64_t j, int e, float) {
        if (threadIdx.x == 0) picked[j] = e;
      });
    }
    __syncthreads();
  }
  const auto expert = [&](int j) -> int32_t {
    if constexpr (kPerLane > 0) return picked[j];
    else return ids[t * k + j];
  };
  float acc[R] = {};
  typename U::Raw raw[kAhead][R];
  int units[kAhead], slot[kAhead];
  bool valid[kAhead];
  // The rows of items base + a·blockDim.x, a < kAhead.
  const auto fetch = [&](int base) {
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const int item = base + a * static_cast<int>(blockDim.x);
      const int j = item < n_items ? item / n_units : 0, u = item < n_items ? item % n_units : 0;
      const int64_t e = j < k ? expert(j) : -1;
      valid[a] = item < n_items && (j == k || (e >= 0 && e < E));
      units[a] = u, slot[a] = j;
      // Row n0 of the slot's matrix, the block's other rows a pitch apart.
      const uint8_t* first = valid[a] ? slot_row(down, j, k, e, E, H, n0) : down.routed.data;
      const uint64_t pitch = j == k ? down.shared.pitch : down.routed.pitch;
#pragma unroll
      for (int r = 0; r < R; ++r) raw[a][r] = U::fetch(n0 + r < H ? first + r * pitch : first, units[a], F);
    }
  };
  // The fetched items' products with h, scaled by their slots' weights, into acc.
  const auto add = [&] {
    typename ActivationOf<U>::type xs[kAhead];
    float wj[kAhead];
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      int64_t x0, x1;
      U::runs(units[a], x0, x1);
      h.from_token(t * slots + slot[a]).load(0, x0, x1, xs[a]);
      wj[a] = valid[a] ? slot_weight(slot[a], k, t, weights, shared_logit) : 0.0f;
    }
#pragma unroll
    for (int a = 0; a < kAhead; ++a) {
      const typename U::Sums sums = U::sums(xs[a]);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (valid[a]) acc[r] = fmaf(wj[a], U::dot(raw[a][r], units[a], xs[a], sums), acc[r]);
    }
  };
  int base = threadIdx.x;
  if constexpr (kPerLane > 0) fetch(base);  // the first items' rows, before the wait
  grid_dependency_wait();
  if constexpr (kPerLane > 0) {
    add();
    base += kAhead * blockDim.x;
  }
  for (; base < n_items; base += kAhead * blockDim.x) {
    fetch(base);
    add();
  }
  store_block_rows(acc, t, n0, H, out);
}

// Column tile of the grouped expert products: pairs list[first .. first + count) of one expert.
struct ExpertTile {
  int32_t expert, first, count;
};

// Grid (row tiles, column tiles), sized for the most tiles any routing can need: tiles from
// *n_tiles on exit at once. The row tiles of one column tile run side by side, so its tokens are
// read from memory once and then from L2 (an expert's weights are small enough to stay in L2 for
// its column tiles; the pairs' activations are not: at pp8192 the gate's reach 210 MB).
template <typename D>
__global__ void __launch_bounds__(kGemmThreads, kGemmBlocksPerSm)
    expert_gemm_kernel(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t N,
                       const ExpertTile* __restrict__ tiles, const int32_t* __restrict__ n_tiles,
                       const int32_t* __restrict__ list, int64_t k, const float* __restrict__ x, bool x_per_pair,
                       bool x_vec4, float* __restrict__ out) {
  grid_dependency_wait();
  if (static_cast<int32_t>(blockIdx.y) >= *n_tiles) return;
  const ExpertTile tile = tiles[blockIdx.y];
  const int32_t* pairs = list + tile.first;
  gemm_tile<D>(
      W + tile.expert * N * row_bytes, row_bytes, K, 0, (K + 31) / 32, N, static_cast<int64_t>(blockIdx.x) * kGemmRows, tile.count, x,
      [=](int c) { return static_cast<int64_t>(x_per_pair ? pairs[c] : pairs[c] / k); }, x_vec4, out,
      [=](int c) { return static_cast<int64_t>(pairs[c]); });
}

// The int8 twin of expert_gemm_kernel (the same grid), over xq (x quantized, its rows as x's).
template <typename I>
__global__ void __launch_bounds__(kGemmThreads, kGemmInt8BlocksPerSm)
    expert_gemm_int8_kernel(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t N,
                            const ExpertTile* __restrict__ tiles, const int32_t* __restrict__ n_tiles,
                            const int32_t* __restrict__ list, int64_t k, QuantizedX xq, bool x_per_pair,
                            float* __restrict__ out) {
  grid_dependency_wait();
  if (static_cast<int32_t>(blockIdx.y) >= *n_tiles) return;
  const ExpertTile tile = tiles[blockIdx.y];
  const int32_t* pairs = list + tile.first;
  gemm_int8_tile<I>(
      W + tile.expert * N * row_bytes, row_bytes, K, 0, K / 32, N, static_cast<int64_t>(blockIdx.x) * kGemmRows, tile.count, xq,
      [=](int c) { return static_cast<int64_t>(x_per_pair ? pairs[c] : pairs[c] / k); }, out,
      [=](int c) { return static_cast<int64_t>(pairs[c]); });
}

// Gate and up of the grouped experts in one int8 tile, with SwiGLU and the Q8_0 quantization of h
// in its epilogue (the same grid over tiles as expert_gemm_int8_kernel, blockIdx.x the 32-row
// chunk f0 of F): the tile's rows are gate rows f0 .. f0+31 then up rows f0 .. f0+31, so each
// pair's 32 values of h are one Q8_0 chunk of the down product's activations, h8 (rows: pairs).
// g and u are the sums expert_gemm_int8_kernel forms, h = silu(g)·u in FP32 (expf and a division:
// 16 a thread, where swiglu_kernel's FP64 exp and division took the FP64 pipe), and the chunk is
// quantized as quantize_q8_0_kernel does.
template <typename I>
__global__ void __launch_bounds__(kGemmThreads, kGemmInt8BlocksPerSm)
    expert_gate_up_int8_kernel(const uint8_t* __restrict__ Wg, const uint8_t* __restrict__ Wu, uint64_t row_bytes,
                               int64_t K, int64_t F, const ExpertTile* __restrict__ tiles,
                               const int32_t* __restrict__ n_tiles, const int32_t* __restrict__ list, int64_t k,
                               QuantizedX xq, QuantizeTarget h8) {
  grid_dependency_wait();
  if (static_cast<int32_t>(blockIdx.y) >= *n_tiles) return;
  const ExpertTile tile = tiles[blockIdx.y];
  const int32_t* pairs = list + tile.first;
  const int64_t f0 = static_cast<int64_t>(blockIdx.x) * 32, first_row = tile.expert * F + f0;
  gemm_int8_tile_rows<I>(
      [=](int r) { return (r < 32 ? Wg : Wu) + (first_row + r % 32) * row_bytes; }, kGemmRows, K, 0, K / 32,
      tile.count, xq, [=](int c) { return static_cast<int64_t>(pairs[c] / k); },
      [&](const float(&acc)[2][4][4], int warp_row, int warp_col, int g, int t) {
        const float* gu = tile_sums_to_shared(acc, warp_row, warp_col, g, t);  // gate rows, then up
        // Eight lanes a column (pair), rows 4·(lane % 8) .. +3 each: four chunks a warp at a time.
        const int lane = threadIdx.x % 32, row0 = 4 * (lane % 8);
        for (int c = 4 * (threadIdx.x / 32) + lane / 8; c - lane / 8 < tile.count; c += kGemmThreads / 8) {
          if (c >= tile.count) continue;  // whole chunks of 8 lanes
          float h[4];
#pragma unroll
          for (int e = 0; e < 4; ++e)
            h[e] = silu_f(gu[(row0 + e) * kTileSumsPitch + c]) * gu[(32 + row0 + e) * kTileSumsPitch + c];
          quantize_q8_0_quad(h, static_cast<int64_t>(pairs[c]) * (F / 32) + f0 / 32, h8.codes, h8.scales);
        }
      });
}

// A stable counting sort of the (token, slot) pairs by expert, in one block. Warp w owns the
// pairs [w·seg, (w+1)·seg); count[w][e] first counts its pairs of expert e, then becomes the list
// slot of the next one. Pairs with an invalid expert id are left out and their rows of dn zeroed,
// so they add nothing (as in the decode kernels).
__global__ void group_pairs_kernel(const int32_t* __restrict__ ids, int64_t pairs, int64_t E,
                                   int32_t* __restrict__ list, ExpertTile* __restrict__ tiles,
                                   int32_t* __restrict__ n_tiles, float* __restrict__ dn, int64_t H) {
  grid_dependency_wait();
  extern __shared__ int32_t shared[];
  const int n_warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int32_t* count = shared;               // [n_warps][E]
  int32_t* total = count + n_warps * E;  // [E]
  int32_t* first = total + E;            // [E]: the expert's first list slot
  int32_t* first_tile = first + E;       // [E]
  const int64_t seg = (pairs + n_warps - 1) / n_warps;
  const int64_t begin = min(pairs, warp * seg), end = min(pairs, begin + seg);
  for (int64_t i = threadIdx.x; i < n_warps * E; i += blockDim.x) count[i] = 0;
  __syncthreads();
  for (int64_t p = begin + lane; p < end; p += 32) {
    const int32_t e = ids[p];
    if (e >= 0 && e < E)
      atomicAdd(&count[warp * E + e], 1);
    else
      for (int64_t d = 0; d < H; ++d) dn[p * H + d] = 0.0f;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int w = 0; w < n_warps; ++w) {
      const int32_t c = count[w * E + e];
      count[w * E + e] = run;
      run += c;
    }
    total[e] = run;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // a few hundred additions: a parallel scan would not pay
    int32_t slot = 0, tile = 0;
    for (int64_t e = 0; e < E; ++e) {
      first[e] = slot;
      first_tile[e] = tile;
      slot += total[e];
      tile += (total[e] + kGemmCols - 1) / kGemmCols;
    }
    *n_tiles = tile;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    for (int w = 0; w < n_warps; ++w) count[w * E + e] += first[e];
    for (int32_t c = 0; c < total[e]; c += kGemmCols)
      tiles[first_tile[e] + c / kGemmCols] = {static_cast<int32_t>(e), first[e] + c, min(kGemmCols, total[e] - c)};
  }
  __syncthreads();
  // Lanes with the same expert take consecutive slots in lane order: pair order within an expert.
  for (int64_t p0 = begin; p0 < end; p0 += 32) {
    const int64_t p = p0 + lane;
    const int32_t e = p < end ? ids[p] : -1;
    const bool valid = e >= 0 && e < E;
    const unsigned peers = __match_any_sync(0xffffffffu, valid ? e : -1);
    const int rank = __popc(peers & ((1u << lane) - 1));
    if (valid) list[count[warp * E + e] + rank] = static_cast<int32_t>(p);
    __syncwarp();
    if (valid && rank == 0) count[warp * E + e] += __popc(peers);
    __syncwarp();
  }
}

// The pairs grouped by expert, on the device: list (pairs of expert 0, then 1, ...) and its
// column tiles; max_tiles bounds their number (each expert's last tile may be partial).
struct ExpertGroups {
  Tensor list, tiles, n_tiles;
  int64_t max_tiles = 0;
};

ExpertGroups group_pairs(CudaBackend& be, const int32_t* ids, int64_t pairs, int64_t E, float* dn, int64_t H) {
  constexpr int64_t kSharedBytes = 48 * 1024;
  const int64_t warps = std::min<int64_t>(16, kSharedBytes / (4 * E) - 3);
  if (warps < 1) fail("moe_experts: ", E, " experts are too many for the grouping kernel");
  ExpertGroups groups;
  groups.max_tiles = blocks_for(pairs, kGemmCols) + E;
  groups.list = be.scratch_bytes(static_cast<size_t>(pairs) * sizeof(int32_t));
  groups.tiles = be.scratch_bytes(static_cast<size_t>(groups.max_tiles) * sizeof(ExpertTile));
  groups.n_tiles = be.scratch_bytes(sizeof(int32_t));
  launch(be.stream(), "group_pairs_kernel", group_pairs_kernel, 1, static_cast<unsigned>(warps * 32), static_cast<size_t>((warps + 3) * E * 4), ids, pairs, E, groups.list.i32(), reinterpret_cast<ExpertTile*>(groups.tiles.i32()), groups.n_tiles.i32(), dn, H);
  return groups;
}

// y[t][d] = Σ_j weights[t][j]·down[t·k + j][d]; grid per_token_grid(H / V, T): a thread takes V
// positions (V = 4 when H % 4 == 0: its k loads of 16 bytes go out together).
template <int V>
__global__ void moe_combine_kernel(const float* __restrict__ down, const float* __restrict__ weights, int64_t H, int64_t k,
                                   int64_t T, float* __restrict__ y) {
  grid_dependency_wait();
  using Vec = std::conditional_t<V == 4, float4, float>;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (V * i >= H) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    double acc[V] = {};
    for (int64_t j = 0; j < k; ++j) {
      const double w = weights[t * k + j];
      const Vec v = reinterpret_cast<const Vec*>(down + (t * k + j) * H)[i];
      const float* f = reinterpret_cast<const float*>(&v);
#pragma unroll
      for (int e = 0; e < V; ++e) acc[e] += w * f[e];
    }
    Vec out;
    float* o = reinterpret_cast<float*>(&out);
#pragma unroll
    for (int e = 0; e < V; ++e) o[e] = static_cast<float>(acc[e]);
    reinterpret_cast<Vec*>(y + t * H)[i] = out;
  }
}

SlotMatrix slot_matrix(const DeviceMatrix* m) { return m ? SlotMatrix{m->data, m->row_bytes, m->type} : SlotMatrix{}; }

// Whether the fused decode kernels can read these matrices: gate and up alike (they share a
// thread's activations), every type with a unit loader for its row length.
bool fits_decode_kernels(const DeviceMatrix& g, const DeviceMatrix& u, const DeviceMatrix& d, int64_t H, int64_t F) {
  return g.type == u.type && g.row_bytes == u.row_bytes && has_unit_loader(g.type, H) && has_unit_loader(d.type, F);
}

// Whether the down kernel reads h as the Q8_0 codes the gate/up kernel writes (as prefill's
// grouped products read h): routed and shared down rows Q8_0 on int8 activations, h in whole
// chunks. H200, paired, three rounds: decode 256.0 / 253.7 / 254.9 -> 258.9 / 257.1 / 253.3 tok/s
// (the gate/up kernel's 16-warp blocks alone: 251.9 / 253.3 / 252.0).
bool down_reads_h8(const CudaBackend& be, const DeviceMatrix& md, const DeviceMatrix* sd, int64_t F) {
  return F % 32 == 0 && be.int8_decode(GgmlType::Q8_0) && md.type == GgmlType::Q8_0 &&
         (!sd || sd->type == GgmlType::Q8_0);
}

// h between the decode kernels for `pairs` (token, slot) pairs: its Q8_0 codes when the down
// kernel reads those (down_reads_h8), else FP32 values; the other form stays empty.
struct DecodeH {
  Tensor values;
  QuantizedActivations q8;
};
DecodeH decode_h(CudaBackend& be, const DeviceMatrix& md, const DeviceMatrix* sd, int64_t pairs, int64_t F) {
  if (down_reads_h8(be, md, sd, F)) return {Tensor(), be.q8_scratch(pairs * F)};
  return {be.scratch_f32(pairs * F), QuantizedActivations{}};
}

// The largest expert count the gate/up kernel routes itself: 16 logits a lane in registers.
constexpr int64_t kMaxExpertsRoutedInGateUp = 512;

// The two fused decode kernels over T tokens: routed slots by `routing` and, when sg is not null,
// the shared expert (sg, su, sd) as one more slot gated by sigmoid(shared_logit).
void moe_decode(cudaStream_t stream, const DeviceMatrix& mg, const DeviceMatrix& mu, const DeviceMatrix& md,
                const DeviceMatrix* sg, const DeviceMatrix* su, const DeviceMatrix* sd, int64_t H, int64_t F,
                int64_t E, int64_t T, const SlotRouting& routing, int64_t k, const float* shared_logit,
                const float* x, const ExpertX8& x8, float* h, QuantizeTarget h8, float* out) {
  // Down: four rows per block.
  constexpr int kDownRows = 4;
  const int64_t slots = k + (sg ? 1 : 0);
  const SlotMatrices gate{slot_matrix(&mg), slot_matrix(sg)}, up{slot_matrix(&mu), slot_matrix(su)},
      down{slot_matrix(&md), slot_matrix(sd)};
  const auto gate_up = [&](auto kernel) {
    launch(stream, "expert_gate_up_kernel", kernel, dim3(blocks_for(F, kGateUpRows), static_cast<unsigned>(T * slots)), 32 * kGateUpWarps, 0, gate, up, H, F, E, routing, k, x, x8, h, h8);
  };
  if (!routing.logits)
    gate_up(expert_gate_up_kernel<0>);
  else if (E <= 64)
    gate_up(expert_gate_up_kernel<2>);
  else if (E <= kMaxExpertsRoutedInGateUp)
    gate_up(expert_gate_up_kernel<16>);
  else
    fail("cuda moe: ", E, " experts are too many to route in the gate/up kernel");
  const dim3 down_grid(blocks_for(H, kDownRows), static_cast<unsigned>(T));
  const int down_threads = gemv_threads(slots * (F / kUnit));
  if (h8.codes) {
    using U = Int8Unit<GgmlType::Q8_0>;
    const Int8X h8x{{h8.codes, h8.scales}, F};
    // One token routed from 64 experts at most picks its experts in the down kernel too (measured
    // there; with 512 the picks before the wait take eight times the compares).
    const bool picks = routing.logits && E <= 64 && T == 1 && k <= kMaxEarlyPicks;
    auto* kernel = picks ? expert_down_ahead_kernel<U, kDownRows, 2, Int8X, 2> : expert_down_ahead_kernel<U, kDownRows, 2, Int8X>;
    launch(stream, "expert_down_kernel", kernel, down_grid, down_threads, 0, down, F, H, E, routing.ids, routing.weights, routing.logits, k, shared_logit, h8x, out);
  } else if (!sd || sd->type == md.type) {
    dispatch_unit(md.type, [&](auto unit) {
      launch(stream, "expert_down_kernel", expert_down_ahead_kernel<decltype(unit), kDownRows, 2, FloatX>, down_grid, down_threads, 0, down, F, H, E, routing.ids, routing.weights, routing.logits, k, shared_logit, FloatX{h, F}, out);
    });
  } else {
    launch(stream, "expert_down_kernel", expert_down_kernel<kDownRows>, down_grid, down_threads, 0, down, F, H, E, routing.ids, routing.weights, k, shared_logit, h, out);
  }
}

// x [T][K] in the activation formats the int8 units of gate/up rows of these types read (Q8_0
// rows: Q8_0, Q4_K rows: Q8_K), as scratch for the router kernel to fill (`fill`), or filled here;
// Q8_0 is x_q8_0 when given (x's codes, already written).
struct ExpertX8Buffers {
  QuantizedActivations q8_0, q8_k;  // empty tensors: not wanted
  ExpertX8 view() const {
    return {q8_0.codes.empty() ? QuantizedX{} : q8_0.view(), q8_k.codes.empty() ? QuantizedX{} : q8_k.view()};
  }
};
ExpertX8Buffers expert_x8(CudaBackend& be, std::initializer_list<GgmlType> types, const float* x, int64_t T, int64_t K,
                          bool fill, const QuantizedActivations* x_q8_0 = nullptr) {
  ExpertX8Buffers b;
  for (GgmlType type : types) {
    if (!be.int8_decode(type)) continue;
    const bool block256 = quant::activation_type(type) == GgmlType::Q8_K;
    QuantizedActivations& q = block256 ? b.q8_k : b.q8_0;
    if (!q.codes.empty()) continue;
    if (!block256 && x_q8_0)
      q = *x_q8_0;
    else
      q = fill ? quantize_activations(be, block256, x, T, K) : be.q8_scratch(T * K);
  }
  return b;
}

void expert_matvec(const DeviceMatrix& w, int64_t N, int64_t E, const int32_t* ids, int64_t k, int64_t pairs,
                   const float* x, bool x_per_pair, float* out, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(pairs), blocks_for(N, kWarps));
  bool ok = dispatch_weight_type(w.type, [&](auto dq) {
    launch(stream, "expert_matvec_kernel", expert_matvec_kernel<decltype(dq)>, grid, 32 * kWarps, 0, w.data, w.row_bytes, w.K, N, E, ids, k, x, x_per_pair, out);
  });
  if (!ok) fail("cuda moe_experts: no decoder for ", type_name(w.type));
}

// The grouped product on activations already quantized for w's int8 tile.
void expert_gemm_int8(CudaBackend& be, const DeviceMatrix& w, int64_t N, const ExpertGroups& groups, int64_t k,
                      QuantizedX xq, bool x_per_pair, float* out) {
  dim3 grid(blocks_for(N, kGemmRows), static_cast<unsigned>(groups.max_tiles));
  dispatch_int8_type(w.type, [&](auto i8) {
    using I = decltype(i8);
    [[maybe_unused]] static const bool shared_ready =
        allow_max_shared(expert_gemm_int8_kernel<I>, kGemmInt8SharedBytes, "expert_gemm_int8_kernel shared memory");
    launch(be.stream(), "expert_gemm_int8_kernel", expert_gemm_int8_kernel<I>, grid, kGemmThreads, kGemmInt8SharedBytes, w.data, w.row_bytes, w.K, N, reinterpret_cast<const ExpertTile*>(groups.tiles.i32()), groups.n_tiles.i32(), groups.list.i32(), k, xq, x_per_pair, out);
  });
}

// Whether gate, up, SwiGLU and h's quantization can be one kernel (expert_gate_up_int8_kernel):
// gate and up alike on the int8 tile, h in whole Q8_0 chunks, and down taking Q8_0 activations.
bool fuses_gate_up(const CudaBackend& be, const DeviceMatrix& g, const DeviceMatrix& u, const DeviceMatrix& d, int64_t F) {
  return be.int8_product(g.type) && g.type == u.type && g.row_bytes == u.row_bytes && F % 32 == 0 &&
         be.int8_product(d.type) && !int8_block256(d.type);
}

// h8 = Q8_0(swiglu(gate·x, up·x)) for every routed pair (rows of h8: pairs).
void expert_gate_up_int8(CudaBackend& be, const DeviceMatrix& g, const DeviceMatrix& u, int64_t F,
                         const ExpertGroups& groups, int64_t k, const float* x, int64_t T, QuantizeTarget h8) {
  dispatch_int8_type(g.type, [&](auto i8) {
    using I = decltype(i8);
    [[maybe_unused]] static const bool shared_ready = allow_max_shared(
        expert_gate_up_int8_kernel<I>, kGemmInt8SharedBytes, "expert_gate_up_int8_kernel shared memory");
    QuantizedActivations xq = quantize_activations(be, I::kBlock256, x, T, g.K);
    const dim3 grid(static_cast<unsigned>(F / 32), static_cast<unsigned>(groups.max_tiles));
    launch(be.stream(), "expert_gate_up_int8_kernel", expert_gate_up_int8_kernel<I>, grid, kGemmThreads, kGemmInt8SharedBytes, g.data, u.data, g.row_bytes, g.K, F, reinterpret_cast<const ExpertTile*>(groups.tiles.i32()), groups.n_tiles.i32(), groups.list.i32(), k, xq.view(), h8);
  });
}

// x has x_rows rows: the tokens, or (x_per_pair) the pairs.
void expert_gemm(CudaBackend& be, const DeviceMatrix& w, int64_t N, const ExpertGroups& groups, int64_t k,
                 const float* x, int64_t x_rows, bool x_per_pair, float* out) {
  cudaStream_t stream = be.stream();
  if (be.int8_product(w.type)) {
    QuantizedActivations xq = quantize_activations(be, int8_block256(w.type), x, x_rows, w.K);
    expert_gemm_int8(be, w, N, groups, k, xq.view(), x_per_pair, out);
    return;
  }
  dim3 grid(blocks_for(N, kGemmRows), static_cast<unsigned>(groups.max_tiles));
  bool ok = dispatch_weight_type(w.type, [&](auto dq) {
    [[maybe_unused]] static const bool shared_ready =
        allow_max_shared(expert_gemm_kernel<decltype(dq)>, kGemmSharedBytes, "expert_gemm_kernel shared memory");
    launch(stream, "expert_gemm_kernel", expert_gemm_kernel<decltype(dq)>, grid, kGemmThreads, kGemmSharedBytes, w.data, w.row_bytes, w.K, N, reinterpret_cast<const ExpertTile*>(groups.tiles.i32()), groups.n_tiles.i32(), groups.list.i32(), k, x, x_per_pair, rows_vec4(x, w.K), out);
  });
  if (!ok) fail("cuda moe_experts: no decoder for ", type_name(w.type));
}

}  // namespace

void CudaBackend::moe_route(const Tensor& logits, int64_t k, Tensor& ids, Tensor& weights) {
  OpScope scope(profiler_, "moe_route", logits.ne(1), stream_);
  check_moe_route(logits, k, ids, weights);
  int64_t E = logits.ne(0), T = logits.ne(1);
  if (T == 0) return;
  with_logits_per_lane(E, [&](auto per_lane) {
    launch(stream_, "moe_route_kernel", moe_route_kernel<decltype(per_lane)::value>, blocks_for(T, 4), 128, 0, logits.f32(), E, T, k, ids.i32(), weights.f32());
  });
}

void CudaBackend::moe_experts(const MoeExpertsArgs& a) {
  OpScope scope(profiler_, "moe_experts", a.x->ne(1), stream_);
  check_moe_experts(a);
  const Weight &wg = *a.gate_exps, &wu = *a.up_exps, &wd = *a.down_exps;
  int64_t H = wg.ne[0], F = wg.ne[1], E = wg.ne[2], T = a.x->ne(1), k = a.ids->ne(0);
  int64_t pairs = k * T;
  if (pairs == 0) return;
  const DeviceMatrix &mg = matrix(wg), &mu = matrix(wu), &md = matrix(wd);
  if (T <= kMatvecMaxTokens && fits_decode_kernels(mg, mu, md, H, F)) {
    DecodeH h = decode_h(*this, md, nullptr, pairs, F);
    const ExpertX8Buffers x8 = expert_x8(*this, {mg.type}, a.x->f32(), T, H, true);
    moe_decode(stream_, mg, mu, md, nullptr, nullptr, nullptr, H, F, E, T, {a.ids->i32(), a.weights->f32(), nullptr}, k, nullptr,
               a.x->f32(), x8.view(), h.values.f32(), h.q8.target(), a.out->f32());
    return;
  }
  Tensor dn = scratch_f32(pairs * H);
  if (T <= kMatvecMaxTokens) {
    const int32_t* ids = a.ids->i32();
    Tensor g = scratch_f32(pairs * F), u = scratch_f32(pairs * F), h = scratch_f32(pairs * F);
    expert_matvec(mg, F, E, ids, k, pairs, a.x->f32(), false, g.f32(), stream_);
    expert_matvec(mu, F, E, ids, k, pairs, a.x->f32(), false, u.f32(), stream_);
    swiglu(g, u, h);
    expert_matvec(md, H, E, ids, k, pairs, h.f32(), true, dn.f32(), stream_);
  } else {
    // Grouped by expert on the device: no host sync in a prefill MoE.
    ExpertGroups groups = group_pairs(*this, a.ids->i32(), pairs, E, dn.f32(), H);
    if (groups.max_tiles > 65535) fail("moe_experts: ", groups.max_tiles, " column tiles exceed the grid");
    if (fuses_gate_up(*this, mg, mu, md, F)) {
      QuantizedActivations h8 = q8_scratch(pairs * F);
      expert_gate_up_int8(*this, mg, mu, F, groups, k, a.x->f32(), T, h8.target());
      expert_gemm_int8(*this, md, H, groups, k, h8.view(), true, dn.f32());
    } else {
      Tensor g = scratch_f32(pairs * F), u = scratch_f32(pairs * F), h = scratch_f32(pairs * F);
      expert_gemm(*this, mg, F, groups, k, a.x->f32(), T, false, g.f32());
      expert_gemm(*this, mu, F, groups, k, a.x->f32(), T, false, u.f32());
      swiglu(g, u, h);
      expert_gemm(*this, md, H, groups, k, h.f32(), pairs, true, dn.f32());
    }
  }
  if (H % 4 == 0)
    launch(stream_, "moe_combine_kernel", moe_combine_kernel<4>, per_token_grid(H / 4, T, 128), 128, 0, dn.f32(), a.weights->f32(), H, k, T, a.out->f32());
  else
    launch(stream_, "moe_combine_kernel", moe_combine_kernel<1>, per_token_grid(H, T, 256), 256, 0, dn.f32(), a.weights->f32(), H, k, T, a.out->f32());
}

void CudaBackend::moe_ffn(const MoeFfnArgs& a) {
  check_moe_ffn(a);
  const int64_t H = a.x->ne(0), T = a.x->ne(1), F = a.gate_exps->ne[1], E = a.gate_exps->ne[2], k = a.k;
  if (T > kMatvecMaxTokens || a.shared_gate->ne[1] != F) return Backend::moe_ffn(a);
  const DeviceMatrix &mg = matrix(*a.gate_exps), &mu = matrix(*a.up_exps), &md = matrix(*a.down_exps);
  const DeviceMatrix &sg = matrix(*a.shared_gate), &su = matrix(*a.shared_up), &sd = matrix(*a.shared_down);
  if (!fits_decode_kernels(mg, mu, md, H, F) || !fits_decode_kernels(sg, su, sd, H, F)) return Backend::moe_ffn(a);
  // Decode: router and shared-expert gate in one kernel, then the routed experts and the shared one
  // together in the two fused kernels, the first of which routes: three launches.
  OpScope scope(profiler_, "moe_ffn", T, stream_);
  Tensor s = output_f32(1, T), ids = alloc_output(DType::I32, {k, T, 1, 1}), weights = output_f32(k, T);
  DecodeH h = decode_h(*this, md, &sd, (k + 1) * T, F);
  const DeviceMatrix &router = matrix(*a.router), &gate_inp = matrix(*a.shared_gate_inp);
  const bool router_kernel = router.type == gate_inp.type && has_unit_loader(router.type, H);
  // x for the gate/up kernel's int8 units: its Q8_0 codes when the op before wrote them (HC's
  // up/mix kernel does), the rest quantized by the router kernel, or here.
  const QuantizedActivations* x_q8_0 = q8_input(*a.x);
  ExpertX8Buffers x8 = expert_x8(*this, {mg.type, sg.type}, a.x->f32(), T, H, !router_kernel, x_q8_0);
  if (router_kernel) {
    const QuantizeTarget q8_0 = x_q8_0 ? QuantizeTarget{} : x8.q8_0.target(), q8_k = x8.q8_k.target();
    const int threads = gemv_threads(H / kUnit);
    const int64_t quantize_warps = (q8_k.codes ? T * H / 256 : 0) + (q8_0.codes ? T * H / 32 : 0);
    const int64_t blocks = E + 1 + (quantize_warps + threads / 32 - 1) / (threads / 32);
    // An instance for one, two, up to four and up to eight tokens: the eight-token one holds eight
    // tokens' activations (189 registers) whatever T is.
    auto* kernel = T == 1   ? moe_router_kernel<1, 1>
                   : T == 2 ? moe_router_kernel<1, 2>
                   : T <= 4 ? moe_router_kernel<1, 4>
                            : moe_router_kernel<1, kMatvecMaxTokens>;
    launch(stream_, "moe_router_kernel", kernel, static_cast<unsigned>(blocks), threads, 0, slot_matrix(&router), slot_matrix(&gate_inp), H, E, a.x->f32(), static_cast<int>(T), a.logits->f32(), s.f32(), q8_0, q8_k);
  } else {
    const std::array<const Weight*, 2> ws{a.router, a.shared_gate_inp};
    const std::array<Tensor*, 2> outs{a.logits, &s};
    mul_mat_shared_input(ws, *a.x, outs);
  }
  const bool route_in_gate_up = E <= kMaxExpertsRoutedInGateUp;
  if (!route_in_gate_up) moe_route(*a.logits, k, ids, weights);
  moe_decode(stream_, mg, mu, md, &sg, &su, &sd, H, F, E, T, {ids.i32(), weights.f32(), route_in_gate_up ? a.logits->f32() : nullptr},
             k, s.f32(), a.x->f32(), x8.view(), h.values.f32(), h.q8.target(), a.out->f32());
}

}  // namespace regolith::cuda
