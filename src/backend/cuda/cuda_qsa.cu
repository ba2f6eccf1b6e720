// CUDA QSA (model-spec §4.5): q/gate split, pooled block keys, block selection, gated attention.
// Selection must choose exactly the blocks the reference chooses (backend/qsa_topk.h): scores are
// FP64 sums in one fixed order per kernel (prefill's tiles in the reference's own), so equal
// inputs give bit-equal scores, and the top k are found exactly by counting the scores' bits into
// buckets, with equal scores going to the lower block index.
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemm_int8.cuh"
#include "backend/cuda/cuda_mma.cuh"

namespace regolith::cuda {

namespace {

constexpr int kThreads = 256;

// Token t's position in the QSA kernels. Where a step's positions follow one another (decode, and
// prefill's chunks) the kernels get the first one as a parameter; the list is uploaded only
// otherwise. A decode step's position is new every step, so its upload was a host copy inside
// the step's graph, between the input products and the prepare kernel (no programmatic edge
// there; session 44's trace showed about 7 µs of idle at it).
struct TokenPositions {
  const int64_t* list;  // null: first + t
  int64_t first;
  __device__ int64_t operator[](int64_t t) const { return list ? list[t] : first + t; }
  TokenPositions from(int64_t t0) const { return {list ? list + t0 : nullptr, first + t0}; }
};

TokenPositions token_positions(CudaBackend& be, std::span<const int64_t> positions) {
  for (size_t t = 1; t < positions.size(); ++t)
    if (positions[t] != positions[0] + static_cast<int64_t>(t)) return {be.cached_upload(positions), 0};
  return {nullptr, positions.empty() ? 0 : positions[0]};
}

__global__ void split_q_gate_kernel(const float* qg, float* q, float* gate, int64_t hd, int64_t n) {
  grid_dependency_wait();
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int64_t r = i / hd, c = i % hd;
  q[i] = qg[r * 2 * hd + c];
  gate[i] = qg[r * 2 * hd + hd + c];
}

// The heads qsa_prepare works on, for each token: nh query heads, nkv key heads, nkv value heads,
// n_idx indexer query heads, then the indexer key.
struct QsaPrepareShape {
  int64_t hd, nh, nkv, di, n_idx, half, n0;
  float eps;
};

// Grid (heads, T), one block a head of a token: value heads and the indexer key are copied into
// their caches; query, key and indexer query heads are RMS-normed as rms_norm_kernel norms them
// (block_inv_rms: the same values) and rotated as rope_kernel rotates them, the key head also
// into its cache. Dynamic shared memory: max(hd, di) floats. What does not come from the products
// before (norm weights, each pair's cosine and sine from the position, as rope_pair forms them)
// is ready before the wait; a head of at most a value a thread then takes one trip to memory.
__global__ void qsa_prepare_kernel(const float* qg, const float* k, const float* v, const float* iq, const float* ik,
                                   const float* q_norm, const float* k_norm, const float* iq_norm,
                                   TokenPositions positions, const float* inv_freq, QsaPrepareShape d, float* q_out,
                                   float* gate_out, float* k_out, float* iq_out, float* k_cache, float* v_cache,
                                   float* ik_cache) {
  extern __shared__ float head[];
  const int64_t t = blockIdx.y, row = d.n0 + t;
  const int64_t j = blockIdx.x;
  const bool value_head = j >= d.nh + d.nkv && j < d.nh + 2 * d.nkv, index_key = j == d.nh + 2 * d.nkv + d.n_idx;
  const float *src = nullptr, *w = nullptr;
  float *dst = nullptr, *cached = nullptr, *gate = nullptr;
  int64_t n = d.hd;
  if (j < d.nh) {  // a query head, its gate beside it
    src = qg + (t * d.nh + j) * 2 * d.hd, w = q_norm, dst = q_out + (t * d.nh + j) * d.hd;
    gate = gate_out + (t * d.nh + j) * d.hd;
  } else if (j < d.nh + d.nkv) {  // a key head
    src = k + (t * d.nkv + j - d.nh) * d.hd, w = k_norm, dst = k_out + (t * d.nkv + j - d.nh) * d.hd;
    cached = k_cache + (row * d.nkv + j - d.nh) * d.hd;
  } else if (!value_head && !index_key) {  // an indexer query head
    const int64_t q = j - (d.nh + 2 * d.nkv);
    n = d.di, src = iq + (t * d.n_idx + q) * d.di, w = iq_norm, dst = iq_out + (t * d.n_idx + q) * d.di;
  }
  const bool a_value_a_thread = n <= blockDim.x && d.half <= blockDim.x;
  const int64_t i = threadIdx.x;
  const float wi = src && a_value_a_thread && i < n ? w[i] : 0.0f;
  double c = 0, sn = 0;  // pair i's rotation
  if (src && a_value_a_thread && i < d.half) rope_angle(inv_freq[i], positions[t], c, sn);
  grid_dependency_wait();
  if (value_head) {
    const int64_t h = j - (d.nh + d.nkv);
    for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) v_cache[(row * d.nkv + h) * d.hd + e] = v[(t * d.nkv + h) * d.hd + e];
    return;
  }
  if (index_key) {
    for (int64_t e = threadIdx.x; e < d.di; e += blockDim.x) ik_cache[row * d.di + e] = ik[t * d.di + e];
    return;
  }
  if (a_value_a_thread) {
    const float xi = i < n ? src[i] : 0.0f;
    if (gate && i < d.hd) gate[i] = src[d.hd + i];
    const double r = inv_rms(block_sum(static_cast<double>(xi) * xi), n, d.eps);
    if (i < n) head[i] = static_cast<float>(xi * r * static_cast<double>(wi));
    __syncthreads();
    if (i < d.half) rotate_pair(head, i, d.half, c, sn);
  } else {
    if (gate)
      for (int64_t e = threadIdx.x; e < d.hd; e += blockDim.x) gate[e] = src[d.hd + e];
    const double r = block_inv_rms(src, n, d.eps);
    for (int64_t e = threadIdx.x; e < n; e += blockDim.x) head[e] = static_cast<float>(src[e] * r * static_cast<double>(w[e]));
    __syncthreads();
    for (int64_t e = threadIdx.x; e < d.half; e += blockDim.x) rope_pair(head, e, d.half, inv_freq[e], positions[t]);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < n; e += blockDim.x) {
    dst[e] = head[e];
    if (cached) cached[e] = head[e];
  }
}

// One block per pooled block: mean of its raw keys, RMSNorm, RoPE at the block's first position,
// rotated in shared memory and written once. With at most a value a thread (the model's 128
// indexer values) the norm weight and the pair's rotation are ready before the wait; the raw keys
// come from the prepare kernel just before.
__global__ void qsa_pool_kernel(const float* raw, const float* w, const float* inv_freq, int64_t d, int64_t ratio,
                                int64_t block_begin, int64_t half, float eps, float* pooled) {
  extern __shared__ float head[];
  const int64_t b = block_begin + blockIdx.x, i = threadIdx.x;
  const bool a_value_a_thread = d <= blockDim.x;
  const float wi = a_value_a_thread && i < d ? w[i] : 0.0f;
  double c = 0, sn = 0;  // pair i's rotation
  if (a_value_a_thread && i < half) rope_angle(inv_freq[i], b * ratio, c, sn);
  grid_dependency_wait();
  double ss = 0;
  for (int64_t e = i; e < d; e += blockDim.x) {
    double s = 0;
    for (int64_t j = 0; j < ratio; ++j) s += raw[(b * ratio + j) * d + e];
    const float m = static_cast<float>(s / ratio);
    head[e] = m;
    ss += static_cast<double>(m) * m;
  }
  const double r = inv_rms(block_sum(ss), d, eps);
  for (int64_t e = i; e < d; e += blockDim.x) head[e] = static_cast<float>(head[e] * r * (a_value_a_thread ? wi : w[e]));
  __syncthreads();
  for (int64_t e = i; e < half; e += blockDim.x) {
    if (a_value_a_thread) rotate_pair(head, e, half, c, sn);
    else rope_pair(head, e, half, inv_freq[e], b * ratio);
  }
  __syncthreads();
  for (int64_t e = i; e < d; e += blockDim.x) pooled[b * d + e] = head[e];
}

// scores[t][b] = Σ_h relu(iq_h · K_b) / sqrt(d) in FP64, for a few tokens (decode). Four threads
// (a quad) a pooled block: the quad reads the key row in 64-byte steps, each thread issuing all
// its loads before the first product (one memory trip a row), against its token's queries staged
// as doubles in shared memory. Each thread's part is summed in index order, the four parts meet
// in two shuffles, the same order for every block, so equal rows give equal scores. (A warp a
// block, with a double shuffle reduction per head, was instruction-bound at 32K context; a thread
// a block waited a memory trip for each of its loads.)
constexpr int kScoreQuad = 4;
constexpr int kScoreQuadThreads = 256;  // 64 blocks: 8,192 blocks at 32K context take 128 SMs
constexpr int kScoreQuadVec = 8;        // float4 loads a thread holds: rows up to 128 values
constexpr int kScoreHeads = 4;          // heads summed together per pass over the key row

__global__ void __launch_bounds__(kScoreQuadThreads)
    qsa_score_quad_kernel(const float* __restrict__ iq, const float* __restrict__ pooled,
                          TokenPositions positions, int64_t d, int64_t nh, int64_t ratio,
                          int64_t nb_max, double* __restrict__ scores) {
  extern __shared__ double q_rows[];  // [nh][d]
  grid_dependency_wait();
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < nh * d; i += blockDim.x) q_rows[i] = iq[t * nh * d + i];
  __syncthreads();
  const int64_t nb = (positions[t] + 1) / ratio;
  const int part = threadIdx.x % kScoreQuad;
  const int64_t b = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) / kScoreQuad;
  // Whole quads leave together, so the shuffles below see all four threads.
  if (b >= nb) return;
  const float* kb = pooled + b * d;
  const int64_t n_vec = d / (4 * kScoreQuad);
  const bool by_vec = d % (4 * kScoreQuad) == 0 && n_vec <= kScoreQuadVec &&
                      reinterpret_cast<uintptr_t>(pooled) % 16 == 0;
  float4 k4[kScoreQuadVec];
  if (by_vec) {
#pragma unroll
    for (int m = 0; m < kScoreQuadVec; ++m)
      if (m < n_vec) k4[m] = *reinterpret_cast<const float4*>(kb + 4 * (kScoreQuad * m + part));
  }
  double s = 0;
  for (int64_t h0 = 0; h0 < nh; h0 += kScoreHeads) {
    const int heads = static_cast<int>(min(static_cast<int64_t>(kScoreHeads), nh - h0));
    const double* q = q_rows + h0 * d;
    double dot[kScoreHeads] = {};
    const auto add = [&](int64_t i, float kf) {
      const double k = kf;
#pragma unroll
      for (int j = 0; j < kScoreHeads; ++j)
        if (j < heads) dot[j] = fma(q[j * d + i], k, dot[j]);
    };
    if (by_vec) {
#pragma unroll
      for (int m = 0; m < kScoreQuadVec; ++m)
        if (m < n_vec) {
          const int64_t i = 4 * (kScoreQuad * m + part);
          add(i, k4[m].x), add(i + 1, k4[m].y), add(i + 2, k4[m].z), add(i + 3, k4[m].w);
        }
    } else {
      for (int64_t i = part; i < d; i += kScoreQuad) add(i, kb[i]);
    }
    const unsigned quad_mask = 0xFu << (threadIdx.x % 32 / kScoreQuad * kScoreQuad);
#pragma unroll
    for (int j = 0; j < kScoreHeads; ++j) {
      dot[j] += __shfl_xor_sync(quad_mask, dot[j], 1);
      dot[j] += __shfl_xor_sync(quad_mask, dot[j], 2);
      if (j < heads) s += 0.0 < dot[j] ? dot[j] : 0.0;
    }
  }
  if (part == 0) scores[t * nb_max + b] = s / sqrt(static_cast<double>(d));
}

