// out [N, T] = W·x with W in any decodable weight type (cuda_quant.cuh), FP32 accumulation.
// Few tokens (decode): types with a unit loader take the coalesced kernel of cuda_gemv.cuh (R rows
// per block), on int8 activations for the types with an int8 unit (x quantized first, here, as for
// the int8 tile) and on FP32 activations for the others; types without a unit loader take a warp
// per output row, each lane decoding 32-value chunks. More tokens (prefill): 64×64 tensor-core
// tiles, on int8 codes for the types of cuda_gemm_int8.cuh and on split-TF32 floats for the
// others (cuda_gemm.cuh). The backend with exact products reads FP32 activations throughout.
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemm.cuh"
#include "backend/cuda/cuda_gemm_stacked.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_quant.cuh"

namespace regolith::cuda {

// K splits for a product of `tiles` blocks: one while the tiles fill the GPU (blocks_per_sm a
// multiprocessor), else enough for about four waves, each split at least two stages long (pp2048
// on an H200: 1683 tok/s for one wave, 1697 for two, 1714 for four). Returns the chunks per split,
// a multiple of the stage (4 chunks in both tiles).
int64_t split_chunks_for(int64_t tiles, int64_t K, int blocks_per_sm) {
  static const int sms = [] {
    int device = 0, n = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device), "multiprocessor count");
    return n;
  }();
  const int64_t wave = static_cast<int64_t>(sms) * blocks_per_sm;
  constexpr int64_t kStage = gemm_detail::kStepChunks;
  static_assert(kStage == i8_detail::kStageChunks);
  const int64_t n_chunks = (K + 31) / 32;
  const int64_t splits = tiles >= wave ? 1 : std::min((4 * wave + tiles - 1) / tiles, n_chunks / (2 * kStage));
  if (splits <= 1) return n_chunks;
  return ((n_chunks + splits - 1) / splits + kStage - 1) / kStage * kStage;
}