// The same scores for many tokens, as a tiled product: a block of 256 threads scores a tile of
// kScoreTile tokens × kScoreTile pooled blocks, each thread 4 tokens (ty + 16r) × 4 blocks (tx +
// 16c), with 32-value slices of the rows staged in shared memory as doubles. Each dot product is
// summed in FP64 in index order with fused multiply-adds, which round as the reference's loop does
// (a float product is exact in FP64), so these scores equal the reference's bit for bit.
constexpr int kScoreTile = 64;
constexpr int kScoreSlice = 32;
constexpr int kScorePitch = kScoreSlice + 1;  // doubles: the 16 rows a warp reads fall on distinct banks

__global__ void __launch_bounds__(256)
    qsa_score_tiled_kernel(const float* __restrict__ iq, const float* __restrict__ pooled,
                           TokenPositions positions, int64_t T, int64_t d, int64_t nh, int64_t ratio,
                           int64_t nb_max, double* __restrict__ scores) {
  grid_dependency_wait();
  __shared__ double qs[kScoreTile][kScorePitch], ks[kScoreTile][kScorePitch];
  __shared__ int64_t tile_nb;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kScoreTile, b0 = static_cast<int64_t>(blockIdx.y) * kScoreTile;
  if (tid < 32) {  // the most blocks any token of the tile scores
    int64_t nb = 0;
    for (int64_t t = t0 + tid; t < T && t < t0 + kScoreTile; t += 32) nb = max(nb, (positions[t] + 1) / ratio);
    for (int o = 16; o > 0; o >>= 1) nb = max(nb, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, nb, o)));
    if (tid == 0) tile_nb = nb;
  }
  __syncthreads();
  if (b0 >= tile_nb) return;
  double s[4][4] = {};
  for (int64_t h = 0; h < nh; ++h) {
    double dot[4][4] = {};
    for (int64_t i0 = 0; i0 < d; i0 += kScoreSlice) {
      __syncthreads();  // the previous slice has been read
      for (int e = tid; e < kScoreTile * kScoreSlice; e += 256) {
        const int row = e / kScoreSlice, i = e % kScoreSlice;
        const int64_t t = t0 + row, b = b0 + row;
        const bool in_d = i0 + i < d;
        qs[row][i] = t < T && in_d ? static_cast<double>(iq[(t * nh + h) * d + i0 + i]) : 0.0;
        ks[row][i] = b < nb_max && in_d ? static_cast<double>(pooled[b * d + i0 + i]) : 0.0;
      }
      __syncthreads();
#pragma unroll 8
      for (int i = 0; i < kScoreSlice; ++i) {
        double q[4], k[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) q[r] = qs[ty + 16 * r][i], k[r] = ks[tx + 16 * r][i];
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 4; ++c) dot[r][c] = fma(q[r], k[c], dot[r][c]);
      }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[r][c] += 0.0 < dot[r][c] ? dot[r][c] : 0.0;
  }
  const double norm = sqrt(static_cast<double>(d));
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t t = t0 + ty + 16 * r;
    if (t >= T) continue;
    const int64_t nb = (positions[t] + 1) / ratio;
#pragma unroll
    for (int c = 0; c < 4; ++c)
      if (const int64_t b = b0 + tx + 16 * c; b < nb) scores[t * nb_max + b] = s[r][c] / norm;
  }
}

// Orders doubles as unsigned integers: a larger score gives a larger key.
__device__ __forceinline__ uint64_t score_key(double s) {
  uint64_t u = static_cast<uint64_t>(__double_as_longlong(s));
  return (u >> 63) ? ~u : (u | (1ull << 63));
}

// One block per query row: the top k blocks (ties to the lower index), ascending, then the tail.
// Decode has one row, so the block is as wide as a block gets: at 32K context it chooses 512 of
// the row's 8,192 scores. Rows of up to kChooseSharedKeys blocks are read once, as keys, into
// shared memory (every pass read them from L2 again, and each trip held up the pass).
//
// The k-th largest key is found by counting keys into 2,048 buckets of equal width, first over
// [min key, max key], then inside the bucket where the count from the top reaches k, until the
// bucket is taken whole, holds one key value, or holds at most 32 keys, which one warp ranks
// against each other. Keys are the scores' bits, so the first round buckets by exponent and the
// second by mantissa: two rounds for a decode row at 32K, each a plain shared-memory count. H200,
// 32K context, chain share a call: 15.8 µs for 8-bit digits from the top (eight passes, each
// through the match unit), 12.1–14.6 µs this way; adding lanes of equal buckets once through the
// match unit here lost 2.2% of decode at 32K.
constexpr int kChooseThreads = 1024, kChooseWarps = kChooseThreads / 32;
constexpr int kChooseBinBits = 11, kChooseBins = 1 << kChooseBinBits;  // bits of the key a round
static_assert(kChooseBins == 2 * kChooseThreads, "the scan over the buckets takes two a thread");
constexpr int64_t kChooseSharedKeys = 16384;  // 128 KB: contexts up to 64K at ratio 4
__global__ void __launch_bounds__(kChooseThreads) qsa_choose_kernel(const double* __restrict__ scores,
                                                                    TokenPositions positions, int64_t ratio,
                                                                    int64_t top_blocks, int64_t nb_max, int64_t max_sel,
                                                                    int32_t* sel, int32_t* n_sel) {
  grid_dependency_wait();
  using Scan = cub::BlockScan<int, kChooseThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ unsigned hist[kChooseBins];
  __shared__ unsigned long long s_min, s_max;
  __shared__ uint64_t s_lo;
  __shared__ int64_t s_need;
  __shared__ int s_m, s_count;
  __shared__ uint64_t cand_key[32];
  __shared__ int32_t cand_block[32];
  __shared__ int warp_gt[kChooseWarps], warp_eq[kChooseWarps];
  const int64_t t = blockIdx.x, p = positions[t], nb = (p + 1) / ratio, k = min(top_blocks, nb);
  const double* sc = scores + t * nb_max;
  int32_t* out = sel + t * max_sel;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  extern __shared__ uint64_t row_keys[];  // [nb] when staged
  const bool staged = nb_max <= kChooseSharedKeys, take_all = k >= nb, search = !take_all && k > 0;
  const auto key_at = [&](int64_t b) { return staged ? row_keys[b] : score_key(sc[b]); };

  // Chosen: every key above hi, and the first `need` blocks (in index order) whose key lies in
  // [lo, hi].
  uint64_t lo = 0, hi = 0;
  int64_t need = 0;
  if (search) {
    if (tid == 0) s_min = ~0ull, s_max = 0, s_count = 0;
    hist[tid] = hist[tid + kChooseThreads] = 0;
    __syncthreads();
    unsigned long long kmin = ~0ull, kmax = 0;
#pragma unroll 8
    for (int64_t b = tid; b < nb; b += kChooseThreads) {
      const uint64_t key = score_key(sc[b]);
      if (staged) row_keys[b] = key;
      kmin = min(kmin, static_cast<unsigned long long>(key)), kmax = max(kmax, static_cast<unsigned long long>(key));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      kmin = min(kmin, __shfl_xor_sync(0xffffffffu, kmin, o));
      kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, o));
    }
    if (lane == 0) atomicMin(&s_min, kmin), atomicMax(&s_max, kmax);
    __syncthreads();
    lo = s_min;
    int64_t remaining = k;
    const uint64_t range = s_max - s_min;
    if (range == 0) {
      hi = lo, need = remaining;  // every key equal
    } else {
      int shift = max(0, 64 - __clzll(static_cast<long long>(range)) - kChooseBinBits);
      for (;;) {
#pragma unroll 8
        for (int64_t b = tid; b < nb; b += kChooseThreads) {
          const uint64_t key = key_at(b);
          if (key >= lo && (key - lo) >> shift < kChooseBins) atomicAdd(&hist[(key - lo) >> shift], 1u);
        }
        __syncthreads();
        // Thread i holds buckets 2047 − 2i and 2046 − 2i; a scan counts the keys above them, and
        // the thread whose buckets hold the crossing names it.
        const int top = kChooseBins - 1 - 2 * tid;
        const int c_top = static_cast<int>(hist[top]), c_next = static_cast<int>(hist[top - 1]);
        int above;
        Scan(scan_storage).ExclusiveSum(c_top + c_next, above);
        if (above < remaining && above + c_top + c_next >= remaining) {
          const bool first = above + c_top >= remaining;
          s_lo = lo + (static_cast<uint64_t>(first ? top : top - 1) << shift);
          s_need = remaining - above - (first ? 0 : c_top);
          s_m = first ? c_top : c_next;
        }
        __syncthreads();
        lo = s_lo, remaining = s_need;
        const int m = s_m;
        const uint64_t last = lo + ((1ull << shift) - 1);  // the bucket is [lo, last]
        if (m == remaining || shift == 0) {  // taken whole, or one key value
          hi = last, need = remaining;
          break;
        }
        if (m <= 32) {
          // The bucket's keys, a lane each, ranked against each other (higher key, then lower
          // block, first): the one ranked remaining − 1 is the last chosen, and its key the only
          // one taken in part.
#pragma unroll 8
          for (int64_t b = tid; b < nb; b += kChooseThreads) {
            const uint64_t key = key_at(b);
            if (key >= lo && key <= last) {
              const int slot = atomicAdd(&s_count, 1);
              cand_key[slot] = key, cand_block[slot] = static_cast<int32_t>(b);
            }
          }
          __syncthreads();
          if (warp == 0) {
            const uint64_t mine = lane < m ? cand_key[lane] : 0;
            const int32_t at = lane < m ? cand_block[lane] : 0;
            int rank = 0, equal_before = 0;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
              const uint64_t other = __shfl_sync(0xffffffffu, mine, j);
              const int32_t other_at = __shfl_sync(0xffffffffu, at, j);
              const bool before = j < m && other == mine && other_at < at;
              rank += (j < m && other > mine) || before;
              equal_before += before;
            }
            if (lane < m && rank == remaining - 1) s_lo = mine, s_need = equal_before + 1;
          }
          __syncthreads();
          lo = hi = s_lo, need = s_need;
          break;
        }
        hist[tid] = hist[tid + kChooseThreads] = 0;
        shift = max(0, shift - kChooseBinBits);
        __syncthreads();
      }
    }
  }

  // Blocks in index order: every key above hi, and the first `need` keys in [lo, hi]. Warp w takes
  // a run of blocks (32 at a time, a block a lane); the runs' counts meet once in shared memory,
  // and inside a run ballots order the picks.
  if (k > 0) {
    const int64_t per_warp = (nb + 32 * kChooseWarps - 1) / (32 * kChooseWarps) * 32;
    const int64_t w0 = warp * per_warp, w1 = min(nb, w0 + per_warp);
    const unsigned below = (1u << lane) - 1;  // lanes before this one
    const auto classify = [&](int64_t b, bool& gt, bool& eq) {
      const uint64_t key = b < w1 && !take_all ? key_at(b) : 0;  // a row taking all has no scores
      gt = b < w1 && (take_all || key > hi);
      eq = b < w1 && !take_all && key >= lo && key <= hi;
    };
    int gt_count = 0, eq_count = 0;
    for (int64_t b = w0 + lane; b < w0 + per_warp && b - lane < w1; b += 32) {
      bool gt, eq;
      classify(b, gt, eq);
      gt_count += __popc(__ballot_sync(0xffffffffu, gt));
      eq_count += __popc(__ballot_sync(0xffffffffu, eq));
    }
    if (lane == 0) warp_gt[warp] = gt_count, warp_eq[warp] = eq_count;
    __syncthreads();
    const int gt_before = __reduce_add_sync(0xffffffffu, lane < warp ? warp_gt[lane] : 0);
    int64_t eq_seen = __reduce_add_sync(0xffffffffu, lane < warp ? warp_eq[lane] : 0);
    int64_t at = gt_before + min(eq_seen, need);  // picks of the runs before this one
    for (int64_t b = w0 + lane; b < w0 + per_warp && b - lane < w1; b += 32) {
      bool gt, eq;
      classify(b, gt, eq);
      const unsigned eqs = __ballot_sync(0xffffffffu, eq);
      const bool chosen = gt || (eq && eq_seen + __popc(eqs & below) < need);
      const unsigned picks = __ballot_sync(0xffffffffu, chosen);
      if (chosen) {
        const int64_t slot = at + __popc(picks & below);
        for (int64_t i = 0; i < ratio; ++i) out[slot * ratio + i] = static_cast<int32_t>(b * ratio + i);
      }
      eq_seen += __popc(eqs), at += __popc(picks);
    }
  }
  const int64_t n_tail = p + 1 - nb * ratio, n_total = k * ratio + n_tail;
  for (int64_t i = tid; i < n_tail; i += kChooseThreads) out[k * ratio + i] = static_cast<int32_t>(nb * ratio + i);
  for (int64_t i = n_total + tid; i < max_sel; i += kChooseThreads) out[i] = -1;
  if (tid == 0) n_sel[t] = static_cast<int32_t>(n_total);
}

// One block per (token, head). Selected positions outside the cache are skipped (qsa_select never
// produces them).
__global__ void qsa_attend_kernel(const float* q, const float* gate, const float* kc, const float* vc,
                                  const int32_t* sel, const int32_t* n_sel, int64_t hd, int64_t nh, int64_t nkv,
                                  int64_t cap, int64_t max_sel, float scale, float* out) {
  grid_dependency_wait();
  extern __shared__ float p[];  // [max_sel] scores, then probabilities
  const int64_t t = blockIdx.x, h = blockIdx.y, g = h / (nh / nkv);
  const int64_t n = n_sel[t];
  const int32_t* s = sel + t * max_sel;
  const float* qh = q + (t * nh + h) * hd;
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float v = -INFINITY;
    if (s[j] >= 0 && s[j] < cap) {
      const float* kr = kc + (s[j] * nkv + g) * hd;
      float dot = 0;
      for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kr[i];
      v = dot * scale;
    }
    p[j] = v;
    local_max = fmaxf(local_max, v);
  }
  const float mx = block_max(local_max);
  float local_sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    float e = p[j] == -INFINITY ? 0.0f : expf(p[j] - mx);
    p[j] = e;
    local_sum += e;
  }
  const float sum = block_sum(local_sum);  // also orders the p[] writes before the reads below
  for (int64_t i = threadIdx.x; i < hd; i += blockDim.x) {
    float o = 0;
    for (int64_t j = 0; j < n; ++j)
      if (p[j] != 0.0f) o += p[j] * vc[(s[j] * nkv + g) * hd + i];
    out[(t * nh + h) * hd + i] = static_cast<float>(static_cast<double>(o / sum) * sigmoid_d(gate[(t * nh + h) * hd + i]));
  }
}

// The selected positions of each (token, kv head) are split over Z blocks, one per (token, kv
// head, split); a block walks its share of the selection in chunks of kAttendChunk positions
// (chunks z, z + Z, ...; at most kAttendChunk long, shorter when the selection is short, so that
// a short decode still spreads over blocks), scoring every query head of the group against each K row it reads once
// (a warp per position), keeping a running softmax per head (max m, sum l), and adding the V rows
// with a thread per dimension, so that each V element is read once for all the group's heads. A
// combine pass merges the splits' partials. Splits fill the GPU: decode takes up to a split per
// chunk (work spread over many blocks however long the context), more tokens fewer. Head widths
// with a tensor-core instance (64, 128, 192, 256) take qsa_attend_mma_kernel instead.
constexpr int kAttendChunk = 64;
constexpr int kAttendMaxGroup = 16;  // query heads per kv head
constexpr int kAttendThreads = 256;  // also the widest head: a thread per dimension
constexpr int64_t kAttendTargetBlocks = 2048;
// Chunks get shorter so that a call's positions spread over about this many blocks (measured when
// this kernel took the flash-next decode: its 2,051 selected positions over two kv heads made
// chunks of 40 positions, 104 blocks; at 64, 66 blocks, decode at 8K and 32K was 4% slower).
constexpr int64_t kAttendMinBlocks = 128;