namespace {

constexpr int kMatvecWarps = 4;

// Most threads of a decode product's block (balanced_threads: rows of 2,560 values take 160).
constexpr int kGemvMaxThreads = 256;

template <typename D, int TB>
__global__ void matvec_kernel(const uint8_t* __restrict__ W, uint64_t row_bytes, int64_t K, int64_t N,
                              const float* __restrict__ x, int T, float* __restrict__ out) {
  grid_dependency_wait();
  int64_t n = static_cast<int64_t>(blockIdx.x) * kMatvecWarps + threadIdx.x / 32;
  int lane = threadIdx.x % 32;
  if (n >= N) return;
  const uint8_t* row = W + n * row_bytes;
  int64_t n_chunks = (K + 31) / 32;
  float acc[TB];
#pragma unroll
  for (int t = 0; t < TB; ++t) acc[t] = 0.0f;
  for (int64_t c = lane; c < n_chunks; c += 32) {
    float w[32];
    D::chunk(row, c, K, w);
    int64_t k0 = c * 32;
    int valid = static_cast<int>(K - k0 < 32 ? K - k0 : 32);
#pragma unroll
    for (int t = 0; t < TB; ++t) {
      if (t < T) {
        const float* xr = x + t * K + k0;
        float s = 0.0f;
        if (valid == 32) {
#pragma unroll
          for (int j = 0; j < 32; ++j) s += w[j] * xr[j];
        } else {
          for (int j = 0; j < valid; ++j) s += w[j] * xr[j];
        }
        acc[t] += s;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TB; ++t) {
    float s = warp_sum(acc[t]);
    if (lane == 0 && t < T) out[t * N + n] = s;
  }
}

// Up to this many matrices with the same type and input run as one decode launch.
constexpr int kMaxSegments = 8;

// Matrices of one decode launch: segment s owns blocks [first_block[s], first_block[s + 1]).
struct GemvBatch {
  const uint8_t* data[kMaxSegments];
  uint64_t pitch[kMaxSegments];
  int64_t n_rows[kMaxSegments];
  float* out[kMaxSegments];  // [n_rows, T] each
  unsigned first_block[kMaxSegments + 1];
  int n_segments;
};

// Rows n0 .. n0+R-1 of one segment's matrix times T <= TB tokens of x (FloatX, or Int8X for an
// Int8Unit U); the rows are prefetched into L2 before the wait on the previous kernel.
template <typename U, int R, int TB, typename X>
__global__ void __launch_bounds__(kGemvMaxThreads) gemv_kernel(const GemvBatch b, int64_t K, const X x, int T) {
  int s = 0;
  while (s + 1 < b.n_segments && blockIdx.x >= b.first_block[s + 1]) ++s;
  const int64_t N = b.n_rows[s], n0 = static_cast<int64_t>(blockIdx.x - b.first_block[s]) * R;
  prefetch_l2(b.data[s] + n0 * b.pitch[s], min(static_cast<int64_t>(R), N - n0) * b.pitch[s]);
  grid_dependency_wait();
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = n0 + r < N ? b.data[s] + (n0 + r) * b.pitch[s] : nullptr;
  float acc[R][TB] = {};
  gemv_accumulate<U, R, TB>(rows, K, x, T, threadIdx.x, blockDim.x, acc);
  float sums[R * TB];
  block_reduce_rows(acc, sums);
  if (threadIdx.x != 0) return;
  float* out = b.out[s];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TB; ++t)
      if (n0 + r < N && t < T) out[t * N + n0 + r] = sums[r * TB + t];
}

// Tokens [t0, t0 + T) of every matrix in ms (one type, rows of K): one launch.
template <typename U, int R, int TB, typename X>
void launch_gemv(std::span<const DeviceMatrix* const> ms, std::span<float* const> outs, int64_t K, const X& x,
                 int64_t t0, int T, cudaStream_t stream) {
  GemvBatch b{};
  b.n_segments = static_cast<int>(ms.size());
  for (size_t i = 0; i < ms.size(); ++i) {
    b.data[i] = ms[i]->data;
    b.pitch[i] = ms[i]->row_bytes;
    b.n_rows[i] = ms[i]->n_rows;
    b.out[i] = outs[i] + t0 * ms[i]->n_rows;
    b.first_block[i + 1] = b.first_block[i] + blocks_for(ms[i]->n_rows, R);
  }
  launch(stream, "gemv_kernel", gemv_kernel<U, R, TB, X>, b.first_block[ms.size()], balanced_threads(K / kUnit, kGemvMaxThreads), 0, b, K, x.from_token(t0), T);
}

// Decode products through the unit loaders: one pass for up to 4 tokens, and on int8 activations
// (a token's share of a unit is five registers, not sixteen) for up to 8; passes of 4 beyond. One
// token takes blocks of 4 rows on FP32 activations, 2 on int8 ones: a block reads all of x, and
// int8 codes cost it a quarter of the FP32 bytes, so more blocks of fewer rows pay (H200: decode
// 188.0 → 191.5 tok/s on the benchmark model; with FP32 activations 2 rows were slower).
template <typename U, typename X>
void gemv(std::span<const DeviceMatrix* const> ms, std::span<float* const> outs, int64_t K, const X& x, int64_t T,
          cudaStream_t stream) {
  if (T == 1) return launch_gemv<U, std::is_same_v<X, Int8X> ? 2 : 4, 1>(ms, outs, K, x, 0, 1, stream);
  if (T == 2) return launch_gemv<U, 2, 2>(ms, outs, K, x, 0, 2, stream);
  if (std::is_same_v<X, Int8X> && T > 4 && T <= kMatvecMaxTokens)
    return launch_gemv<U, 2, kMatvecMaxTokens>(ms, outs, K, x, 0, static_cast<int>(T), stream);
  for (int64_t t0 = 0; t0 < T; t0 += 4)
    launch_gemv<U, 2, 4>(ms, outs, K, x, t0, static_cast<int>(std::min<int64_t>(4, T - t0)), stream);
}

// The FP32 tile over stacked matrices: grid (token tiles, row tiles of all, K splits); split z
// covers chunks [z·split_chunks, (z + 1)·split_chunks).
template <typename D>
__global__ void __launch_bounds__(kGemmThreads, kGemmBlocksPerSm)
    gemm_kernel(StackedMatrices m, uint64_t row_bytes, int64_t K, int64_t split_chunks, const float* __restrict__ x,
                int64_t T, bool x_vec4, float* __restrict__ part, int64_t total_rows) {
  grid_dependency_wait();
  const StackedTile tile = stacked_tile(m, T, part, total_rows);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kGemmCols, c_begin = blockIdx.z * split_chunks;
  const int64_t c_end = min(c_begin + split_chunks, (K + 31) / 32);
  gemm_tile<D>(tile.W, row_bytes, K, c_begin, c_end, tile.N, tile.n0, T - t0 < kGemmCols ? T - t0 : kGemmCols, x,
               [=](int tt) { return t0 + tt; }, x_vec4, tile.out, [=](int tt) { return t0 + tt; });
}

// Four values a thread, 8 threads a chunk (quantize_q8_0_quad).
__global__ void quantize_q8_0_kernel(const float* __restrict__ x, int64_t n_chunks, int8_t* __restrict__ codes,
                                     float2* __restrict__ scales) {
  grid_dependency_wait();
  const int64_t q = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // values 4q .. 4q + 3
  if (q >= n_chunks * 8) return;  // whole chunks: their 8 lanes stay together
  const float4 x4 = reinterpret_cast<const float4*>(x)[q];
  const float v[4] = {x4.x, x4.y, x4.z, x4.w};
  quantize_q8_0_quad(v, q / 8, codes, scales);
}

__global__ void quantize_q8_k_kernel(const float* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ codes,
                                     float2* __restrict__ scales) {
  grid_dependency_wait();
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (b < n_blocks) quantize_q8_k_block(x, b, codes, scales);
}

// out[i] = Σ_z part[z·stride + i] (i < n) over the splits in order.
__global__ void sum_splits_kernel(const float* __restrict__ part, int64_t n, int splits, int64_t stride,
                                  float* __restrict__ out) {
  grid_dependency_wait();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float s = part[i];
  for (int z = 1; z < splits; ++z) s += part[z * stride + i];
  out[i] = s;
}

// outs[i] = the sum of a stacked product's split partials, in split order.
void sum_partials(CudaBackend& be, const StackedProduct& p, std::span<const DeviceMatrix* const> ms,
                  std::span<float* const> outs, int64_t T) {
  if (p.splits == 1) return;
  for (size_t i = 0; i < ms.size(); ++i) {
    const int64_t n = T * ms[i]->n_rows;
    launch(be.stream(), "sum_splits_kernel", sum_splits_kernel, blocks_for(n, 256), 256, 0, p.partial(i, T), n, p.splits, T * p.rows, outs[i]);
  }
}

// Products of matrices of one type on FP32 activations: a matvec each for a few tokens, else
// the FP32 tile stacked (at most kMaxStacked matrices).
template <typename D>
void launch_matmul(CudaBackend& be, std::span<const DeviceMatrix* const> ms, std::span<float* const> outs,
                   const float* x, int64_t T, cudaStream_t stream) {
  const int64_t K = ms[0]->K;
  if (T <= kMatvecMaxTokens) {
    for (size_t i = 0; i < ms.size(); ++i) {
      const DeviceMatrix& w = *ms[i];
      float* out = outs[i];
      const int64_t N = w.n_rows;
      dim3 grid(blocks_for(N, kMatvecWarps)), block(32 * kMatvecWarps);
      int t = static_cast<int>(T);
      if (T == 1)
        launch(stream, "matvec_kernel", matvec_kernel<D, 1>, grid, block, 0, w.data, w.row_bytes, K, N, x, t, out);
      else if (T == 2)
        launch(stream, "matvec_kernel", matvec_kernel<D, 2>, grid, block, 0, w.data, w.row_bytes, K, N, x, t, out);
      else if (T <= 4)
        launch(stream, "matvec_kernel", matvec_kernel<D, 4>, grid, block, 0, w.data, w.row_bytes, K, N, x, t, out);
      else
        launch(stream, "matvec_kernel", matvec_kernel<D, 8>, grid, block, 0, w.data, w.row_bytes, K, N, x, t, out);
    }
    return;
  }
  [[maybe_unused]] static const bool shared_ready = allow_max_shared(gemm_kernel<D>, kGemmSharedBytes, "gemm_kernel shared memory");
  const bool x_vec4 = rows_vec4(x, K);
  const StackedProduct p = stacked_product(
      be, ms, outs, T, kGemmBlocksPerSm, false,
      [&](dim3 grid, const StackedMatrices& m, int64_t split_chunks, float* part, int64_t rows) {
        launch(stream, "gemm_kernel", gemm_kernel<D>, grid, kGemmThreads, kGemmSharedBytes, m, ms[0]->row_bytes, K, split_chunks, x, T, x_vec4, part, rows);
      });
  sum_partials(be, p, ms, outs, T);
}

// The int8 tile's products (T > kMatvecMaxTokens) of at most kMaxStacked matrices of one type on
// activations xq quantized for I, in one launch.
template <typename I>
void launch_int8_matmul(CudaBackend& be, std::span<const DeviceMatrix* const> ms, std::span<float* const> outs,
                        const QuantizedActivations& xq, int64_t T) {
  sum_partials(be, launch_int8_stacked<I>(be, ms, outs, xq, T, false), ms, outs, T);
}

// x [T][K] as the products that share it read it: FP32, or in an int8 format (Q8_0, Q8_K)
// quantized on first use, once per format (Q8_0 given when x's producer wrote it).
struct SharedX {
  CudaBackend& be;
  const float* values;
  int64_t T, K;
  std::optional<QuantizedActivations> quantized[2] = {};  // Q8_0, Q8_K
  SharedX(CudaBackend& be, const float* values, int64_t T, int64_t K, const QuantizedActivations* q8_0)
      : be(be), values(values), T(T), K(K) {
    if (q8_0) quantized[0] = *q8_0;
  }
  const QuantizedActivations& in_format(bool block256) {
    std::optional<QuantizedActivations>& q = quantized[block256 ? 1 : 0];
    if (!q) q = quantize_activations(be, block256, values, T, K);
    return *q;
  }
};

// Decode products of matrices of one type with a unit loader (at most kMaxSegments): on int8
// activations where the backend decodes the type on them, else on FP32 activations.
void decode_products(std::span<const DeviceMatrix* const> ms, std::span<float* const> outs, SharedX& x) {
  const GgmlType type = ms[0]->type;
  cudaStream_t stream = x.be.stream();
  const bool int8 = x.be.int8_decode(type) && dispatch_int8_unit(type, [&](auto unit) {
    using U = decltype(unit);
    gemv<U>(ms, outs, x.K, Int8X{x.in_format(U::kBlock256).view(), x.K}, x.T, stream);
  });
  if (!int8) dispatch_unit(type, [&](auto unit) { gemv<decltype(unit)>(ms, outs, x.K, FloatX{x.values, x.K}, x.T, stream); });
}

}  // namespace

QuantizedActivations quantize_activations(CudaBackend& be, bool block256, const float* x, int64_t rows, int64_t K) {
  if (K % (block256 ? 256 : 32) != 0) fail("cuda: activations of ", K, " values do not fill ", block256 ? "Q8_K" : "Q8_0", " blocks");
  QuantizedActivations q = be.q8_scratch(rows * K);
  auto* codes = reinterpret_cast<int8_t*>(q.codes.f32());
  auto* scales = reinterpret_cast<float2*>(q.scales.f32());
  constexpr int kThreads = 256;
  const int64_t n_blocks = rows * K / (block256 ? 256 : 32);  // a warp a Q8_K block, 8 threads a Q8_0 chunk
  if (block256)
    launch(be.stream(), "quantize_q8_k_kernel", quantize_q8_k_kernel, blocks_for(n_blocks * 32, kThreads), kThreads, 0, x, n_blocks, codes, scales);
  else
    launch(be.stream(), "quantize_q8_0_kernel", quantize_q8_0_kernel, blocks_for(n_blocks * 8, kThreads), kThreads, 0, x, n_blocks, codes, scales);
  return q;
}

QuantizeTarget CudaBackend::q8_output(const Tensor& out) {
  q8_output_ = {};
  const int64_t n = out.n_elements();
  if (!int8_products_ || n % 32 != 0) return {};
  q8_output_ = {.values = out.f32(), .n = n, .op = profiler_.ops_begun(),
                .q = q8_scratch(n)};
  return q8_output_.q.target();
}

const QuantizedActivations* CudaBackend::q8_input(const Tensor& x) const {
  const Q8Output& o = q8_output_;
  const bool current = o.values && o.values == x.f32() && o.n == x.n_elements() && o.op + 1 == profiler_.ops_begun();
  return current ? &o.q : nullptr;
}

bool CudaBackend::int8_product(GgmlType type) const { return int8_products_ && has_int8_decoder(type); }

bool CudaBackend::int8_decode(GgmlType type) const {
  return int8_products_ && dispatch_int8_unit(type, [](auto) {});
}

void CudaBackend::matmul(const DeviceMatrix& w, const float* x, int64_t T, float* out, const QuantizedActivations* x_q8) {
  if (T == 0 || w.n_rows == 0) return;
  SharedX shared(*this, x, T, w.K, x_q8);
  const DeviceMatrix* ms[] = {&w};
  float* outs[] = {out};
  if (T <= kMatvecMaxTokens && has_unit_loader(w.type, w.K)) return decode_products(ms, outs, shared);
  if (T > kMatvecMaxTokens && int8_product(w.type)) {
    dispatch_int8_type(w.type, [&](auto i8) {
      launch_int8_matmul<decltype(i8)>(*this, ms, outs, shared.in_format(decltype(i8)::kBlock256), T);
    });
    return;
  }
  bool ok = dispatch_weight_type(w.type, [&](auto dq) { launch_matmul<decltype(dq)>(*this, ms, outs, x, T, stream_); });
  if (!ok) fail("cuda matmul: no decoder for ", type_name(w.type));
}

void CudaBackend::mul_mat(const Weight& w, const Tensor& x, Tensor& out) {
  OpScope scope(profiler_, "mul_mat", x.ne(1), stream_, w.ne[1]);
  check_mul_mat(w, x, out);
  const DeviceMatrix& m = matrix(w);
  const QuantizedActivations* x_q8 = q8_input(x);
  drop_early_read();
  ReadSlot* slot = x.ne(1) == 1 && recording_ && m.n_rows >= kEarlyReadRows && out.n_bytes() <= kReadBufferBytes
                       ? free_read_slot()
                       : nullptr;
  if (!slot) return matmul(m, x.f32(), x.ne(1), out.f32(), x_q8);
  const int64_t first = m.n_rows / 8 * 7 / 64 * 64;  // the copy of 7/8 runs beside the last 1/8
  DeviceMatrix head = m, tail = m;
  head.n_rows = first;
  tail.data += static_cast<uint64_t>(first) * m.row_bytes;
  tail.n_rows = m.n_rows - first;
  matmul(head, x.f32(), 1, out.f32(), x_q8);
  memcpy_async(slot->host, out.f32(), static_cast<size_t>(first) * sizeof(float), cudaMemcpyDeviceToHost, stream_,
               "early read", /*beside=*/true);
  matmul(tail, x.f32(), 1, out.f32() + first, x_q8);
  slot->busy = true;
  early_read_ = {.values = out.f32(), .n = m.n_rows, .first = first, .slot = slot};
}

void CudaBackend::mul_mat_shared_input(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor* const> outs) {
  OpScope scope(profiler_, "mul_mat_shared_input", x.ne(1), stream_, ws.empty() ? 0 : ws[0]->ne[1]);
  if (ws.size() != outs.size()) fail("mul_mat_shared_input: ", ws.size(), " weights for ", outs.size(), " outputs");
  for (size_t i = 0; i < ws.size(); ++i) check_mul_mat(*ws[i], x, *outs[i]);
  std::vector<const DeviceMatrix*> ms;
  std::vector<float*> out_ptrs;
  for (size_t i = 0; i < ws.size(); ++i) ms.push_back(&matrix(*ws[i])), out_ptrs.push_back(outs[i]->f32());
  matmul_shared(ms, x.f32(), x.ne(0), x.ne(1), out_ptrs, q8_input(x));
}

void CudaBackend::matmul_shared(std::span<const DeviceMatrix* const> ms, const float* x, int64_t K, int64_t T,
                                std::span<float* const> outs, const QuantizedActivations* x_q8) {
  // The int8 products quantize x once per activation format (Q8_0, Q8_K) and share it.
  SharedX shared(*this, x, T, K, x_q8);
  // The matrices of one type go out in one launch (at most `limit` of them); the rest one by one.
  std::vector<const DeviceMatrix*> batch;
  std::vector<float*> batch_out;
  std::vector<bool> done(ms.size(), false);
  const auto take_batch = [&](size_t first, size_t limit) {  // ms[first]'s type, from ms[first] on
    batch.clear();
    batch_out.clear();
    for (size_t j = first; j < ms.size() && batch.size() < limit; ++j) {
      if (done[j] || ms[j]->type != ms[first]->type || ms[j]->n_rows == 0) continue;
      batch.push_back(ms[j]);
      batch_out.push_back(outs[j]);
      done[j] = true;
    }
  };
  for (size_t i = 0; i < ms.size(); ++i) {
    if (done[i]) continue;
    if (T <= kMatvecMaxTokens && has_unit_loader(ms[i]->type, K)) {  // decode
      take_batch(i, kMaxSegments);
      if (!batch.empty()) decode_products(batch, batch_out, shared);
    } else if (T > kMatvecMaxTokens && ms[i]->n_rows > 0 && int8_product(ms[i]->type)) {  // prefill: the int8 tile
      take_batch(i, kMaxStacked);
      dispatch_int8_type(ms[i]->type, [&](auto i8) {
        using I = decltype(i8);
        launch_int8_matmul<I>(*this, batch, batch_out, shared.in_format(I::kBlock256), T);
      });
    } else if (T > kMatvecMaxTokens && ms[i]->n_rows > 0) {  // prefill: the FP32 tile
      const GgmlType type = ms[i]->type;
      take_batch(i, kMaxStacked);
      const bool ok = dispatch_weight_type(type, [&](auto dq) { launch_matmul<decltype(dq)>(*this, batch, batch_out, x, T, stream_); });
      if (!ok) fail("cuda matmul: no decoder for ", type_name(type));
    }
  }
  for (size_t i = 0; i < ms.size(); ++i)
    if (!done[i]) matmul(*ms[i], x, T, outs[i]);
}

}  // namespace regolith::cuda