// Partials of split z for query heads h of group g: m (max score), l (Σ exp(score − m)) and
// o[i] (Σ exp(score − m)·v_i), at ((t·nkv + g)·Z + z)·G + h. A chunk's K and V rows are gathered
// into shared memory by cp.async, all of them at once (K one group, V the next), so the chunk costs
// one memory trip. hd is a multiple of 4 (16-byte pieces).
__global__ void __launch_bounds__(kAttendThreads)
    qsa_attend_chunk_kernel(const float* q, const float* kc, const float* vc, const int32_t* sel, const int32_t* n_sel,
                            int64_t dense_n0, int64_t dense_rows, int64_t hd, int64_t nh, int64_t nkv, int64_t cap,
                            int64_t max_sel, int64_t chunk, int64_t n_splits, float scale, float* part_m, float* part_l,
                            float* part_o) {
  grid_dependency_wait();
  extern __shared__ __align__(16) float smem[];
  const int64_t t = blockIdx.x, g = blockIdx.y, z = blockIdx.z, G = nh / nkv;
  float* qs = smem;                      // [G][hd]
  float* ks = qs + G * hd;               // [chunk][hd] the chunk's K rows
  float* vs = ks + chunk * hd;           // [chunk][hd] its V rows
  float* p = vs + chunk * hd;            // [G][kAttendChunk] scores, then exp(score − m)
  float* run_m = p + G * kAttendChunk;   // [G] running max
  float* run_l = run_m + G;              // [G] running sum
  float* rescale = run_l + G;            // [G] exp(old m − new m) of the chunk just scored
  const bool dense = t < dense_rows;  // positions 0 .. dense_n0 + t, sel not read
  const int64_t n_total = dense ? dense_n0 + t + 1 : n_sel[t];
  const int64_t base = ((t * nkv + g) * n_splits + z) * G;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  const int64_t i = threadIdx.x;  // this thread's dimension of the output
  __shared__ int rows[kAttendChunk];  // the chunk's cache rows, −1 where a selection is invalid
  for (int64_t k = threadIdx.x; k < G * hd; k += blockDim.x) qs[k] = q[(t * nh + g * G) * hd + k];
  for (int64_t h = threadIdx.x; h < G; h += blockDim.x) run_m[h] = -INFINITY, run_l[h] = 0.0f;
  float o[kAttendMaxGroup] = {};
  const int64_t pieces = hd / 4;  // 16-byte pieces of a row
  for (int64_t j0 = z * chunk; j0 < n_total; j0 += n_splits * chunk) {
    const int64_t n = min(n_total - j0, chunk);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      const int32_t pos = dense ? static_cast<int32_t>(j0 + j) : sel[t * max_sel + j0 + j];
      rows[j] = pos >= 0 && pos < cap ? pos : -1;
    }
    __syncthreads();
    // The chunk's rows, an invalid one zero-filled (never read): K, then V.
    for (int kv = 0; kv < 2; ++kv) {
      const float* cache = kv ? vc : kc;
      float* stage = kv ? vs : ks;
      for (int64_t k = threadIdx.x; k < n * pieces; k += blockDim.x) {
        const int row = rows[k / pieces];
        const int64_t at = (static_cast<int64_t>(row < 0 ? 0 : row) * nkv + g) * hd + k % pieces * 4;
        cp_async_16_or_zero(stage + k / pieces * hd + k % pieces * 4, cache + at, row >= 0);
      }
      cp_async_commit();
    }
    cp_async_wait<1>();  // this thread's K pieces; the barrier makes them everyone's
    __syncthreads();
    // Scores: a warp per position, lanes over the key row.
    for (int64_t j = warp; j < n; j += n_warps) {
      float acc[kAttendMaxGroup] = {};
      const bool valid = rows[j] >= 0;
      if (valid) {
        const float* kr = ks + j * hd;
#pragma unroll 8
        for (int64_t d = lane; d < hd; d += 32) {
          const float k = kr[d];
#pragma unroll
          for (int h = 0; h < kAttendMaxGroup; ++h)
            if (h < G) acc[h] = fmaf(qs[h * hd + d], k, acc[h]);
        }
      }
#pragma unroll
      for (int h = 0; h < kAttendMaxGroup; ++h) {
        if (h >= G) break;
        const float dot = warp_sum(acc[h]);
        if (lane == 0) p[h * kAttendChunk + j] = valid ? dot * scale : -INFINITY;
      }
    }
    __syncthreads();
    // Running softmax: a warp per query head.
    for (int64_t h = warp; h < G; h += n_warps) {
      float m = -INFINITY;
      for (int64_t j = lane; j < n; j += 32) m = fmaxf(m, p[h * kAttendChunk + j]);
      m = fmaxf(warp_max(m), run_m[h]);
      float l = 0;
      for (int64_t j = lane; j < n; j += 32) {
        const float v = p[h * kAttendChunk + j];
        const float e = v == -INFINITY ? 0.0f : expf(v - m);
        p[h * kAttendChunk + j] = e;
        l += e;
      }
      l = warp_sum(l);
      __syncwarp();
      if (lane == 0) {
        const float r = run_m[h] == -INFINITY ? 0.0f : expf(run_m[h] - m);
        rescale[h] = r;
        run_l[h] = run_l[h] * r + l;
        run_m[h] = m;
      }
    }
    cp_async_wait<0>();  // the V pieces
    __syncthreads();
    // Values: a thread per dimension, each V element applied to every head of the group, in
    // position order.
    if (i < hd) {
#pragma unroll
      for (int h = 0; h < kAttendMaxGroup; ++h)
        if (h < G) o[h] *= rescale[h];
      for (int64_t j = 0; j < n; ++j) {
        if (rows[j] < 0) continue;
        const float v = vs[j * hd + i];
#pragma unroll
        for (int h = 0; h < kAttendMaxGroup; ++h)
          if (h < G) o[h] = fmaf(p[h * kAttendChunk + j], v, o[h]);
      }
    }
    __syncthreads();  // rows, the stages, p and rescale are rewritten by the next chunk
  }
  for (int64_t h = threadIdx.x; h < G; h += blockDim.x) part_m[base + h] = run_m[h], part_l[base + h] = run_l[h];
  if (i < hd)
#pragma unroll
    for (int h = 0; h < kAttendMaxGroup; ++h)
      if (h < G) part_o[(base + h) * hd + i] = o[h];
}

// Attention on the tensor cores, a block of 8 warps per (token, kv head, split). The group's
// G <= 16 query heads are the 16 rows of m16n8k8 TF32 tiles on split operands (FP32-accurate, as
// the GEMM tile of cuda_gemm.cuh). The selection is walked in chunks of 32 positions whose K and V
// rows are gathered into shared memory by cp.async, software-pipelined: the next chunk's K rows
// are requested as soon as this chunk's scores are computed, its V rows once this chunk's values
// are added, so each copy overlaps the work between. Warp w owns dimensions [w·hd/8, (w+1)·hd/8):
// it keeps the group's Q fragments of them in registers for the whole selection, scores every
// position of a chunk over them (four independent n8 tiles), and accumulates those output
// dimensions; the running softmax (the chunk kernel's) sums the 8 warps' partial scores and splits
// P once for every warp. An mma's k slots t and t + 4 take adjacent dimensions (scores) or
// positions (values), 2t and 2t + 1 of its eight, so that a lane reads its K pair with one 8-byte
// load and its P fragment with one 16-byte load (the sum over k is the same in any slot order). Prefill
// has one split, and each output is written finished; decode splits the selection a chunk a
// block, so that its few (token, kv head) rows still fill the GPU, and writes partials.
constexpr int kMmaChunk = 32;  // positions per chunk
constexpr int kMmaWarps = 8;
constexpr int kMmaRows = 16;               // query heads of a group, padded with zero rows
constexpr int64_t kMmaMinTokens = 64;      // fewer (decode) split each selection over blocks
// Scores and P are kept as mma A-fragment quads: for rows g, g + 8 and positions 8·b + 2t, 8·b + 2t + 1,
// the four values (g, 2t), (g + 8, 2t), (g, 2t + 1), (g + 8, 2t + 1) at b·kMmaQuadPitch + 16·g + 4·t,
// so that lane (g, t) of P·V reads its A fragment with one 16-byte load in register order. The
// 16 extra floats a block of 8 positions put blocks b and b + 1 on different banks: the softmax's
// 16-byte accesses (8 lanes of one g) are then conflict-free too.
constexpr int kMmaQuadPitch = 8 * kMmaRows + 16;
constexpr int kMmaScoreWords = kMmaChunk / 8 * kMmaQuadPitch;  // a warp's partial scores of a chunk

// Shared memory of qsa_attend_mma_kernel in 4-byte words: K rows (pitch hd + 8: the 8-byte
// fragment loads of rows g, columns 2t are conflict-free), V rows (pitch hd + 4: those of rows 2t,
// columns g are), the warps' partial scores (the first two warps' then hold P's TF32 parts), the
// running max / sum / rescale of each row, and two chunks' cache rows.
size_t mma_attend_words(int64_t hd) {
  return kMmaChunk * (hd + 8) + kMmaChunk * (hd + 4) + kMmaWarps * kMmaScoreWords + 3 * kMmaRows +
         2 * kMmaChunk;
}

// Where the splits of a selection leave their partials (the chunk kernel's layout, merged by
// qsa_attend_combine_kernel); with one split (m null) each output is written finished.
struct AttendParts {
  int64_t n_splits = 1;
  float *m = nullptr, *l = nullptr, *o = nullptr;
};

// Rows t < dense_rows attend to positions 0 .. dense_n0 + t and read no sel. early_kv (one dense
// row, whose position dense_n0 alone the previous kernels wrote into the caches): a block requests
// its first chunk's K and V rows of the earlier positions before the wait, so that they arrive
// while the kernel before it ends, and the new position's after it.
template <int kHd>
__global__ void __launch_bounds__(kMmaWarps * 32, 2)
    qsa_attend_mma_kernel(const float* __restrict__ q, const float* __restrict__ gate, const float* __restrict__ kc,
                          const float* __restrict__ vc, const int32_t* __restrict__ sel,
                          const int32_t* __restrict__ n_sel, int64_t dense_n0, int64_t dense_rows, int64_t nh,
                          int64_t nkv, int64_t cap, int64_t max_sel, float scale, bool early_kv, AttendParts parts,
                          float* __restrict__ out) {
  extern __shared__ __align__(16) float attend_shared[];
  const int64_t t = blockIdx.x, g = blockIdx.y, G = nh / nkv, z = blockIdx.z, stride = parts.n_splits * kMmaChunk;
  constexpr int kp = kHd + 8, vp = kHd + 4;  // row pitches of K and V
  constexpr int kPieces = kHd / 4;           // 16-byte pieces of a row
  float* ks = attend_shared;         // [32][kp]
  float* vs = ks + kMmaChunk * kp;   // [32][vp]
  float* ps = vs + kMmaChunk * vp;   // [8 warps][kMmaScoreWords]; then P's hi, lo parts: [2][kMmaScoreWords]
  float* run_m = ps + kMmaWarps * kMmaScoreWords;
  float* run_l = run_m + kMmaRows;
  float* rescale = run_l + kMmaRows;
  int32_t* rows = reinterpret_cast<int32_t*>(rescale + kMmaRows);  // [2 chunks][32], −1: no position
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int gq = lane / 4, tq = lane % 4;  // mma fragment coordinates
  const bool dense = t < dense_rows;
  int64_t n_total = dense_n0 + t + 1;  // a dense row's; a selection's count is read after the wait
  const int32_t* sel_t = dense ? nullptr : sel + t * max_sel;
  auto set_rows = [&](int64_t j0, int32_t* r) {
    if (tid < kMmaChunk) {
      const int64_t j = j0 + tid;
      const int32_t row = j >= n_total ? -1 : dense ? static_cast<int32_t>(j) : sel_t[j];
      r[tid] = row >= 0 && row < cap ? row : -1;
    }
  };
  // Zeros for no position; without branches, so that a thread's reads of r[] are all issued before
  // its copies wait on them. Where a row's pieces divide the block, a thread copies one piece
  // column of every (threads / pieces)-th row: its copies' sources then differ by one 32-bit wide multiply
  // and their destinations by constants (64-bit index arithmetic for each piece was two fifths
  // of the kernel's instructions).
  constexpr int kThreads = kMmaWarps * 32;
  static_assert(kMmaChunk * kPieces % kThreads == 0);
  const uint32_t row_bytes = static_cast<uint32_t>(nkv * kHd * sizeof(float));  // every kv head of a position
  auto piece = [&](int n) -> int2 {  // the row and column of this thread's n-th piece
    if constexpr (kThreads % kPieces == 0) return {tid / kPieces + n * (kThreads / kPieces), tid % kPieces};
    const int i = tid + n * kThreads;
    return {i / kPieces, i % kPieces};
  };
  // Rows for which keep(row) is false are not requested (early_kv's new position, requested after
  // the wait). The chunk loop's requests keep every row by a constant, so they take no test: a
  // run-time test there put a branch around each copy and recomputed its address (H100: pp8192
  // 0.7–1.2% slower).
  auto request_kept = [&](const float* cache, const int32_t* r, float* dst, int pitch, auto keep) {
#pragma unroll
    for (int n = 0; n < kMmaChunk * kPieces / kThreads; ++n) {
      const int2 at = piece(n);
      const int32_t row = r[at.x];
      const char* piece_of_row0 = reinterpret_cast<const char*>(cache + g * kHd + 4 * at.y);
      const uint64_t row_at = static_cast<uint64_t>(static_cast<uint32_t>(max(row, 0))) * row_bytes;
      if (keep(row)) cp_async_16_or_zero(dst + at.x * pitch + 4 * at.y, piece_of_row0 + row_at, row >= 0);
    }
    cp_async_commit();
  };
  auto request = [&](const float* cache, const int32_t* r, float* dst, int pitch) {
    request_kept(cache, r, dst, pitch, [](int32_t) { return true; });
  };
  const bool early = early_kv && dense;
  const int32_t new_row = static_cast<int32_t>(dense_n0 + t);
  if (early) {
    set_rows(z * kMmaChunk, rows);
    __syncthreads();
    if (z * kMmaChunk < n_total) {
      const auto not_new = [new_row](int32_t row) { return row != new_row; };
      request_kept(kc, rows, ks, kp, not_new);
      request_kept(vc, rows, vs, vp, not_new);
    }
  }
  grid_dependency_wait();
  if (!dense) n_total = n_sel[t];

  // This warp's dimensions, 8 a step: the A fragments of Q (rows gq and gq + 8, zero past G), k
  // slots tq and tq + 4 on dimensions 2·tq and 2·tq + 1 of the step.
  constexpr int kDims = kHd / kMmaWarps, kSteps = kDims / 8;
  SplitTf32 qa[kSteps][4];
  const float* q_t = q + (t * nh + g * G) * kHd;
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int k = warp * kDims + 8 * s + 2 * tq;
    qa[s][0] = split_tf32(gq < G ? q_t[gq * kHd + k] : 0.0f);
    qa[s][1] = split_tf32(gq + 8 < G ? q_t[(gq + 8) * kHd + k] : 0.0f);
    qa[s][2] = split_tf32(gq < G ? q_t[gq * kHd + k + 1] : 0.0f);
    qa[s][3] = split_tf32(gq + 8 < G ? q_t[(gq + 8) * kHd + k + 1] : 0.0f);
  }
  if (tid < kMmaRows) run_m[tid] = -INFINITY, run_l[tid] = 0.0f;
  // Split z takes chunks z, z + n_splits, ...
  if (early) {
    // The new position's K and V pieces, a thread each, as a third group (the first chunk then
    // waits for all three).
    const int64_t at = new_row - z * kMmaChunk;
    if (at >= 0 && at < kMmaChunk && tid < 2 * kPieces) {
      const bool value = tid >= kPieces;
      const int col = tid % kPieces;
      float* dst = value ? vs + at * vp : ks + at * kp;
      const float* src = (value ? vc : kc) + (static_cast<int64_t>(new_row) * nkv + g) * kHd + 4 * col;
      cp_async_16_or_zero(dst + 4 * col, src, new_row < cap);
    }
    cp_async_commit();
  } else {
    set_rows(z * kMmaChunk, rows);
    __syncthreads();
    if (z * kMmaChunk < n_total) {
      request(kc, rows, ks, kp);
      request(vc, rows, vs, vp);
    }
  }
  float o[kSteps][4] = {};  // output dimensions warp·kDims + 8·ni + 2·tq + e % 2 of row gq + 8·(e / 2)
  for (int64_t j0 = z * kMmaChunk, c = 0; j0 < n_total; j0 += stride, ++c) {
    const int32_t* cur = rows + (c % 2) * kMmaChunk;
    int32_t* next = rows + ((c + 1) % 2) * kMmaChunk;
    const bool more = j0 + stride < n_total;
    if (early && c == 0)
      cp_async_wait<0>();  // the first chunk's K and V rows, the new position's among them
    else
      cp_async_wait<1>();  // this chunk's K rows have landed (its V rows may be in flight)
    __syncthreads();
    // Partial scores of the chunk's 32 positions over this warp's dimensions, an independent chain
    // of mmas for each 8 positions. Accumulator e of tile ni: row gq + 8·(e / 2), position 8·ni +
    // 2·tq + e % 2.
    float part[4][4] = {};
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
#pragma unroll
      for (int ni = 0; ni < 4; ++ni) {
        const float2 kv = *reinterpret_cast<const float2*>(ks + (8 * ni + gq) * kp + warp * kDims + 8 * s + 2 * tq);
        const SplitTf32 b[2] = {split_tf32(kv.x), split_tf32(kv.y)};
        mma_split_tf32(part[ni], qa[s], b);
      }
    }
    const int quad = 16 * gq + 4 * tq;  // this lane's fragment quad in a block of 8 positions
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
      *reinterpret_cast<float4*>(ps + warp * kMmaScoreWords + ni * kMmaQuadPitch + quad) =
          make_float4(part[ni][0], part[ni][2], part[ni][1], part[ni][3]);
    if (more) set_rows(j0 + stride, next);
    __syncthreads();  // K is read, the scores and the next rows are written
    if (more) request(kc, next, ks, kp);
    static_assert(kMmaChunk == 32, "the softmax's groups of 16 lanes hold a chunk's positions");
    if (tid < kMmaRows / 2 * kMmaChunk / 2) {
      // Running softmax: a thread a quad (rows g, g + 8; positions p, p + 1), 16 lanes rows g and
      // g + 8 in position order; P's parts go to the first two warps' scores.
      const int g8 = tid / 16, block = tid / 4 % 4, t4 = tid % 4, at = block * kMmaQuadPitch + 16 * g8 + 4 * t4;
      float4 sum = *reinterpret_cast<const float4*>(ps + at);
#pragma unroll
      for (int w = 1; w < kMmaWarps; ++w) {
        const float4 part = *reinterpret_cast<const float4*>(ps + w * kMmaScoreWords + at);
        sum.x += part.x, sum.y += part.y, sum.z += part.z, sum.w += part.w;
      }
      const int2 live = *reinterpret_cast<const int2*>(cur + 8 * block + 2 * t4);
      const float v[4] = {live.x >= 0 ? sum.x * scale : -INFINITY, live.x >= 0 ? sum.y * scale : -INFINITY,
                          live.y >= 0 ? sum.z * scale : -INFINITY, live.y >= 0 ? sum.w * scale : -INFINITY};
      float m_old[2], m_new[2], l[2];  // rows g8 and g8 + 8
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(v[h], v[h + 2]);
#pragma unroll
        for (int o16 = 8; o16 > 0; o16 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o16));
        m_old[h] = run_m[g8 + 8 * h], m_new[h] = fmaxf(m_old[h], mx);
      }
      float e[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) e[i] = v[i] == -INFINITY ? 0.0f : expf(v[i] - m_new[i % 2]);
      SplitTf32 p[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = split_tf32(e[i]);
      *reinterpret_cast<uint4*>(ps + at) = make_uint4(p[0].hi, p[1].hi, p[2].hi, p[3].hi);
      *reinterpret_cast<uint4*>(ps + kMmaScoreWords + at) = make_uint4(p[0].lo, p[1].lo, p[2].lo, p[3].lo);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l[h] = e[h] + e[h + 2];
#pragma unroll
        for (int o16 = 8; o16 > 0; o16 >>= 1) l[h] += __shfl_xor_sync(0xffffffffu, l[h], o16);
      }
      if (tid % 16 == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = g8 + 8 * h;
          const float r = m_old[h] == -INFINITY ? 0.0f : expf(m_old[h] - m_new[h]);
          rescale[row] = r;
          run_l[row] = run_l[row] * r + l[h];
          run_m[row] = m_new[h];
        }
      }
    }
    if (more)
      cp_async_wait<1>();  // this chunk's V rows have landed (the next chunk's K rows may be in flight)
    else
      cp_async_wait<0>();
    __syncthreads();
    // Values: o = o·rescale + P·V over this warp's dimensions, a chain for each 8 of them; k slots
    // tq and tq + 4 on positions kk + 2·tq and kk + 2·tq + 1.
    const float r_lo = rescale[gq], r_hi = rescale[gq + 8];
    float pv[kSteps][4] = {};
#pragma unroll
    for (int kk = 0; kk < kMmaChunk; kk += 8) {
      const float* p_hi = ps + kk / 8 * kMmaQuadPitch + quad;
      const uint4 hi = *reinterpret_cast<const uint4*>(p_hi), lo = *reinterpret_cast<const uint4*>(p_hi + kMmaScoreWords);
      const SplitTf32 a[4] = {{hi.x, lo.x}, {hi.y, lo.y}, {hi.z, lo.z}, {hi.w, lo.w}};
      const float* v0 = vs + (kk + 2 * tq) * vp + warp * kDims + gq;
#pragma unroll
      for (int ni = 0; ni < kSteps; ++ni) {
        const SplitTf32 b[2] = {split_tf32(v0[ni * 8]), split_tf32(v0[vp + ni * 8])};
        mma_split_tf32(pv[ni], a, b);
      }
    }
#pragma unroll
    for (int ni = 0; ni < kSteps; ++ni) {
      o[ni][0] = fmaf(o[ni][0], r_lo, pv[ni][0]);
      o[ni][1] = fmaf(o[ni][1], r_lo, pv[ni][1]);
      o[ni][2] = fmaf(o[ni][2], r_hi, pv[ni][2]);
      o[ni][3] = fmaf(o[ni][3], r_hi, pv[ni][3]);
    }
    __syncthreads();  // V and P are read
    if (more) request(vc, next, vs, vp);
  }
  __syncthreads();  // run_m and run_l are final
  const int64_t base = ((t * nkv + g) * parts.n_splits + z) * G;  // this split's partials
  if (parts.m && tid < G) parts.m[base + tid] = run_m[tid], parts.l[base + tid] = run_l[tid];
#pragma unroll
  for (int ni = 0; ni < kSteps; ++ni) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = gq + 8 * (e / 2);
      if (row >= G) continue;
      const int dim = warp * kDims + ni * 8 + 2 * tq + e % 2;
      if (parts.m) {
        parts.o[(base + row) * kHd + dim] = o[ni][e];
        continue;
      }
      const float l = run_l[row];
      const int64_t at = (t * nh + g * G + row) * kHd + dim;
      out[at] = l > 0 ? static_cast<float>(static_cast<double>(o[ni][e] / l) * sigmoid_d(gate[at])) : 0.0f;
    }
  }
}

// Dense prefill attention (QsaAttendArgs::dense_rows: rows whose selection is their whole causal
// prefix), a block of 8 warps per (tile of consecutive tokens, kv head). The (token, query head)
// rows of the tile are packed without per-token padding, kFlashRows of them, 16 a warp: the M rows
// of split-TF32 m16n8k8 tiles as in qsa_attend_mma_kernel, but each K/V chunk is gathered once for
// every token of the tile instead of once per token. The block walks positions 0 .. the tile's
// last one in chunks of 32 (K and V each single-buffered and software-pipelined as in
// qsa_attend_mma_kernel) and masks causally per row. A warp owns its 16 rows whole: scores,
// running softmax and the output rows stay in its registers (P is passed to P·V in the
// accumulator layout, no shared-memory round trip).
constexpr int kFlashWarps = 8;
constexpr int kFlashRows = 16 * kFlashWarps;  // Q rows at hd 256 fill 133 KB of shared memory
constexpr int kFlashChunk = 32;               // positions per chunk
// Fewer tokens make too few tiles to fill the GPU: the per-token kernel, T·nkv blocks, is then
// estimated faster (G = 12, nkv = 2: even near 180 tokens; to be measured).
constexpr int64_t kDenseMinTokens = 192;

// Shared memory of qsa_attend_dense_kernel in 4-byte words: the tile's Q rows, a chunk of K rows and
// one of V rows, all at pitch hd + 4 (≡ 4 mod 32: every fragment load below is conflict-free).
size_t dense_attend_words(int64_t hd) { return (kFlashRows + 2 * kFlashChunk) * (hd + 4); }

template <int kHd>
__global__ void __launch_bounds__(kFlashWarps * 32, 1)
    qsa_attend_dense_kernel(const float* __restrict__ q, const float* __restrict__ gate, const float* __restrict__ kc,
                            const float* __restrict__ vc, int64_t T, int64_t nh, int64_t nkv, int64_t n0, float scale,
                            float* __restrict__ out) {
  grid_dependency_wait();
  extern __shared__ __align__(16) float dense_shared[];
  constexpr int kPitch = kHd + 4, kPieces = kHd / 4;  // 16-byte pieces of a row
  const int G = static_cast<int>(nh / nkv), tokens = kFlashRows / G;
  // The last tiles walk the most positions: they start first.
  const int64_t t0 = (gridDim.x - 1 - blockIdx.x) * static_cast<int64_t>(tokens), g = blockIdx.y;
  // The tile's rows that are written (those past them are zeros) and its last position.
  const int n_rows = static_cast<int>(min(static_cast<int64_t>(tokens), T - t0)) * G;
  const int64_t last = n0 + t0 + n_rows / G - 1;
  float* qs = dense_shared;              // [kFlashRows][kPitch]
  float* ks = qs + kFlashRows * kPitch;  // [kFlashChunk][kPitch]
  float* vs = ks + kFlashChunk * kPitch;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int gq = lane / 4, tq = lane % 4;  // mma fragment coordinates
  auto request = [&](const float* cache, int64_t j0, float* dst) {  // zeros past the last position
    for (int i = tid; i < kFlashChunk * kPieces; i += blockDim.x) {
      const int j = i / kPieces, c = i % kPieces;
      float* d = dst + j * kPitch + 4 * c;
      if (j0 + j <= last)
        cp_async_16(d, cache + ((j0 + j) * nkv + g) * kHd + 4 * c);
      else
        *reinterpret_cast<float4*>(d) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    cp_async_commit();
  };
  request(kc, 0, ks);
  request(vc, 0, vs);
  for (int i = tid; i < kFlashRows * kPieces; i += blockDim.x) {
    const int r = i / kPieces, c = i % kPieces;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < n_rows) v = *reinterpret_cast<const float4*>(q + ((t0 + r / G) * nh + g * G + r % G) * kHd + 4 * c);
    *reinterpret_cast<float4*>(qs + r * kPitch + 4 * c) = v;
  }
  // This thread's rows 16·warp + gq + 8·h (h = 0, 1): their positions, running max and sum.
  const int row0 = 16 * warp + gq;
  const int64_t pos[2] = {n0 + t0 + row0 / G, n0 + t0 + (row0 + 8) / G};
  const bool active = 16 * warp < n_rows;  // else the warp's rows are all padding
  float run_m[2] = {-INFINITY, -INFINITY}, run_l[2] = {0.0f, 0.0f};
  float o[kHd / 8][4] = {};  // output dimensions 8·ni + 2·tq + e % 2 of row gq + 8·(e / 2)
  for (int64_t j0 = 0; j0 <= last; j0 += kFlashChunk) {
    const bool more = j0 + kFlashChunk <= last;
    cp_async_wait<1>();  // this chunk's K rows have landed (its V rows may be in flight)
    __syncthreads();
    // Scores of positions j0 + 8·ni + 2·tq + e % 2 (accumulator e, row gq + 8·(e / 2)), each 32
    // dimensions summed on their own (the tensor cores may truncate when they accumulate).
    float s[4][4] = {};
    if (active) {
#pragma unroll 1
      for (int k0 = 0; k0 < kHd; k0 += 32) {
        float part[4][4] = {};
#pragma unroll
        for (int kk = 0; kk < 32; kk += 8) {
          const float* q0 = qs + row0 * kPitch + k0 + kk + tq;
          const SplitTf32 a[4] = {split_tf32(q0[0]), split_tf32(q0[8 * kPitch]), split_tf32(q0[4]),
                                  split_tf32(q0[8 * kPitch + 4])};
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            const float* kr = ks + (8 * ni + gq) * kPitch + k0 + kk + tq;
            const SplitTf32 b[2] = {split_tf32(kr[0]), split_tf32(kr[4])};
            mma_split_tf32(part[ni], a, b);
          }
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[ni][e] += part[ni][e];
      }
    }
    __syncthreads();  // K is read
    if (more) request(kc, j0 + kFlashChunk, ks);
    // Running softmax of each row over its quad (the 4 lanes of one gq), positions past the row's
    // own masked.
    float rescale[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float& v = s[ni][2 * h + i];
          v = j0 + 8 * ni + 2 * tq + i <= pos[h] ? v * scale : -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(run_m[h], mx);  // finite: position 0 is in every row's first chunk
      float l = 0.0f;
#pragma unroll
      for (int ni = 0; ni < 4; ++ni)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float& v = s[ni][2 * h + i];
          v = v == -INFINITY ? 0.0f : expf(v - m_new);
          l += v;
        }
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      rescale[h] = run_m[h] == -INFINITY ? 0.0f : expf(run_m[h] - m_new);
      run_l[h] = run_l[h] * rescale[h] + l;
      run_m[h] = m_new;
    }
    if (more)
      cp_async_wait<1>();  // this chunk's V rows have landed (the next chunk's K rows may be in flight)
    else
      cp_async_wait<0>();
    __syncthreads();
    if (active) {
      // o = o·rescale + P·V. Within each 8 positions, position 2·tq + i is taken as k index tq + 4·i:
      // then the scores' accumulators are P's A fragments as they lie, and the V rows read match.
      SplitTf32 p[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        p[kk][0] = split_tf32(s[kk][0]), p[kk][1] = split_tf32(s[kk][2]);
        p[kk][2] = split_tf32(s[kk][1]), p[kk][3] = split_tf32(s[kk][3]);
      }
#pragma unroll
      for (int n_base = 0; n_base < kHd / 8; n_base += 4) {  // 4 dimension tiles at a time: independent mmas
        float part[4][4] = {};
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const float* v0 = vs + (8 * kk + 2 * tq) * kPitch + 8 * n_base + gq;
#pragma unroll
          for (int ni = 0; ni < 4; ++ni) {
            const SplitTf32 b[2] = {split_tf32(v0[8 * ni]), split_tf32(v0[kPitch + 8 * ni])};
            mma_split_tf32(part[ni], p[kk], b);
          }
        }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[n_base + ni][e] = fmaf(o[n_base + ni][e], rescale[e / 2], part[ni][e]);
      }
    }
    __syncthreads();  // V is read
    if (more) request(vc, j0 + kFlashChunk, vs);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    if (r >= n_rows) continue;
    const int64_t base = ((t0 + r / G) * nh + g * G + r % G) * kHd;
#pragma unroll
    for (int ni = 0; ni < kHd / 8; ++ni)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int64_t at = base + 8 * ni + 2 * tq + i;
        out[at] = static_cast<float>(static_cast<double>(o[ni][2 * h + i] / run_l[h]) * sigmoid_d(gate[at]));
      }
  }
}

// Rows row0 .. of a on the tensor cores, a token a block, or parts.n_splits blocks writing parts.
template <int kHd>
void launch_mma_attend(cudaStream_t stream, const QsaAttendArgs& a, int64_t row0, AttendParts parts = {}) {
  const int64_t nh = a.q->ne(1), T = a.q->ne(2) - row0, nkv = a.k_cache->ne(1);
  const bool early_kv = row0 == 0 && T == 1 && a.dense_rows == 1;
  const int64_t max_sel = a.sel ? a.sel->ne(0) : 0, row = kHd * nh;
  const size_t smem = mma_attend_words(kHd) * sizeof(float);
  [[maybe_unused]] static const bool shared_ready = [smem] {  // once per head width
    check(cudaFuncSetAttribute(qsa_attend_mma_kernel<kHd>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "qsa_attend_mma_kernel shared memory");
    return true;
  }();
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(nkv), static_cast<unsigned>(parts.n_splits));
  launch(stream, "qsa_attend_mma_kernel", qsa_attend_mma_kernel<kHd>, grid, kMmaWarps * 32, smem,
         a.q->f32() + row0 * row, a.gate->f32() + row0 * row, a.k_cache->f32(), a.v_cache->f32(),
         a.sel ? a.sel->i32() + row0 * max_sel : nullptr, a.n_sel ? a.n_sel->i32() + row0 : nullptr,
         a.dense_n0 + row0, std::max<int64_t>(0, a.dense_rows - row0), nh, nkv, a.k_cache->ne(2), max_sel, a.scale,
         early_kv, parts, a.out->f32() + row0 * row);
}

// The first T rows of a (all dense).
template <int kHd>
void launch_dense_attend(cudaStream_t stream, const QsaAttendArgs& a, int64_t T) {
  const int64_t nh = a.q->ne(1), nkv = a.k_cache->ne(1), tokens = kFlashRows / (nh / nkv);
  const size_t smem = dense_attend_words(kHd) * sizeof(float);
  [[maybe_unused]] static const bool shared_ready = [smem] {  // once per head width
    check(cudaFuncSetAttribute(qsa_attend_dense_kernel<kHd>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(smem)),
          "qsa_attend_dense_kernel shared memory");
    return true;
  }();
  const dim3 grid(static_cast<unsigned>((T + tokens - 1) / tokens), static_cast<unsigned>(nkv));
  launch(stream, "qsa_attend_dense_kernel", qsa_attend_dense_kernel<kHd>, grid, kFlashWarps * 32, smem, a.q->f32(),
         a.gate->f32(), a.k_cache->f32(), a.v_cache->f32(), T, nh, nkv, a.dense_n0, a.scale, a.out->f32());
}

// out = (Σ_c e^{m_c − M}·o_c) / (Σ_c e^{m_c − M}·l_c) ⊙ sigmoid(gate), M the largest m_c; one block
// per (token, query head, 32 dimensions of the head). Its 8 warps split the chunks (warp w takes
// chunks w, w + 8, ...) and each lane a dimension; a warp's first kCombineLoads o_c are loaded
// before the weights e^{m_c − M} are formed (a chunk without positions may hold no o_c: loaded,
// never added), so the block waits one memory trip for m, l and o together. The warps' sums meet
// in shared memory, added in warp order. With x8 set (hd a multiple of 32), the first warp also
// writes its 32 values' Q8_0 chunk for the output projection. (A block per head, a thread per
// dimension walking every chunk, took 11 µs a call at 32K context on an H200.)
constexpr int kCombineWarps = 8, kCombineLoads = 8;
__global__ void __launch_bounds__(32 * kCombineWarps)
    qsa_attend_combine_kernel(const float* gate, const float* part_m, const float* part_l, const float* part_o,
                              int64_t hd, int64_t nh, int64_t nkv, int64_t n_chunks, float* out, QuantizeTarget x8,
                              const uint8_t* fetch, uint64_t fetch_bytes) {
  extern __shared__ float w[];  // [n_chunks]
  // The next op's weights (QsaAttendArgs::next, fetch_bytes at fetch), asked of L2 by the whole grid
  // before the wait, while attention runs. H100, one token, paired in three rounds: decode 263.5 /
  // 262.7 / 262.3 -> 264.2 / 263.8 / 264.4 tok/s at depth 0, 264.1 / 264.0 / 262.4 -> 264.5 / 264.7
  // / 264.7 at 1K. The trace puts the gain in this kernel (5.14 -> 3.78 µs of the chain a call), not
  // in the output projection (6.6 µs either way); likely the product's blocks, which ask L2 for
  // their rows as they start beside this kernel's end, no longer load memory while it ends. The
  // same fetch by the GDN scan for its output projection gained nothing.
  if (fetch) {
    const unsigned block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    prefetch_l2(fetch, fetch_bytes, block * blockDim.x + threadIdx.x, gridDim.x * gridDim.y * gridDim.z * blockDim.x);
  }
  __shared__ float warp_sums[kCombineWarps][32];
  const int64_t t = blockIdx.x, h = blockIdx.y, G = nh / nkv, g = h / G, hg = h % G;
  const int64_t first = (t * nkv + g) * n_chunks * G + hg;  // chunk c at first + c·G
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t dim = blockIdx.z * 32 + lane;
  const bool live = dim < hd;
  const int64_t at = (t * nh + h) * hd + dim;
  // The gate is an input of the attend op, and this kernel follows the op's chunk kernel: it was
  // written before that kernel, so its sigmoid is ready before the wait.
  const double gate_sigmoid = warp == 0 && live ? sigmoid_d(gate[at]) : 0.0;
  grid_dependency_wait();
  float v[kCombineLoads];
#pragma unroll
  for (int u = 0; u < kCombineLoads; ++u) {
    const int64_t c = warp + u * kCombineWarps;
    v[u] = live && c < n_chunks ? part_o[(first + c * G) * hd + dim] : 0.0f;
  }
  // A thread's first chunk's l is loaded with its m, before the maximum's barriers (decode's splits:
  // at most a chunk a thread).
  const int64_t own = threadIdx.x;
  const float own_m = own < n_chunks ? part_m[first + own * G] : -INFINITY;
  const float own_l = own < n_chunks ? part_l[first + own * G] : 0.0f;
  float M = own_m;
  for (int64_t c = own + blockDim.x; c < n_chunks; c += blockDim.x) M = fmaxf(M, part_m[first + c * G]);
  M = block_max(M);
  float L = 0;
  if (own < n_chunks) {
    w[own] = own_m != -INFINITY ? expf(own_m - M) : 0.0f;
    L = fmaf(w[own], own_l, L);
  }
  for (int64_t c = own + blockDim.x; c < n_chunks; c += blockDim.x) {
    const float m = part_m[first + c * G];
    w[c] = m != -INFINITY ? expf(m - M) : 0.0f;
    L = fmaf(w[c], part_l[first + c * G], L);
  }
  L = block_sum(L);  // its barriers also publish w
  float o = 0;
#pragma unroll
  for (int u = 0; u < kCombineLoads; ++u) {
    const int64_t c = warp + u * kCombineWarps;
    if (c < n_chunks && w[c] != 0.0f) o = fmaf(w[c], v[u], o);
  }
  for (int64_t c = warp + kCombineLoads * kCombineWarps; c < n_chunks; c += kCombineWarps)
    if (w[c] != 0.0f) o = fmaf(w[c], live ? part_o[(first + c * G) * hd + dim] : 0.0f, o);
  warp_sums[warp][lane] = o;
  __syncthreads();
  if (warp != 0 || !live) return;
  o = 0;
#pragma unroll
  for (int i = 0; i < kCombineWarps; ++i) o += warp_sums[i][lane];
  const float y = L > 0 ? static_cast<float>(static_cast<double>(o / L) * gate_sigmoid) : 0.0f;
  out[at] = y;
  if (x8.codes) quantize_q8_0_value(y, at / 32, x8.codes, x8.scales);
}

}  // namespace

void CudaBackend::split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) {
  OpScope scope(profiler_, "split_q_gate", qg.ne(2), stream_);
  check_split_q_gate(qg, q, gate);
  int64_t hd = qg.ne(0) / 2, nh = qg.ne(1), T = qg.ne(2);
  int64_t n = hd * nh * T;
  if (n == 0) return;
  launch(stream_, "split_q_gate_kernel", split_q_gate_kernel, blocks_for(n, kThreads), kThreads, 0, qg.f32(), q.f32(), gate.f32(), hd, n);
}

void CudaBackend::qsa_prepare(const QsaPrepareArgs& a) {
  OpScope scope(profiler_, "qsa_prepare", static_cast<int64_t>(a.positions.size()), stream_);
  check_qsa_prepare(a);
  const QsaPrepareShape d{a.q_out->ne(0), a.q_out->ne(1), a.k_out->ne(1), a.iq_out->ne(0), a.iq_out->ne(1), a.n_rot / 2, a.n0, a.eps};
  const int64_t T = a.q_out->ne(2);
  if (T == 0) return;
  std::vector<float> inv = rope_inv_freq(a.n_rot, a.theta);
  const float* freq = cached_upload(std::span<const float>(inv));
  const dim3 grid(static_cast<unsigned>(d.nh + 2 * d.nkv + d.n_idx + 1), static_cast<unsigned>(T));
  launch(stream_, "qsa_prepare_kernel", qsa_prepare_kernel, grid, kThreads, std::max(d.hd, d.di) * sizeof(float), a.qg->f32(), a.k->f32(), a.v->f32(), a.iq->f32(), a.ik->f32(), values(*a.q_norm), values(*a.k_norm), values(*a.iq_norm), token_positions(*this, a.positions), freq, d, a.q_out->f32(), a.gate_out->f32(), a.k_out->f32(), a.iq_out->f32(), a.k_cache->f32(), a.v_cache->f32(), a.ik_cache->f32());
}

void CudaBackend::qsa_pool(const QsaPoolArgs& a) {
  OpScope scope(profiler_, "qsa_pool", -1, stream_);
  check_qsa_pool(a);
  int64_t d = a.raw_keys->ne(0), n = a.block_end - a.block_begin;
  if (n <= 0) return;
  std::vector<float> inv = rope_inv_freq(a.n_rot, a.theta);
  const float* freq = cached_upload(std::span<const float>(inv));
  int threads = static_cast<int>(std::min<int64_t>(256, (d + 31) / 32 * 32));
  launch(stream_, "qsa_pool_kernel", qsa_pool_kernel, static_cast<unsigned>(n), threads, d * sizeof(float), a.raw_keys->f32(), values(*a.k_norm), freq, d, a.ratio, a.block_begin, a.n_rot / 2, a.eps, a.pooled->f32());
}

void CudaBackend::qsa_select(const QsaSelectArgs& a) {
  OpScope scope(profiler_, "qsa_select", static_cast<int64_t>(a.positions.size()), stream_);
  check_qsa_select(a);
  int64_t d = a.iq->ne(0), nh = a.iq->ne(1), T = a.iq->ne(2), max_sel = a.sel->ne(0);
  int64_t nb_max = 0;
  for (int64_t p : a.positions) nb_max = std::max(nb_max, (p + 1) / a.ratio);
  if (T == 0) return;
  const TokenPositions kernel_positions = token_positions(*this, a.positions);
  Tensor scores = scratch_bytes(static_cast<size_t>(std::max<int64_t>(nb_max, 1) * T) * sizeof(double));
  double* scores_d = reinterpret_cast<double*>(scores.f32());
  // Leading rows with at most top_blocks complete blocks keep every one of them, and the choose
  // kernel takes them without their scores: the scores are formed from the first other row on
  // (every row of a prompt of up to (top_blocks + 1)·ratio − 1 tokens is such a row).
  int64_t t0 = 0;
  while (t0 < T && (a.positions[t0] + 1) / a.ratio <= a.top_blocks) ++t0;
  const int64_t n_scored = T - t0;
  const float* iq = a.iq->f32() + t0 * nh * d;
  if (nb_max > 0 && n_scored >= kScoreTile) {
    const dim3 grid(blocks_for(n_scored, kScoreTile), blocks_for(nb_max, kScoreTile));
    launch(stream_, "qsa_score_tiled_kernel", qsa_score_tiled_kernel, grid, 256, 0, iq, a.pooled->f32(), kernel_positions.from(t0), n_scored, d, nh, a.ratio, nb_max, scores_d + t0 * nb_max);
  } else if (nb_max > 0 && n_scored > 0) {
    const dim3 grid(static_cast<unsigned>(n_scored), blocks_for(nb_max, kScoreQuadThreads / kScoreQuad));
    const size_t q_bytes = static_cast<size_t>(nh * d) * sizeof(double);
    if (q_bytes > 48 * 1024) fail("qsa_select: ", nh, " indexer heads of ", d, " values exceed the score kernel's shared memory");
    launch(stream_, "qsa_score_quad_kernel", qsa_score_quad_kernel, grid, kScoreQuadThreads, q_bytes, iq, a.pooled->f32(), kernel_positions.from(t0), d, nh, a.ratio, nb_max, scores_d + t0 * nb_max);
  }
  const size_t key_bytes = nb_max <= kChooseSharedKeys ? static_cast<size_t>(nb_max) * sizeof(uint64_t) : 0;
  [[maybe_unused]] static const bool shared_ready = [] {
    check(cudaFuncSetAttribute(qsa_choose_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kChooseSharedKeys * sizeof(uint64_t))),
          "qsa_choose_kernel shared memory");
    return true;
  }();
  launch(stream_, "qsa_choose_kernel", qsa_choose_kernel, static_cast<unsigned>(T), kChooseThreads, key_bytes, scores_d, kernel_positions, a.ratio, a.top_blocks, nb_max, max_sel, a.sel->i32(), a.n_sel->i32());
}

void CudaBackend::qsa_attend(const QsaAttendArgs& a) {
  OpScope scope(profiler_, "qsa_attend", a.q->ne(2), stream_);
  check_qsa_attend(a);
  int64_t hd = a.q->ne(0), nh = a.q->ne(1), T = a.q->ne(2), nkv = a.k_cache->ne(1), cap = a.k_cache->ne(2);
  int64_t max_sel = a.sel ? a.sel->ne(0) : a.dense_n0 + T;
  if (nh * T == 0) return;
  // Without sel (every row dense) the generic kernel gets the dense rows' selections written out;
  // the others take dense rows as they are.
  Tensor dense_sel, dense_n;
  const auto with_sel = [&] {
    if (a.sel) return a;
    const QsaRows rows(a);
    std::vector<int32_t> sel(static_cast<size_t>(max_sel * T), -1), n_sel(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) {
      n_sel[t] = static_cast<int32_t>(rows.count(t));
      std::copy(rows.positions(t), rows.positions(t) + n_sel[t], sel.begin() + t * max_sel);
    }
    dense_sel = upload_scratch(std::span<const int32_t>(sel)).reshaped({max_sel, T, 1, 1});
    dense_n = upload_scratch(std::span<const int32_t>(n_sel)).reshaped({T, 1, 1, 1});
    QsaAttendArgs b = a;
    b.sel = &dense_sel, b.n_sel = &dense_n;
    return b;
  };
  const int64_t G = nh / nkv;
  // Splits of a selection (up to a split per chunk, about kAttendTargetBlocks blocks in all) write
  // partials that the combine kernel merges into out (gated; in Q8_0 too for the output projection
  // when a thread takes each value of a head). The partials' buffers live to the end of the call:
  // released earlier, the pool could hand one to the combine's Q8_0 output while the combine still
  // reads it.
  Tensor part_m, part_l, part_o;
  const auto split_parts = [&](int64_t n_chunks) {
    const int64_t n_splits = std::clamp<int64_t>(kAttendTargetBlocks / (T * nkv), 1, n_chunks);
    const int64_t n_parts = T * nkv * n_splits * G;
    part_m = scratch_f32(n_parts), part_l = scratch_f32(n_parts), part_o = scratch_f32(n_parts * hd);
    return AttendParts{n_splits, part_m.f32(), part_l.f32(), part_o.f32()};
  };
  const auto combine = [&](const AttendParts& parts) {
    const QuantizeTarget x8 = hd % 32 == 0 ? q8_output(*a.out) : QuantizeTarget{};
    // One token attending to its whole prefix (up to 2,051 positions: no selection), as measured;
    // a selection's chunks (longer contexts) read more memory beside the fetch, not measured.
    const DeviceMatrix* next = a.next && T == 1 && !a.sel ? &matrix(*a.next) : nullptr;
    launch(stream_, "qsa_attend_combine_kernel", qsa_attend_combine_kernel,
           dim3(static_cast<unsigned>(T), static_cast<unsigned>(nh), static_cast<unsigned>((hd + 31) / 32)),
           32 * kCombineWarps, static_cast<size_t>(parts.n_splits) * sizeof(float), a.gate->f32(), parts.m, parts.l, parts.o, hd, nh, nkv,
           parts.n_splits, a.out->f32(), x8, next ? next->data : nullptr,
           next ? static_cast<uint64_t>(next->n_rows) * next->row_bytes : 0);
  };
  // On the tensor cores: prefill's leading dense rows by tiles of tokens, the rest a token a block;
  // decode (fewer tokens) a block per 32-position chunk of a (token, kv head)'s selection (two
  // chunks a block: decode at 32K 4% slower on an H200; the chunk kernel: 5% slower).
  const bool tensor_hd = hd == 64 || hd == 128 || hd == 192 || hd == 256, mma_group = tensor_hd && G <= kMmaRows;
  const bool mma = T >= kMmaMinTokens && mma_group;
  const int64_t rest = T - a.dense_rows;
  const bool dense = tensor_hd && a.dense_rows >= kDenseMinTokens && G <= kFlashRows &&
                     (rest == 0 || (mma && rest >= kMmaMinTokens));
  const bool split_mma = !mma && mma_group;
  if (dense || mma || split_mma) {
    const auto run = [&](auto head_width) {
      constexpr int kHd = decltype(head_width)::value;
      if (split_mma) {
        const AttendParts parts = split_parts((max_sel + kMmaChunk - 1) / kMmaChunk);
        launch_mma_attend<kHd>(stream_, a, 0, parts);
        return combine(parts);
      }
      if (dense) launch_dense_attend<kHd>(stream_, a, a.dense_rows);
      if (!dense || rest > 0) launch_mma_attend<kHd>(stream_, a, dense ? a.dense_rows : 0);
    };
    switch (hd) {
      case 64: return run(std::integral_constant<int, 64>{});
      case 128: return run(std::integral_constant<int, 128>{});
      case 192: return run(std::integral_constant<int, 192>{});
      case 256: return run(std::integral_constant<int, 256>{});
    }
  }
  if (G <= kAttendMaxGroup && hd <= kAttendThreads && hd % 4 == 0) {
    // Splits: a chunk each when there are few (token, kv head) rows, else enough for the GPU;
    // chunks shorter than kAttendChunk (multiples of 8) when even that leaves few blocks.
    const int64_t per_block = (max_sel * T * nkv + kAttendMinBlocks - 1) / kAttendMinBlocks;
    const int64_t chunk = std::clamp<int64_t>((per_block + 7) / 8 * 8, 8, kAttendChunk);
    const int64_t n_chunks = std::max<int64_t>(1, (max_sel + chunk - 1) / chunk);
    const AttendParts parts = split_parts(n_chunks);
    size_t smem = static_cast<size_t>(G * (hd + kAttendChunk + 3) + 2 * chunk * hd) * sizeof(float);
    if (smem > 48 * 1024)
      check(cudaFuncSetAttribute(qsa_attend_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(smem)),
            "qsa_attend_chunk_kernel shared memory");
    dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(nkv), static_cast<unsigned>(parts.n_splits));
    launch(stream_, "qsa_attend_chunk_kernel", qsa_attend_chunk_kernel, grid, kAttendThreads, smem, a.q->f32(), a.k_cache->f32(),
           a.v_cache->f32(), a.sel ? a.sel->i32() : nullptr, a.n_sel ? a.n_sel->i32() : nullptr, a.dense_n0,
           a.dense_rows, hd, nh, nkv, cap, max_sel, chunk, parts.n_splits, a.scale, parts.m, parts.l, parts.o);
    return combine(parts);
  }
  size_t smem = static_cast<size_t>(std::max<int64_t>(max_sel, 1)) * sizeof(float);
  if (smem > 48 * 1024)
    check(cudaFuncSetAttribute(qsa_attend_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "qsa_attend_kernel shared memory");
  dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(nh));
  const QsaAttendArgs b = with_sel();
  launch(stream_, "qsa_attend_kernel", qsa_attend_kernel, grid, 128, smem, b.q->f32(), b.gate->f32(), b.k_cache->f32(), b.v_cache->f32(), b.sel->i32(), b.n_sel->i32(), hd, nh, nkv, cap, max_sel, b.scale, b.out->f32());
}

}  // namespace regolith::cuda
