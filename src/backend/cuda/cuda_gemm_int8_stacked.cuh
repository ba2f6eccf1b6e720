// Prefill products of several matrices on the same quantized activations as one launch of the
// int8 tile (cuda_gemm_int8.cuh), K split as split_product splits it.
#pragma once

#include <span>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemm_int8.cuh"

namespace regolith::cuda {

// Matrices of one int8 type and row length whose products read the same activations, stacked
// for one launch: matrix i's row tiles are tiles [first_tile[i], first_tile[i + 1]) of grid.y (no
// tile spans two), so that small ones (GDN's a and b rows, QSA's k, v and indexer rows) ride with
// the large ones instead of each filling the GPU through K splits of its own.
constexpr int kMaxStacked = 5;  // QSA's five input products
struct StackedMatrices {
  const uint8_t* data[kMaxStacked];
  float* out[kMaxStacked];
  int64_t n_rows[kMaxStacked];
  int64_t first_row[kMaxStacked];  // rows of the matrices before it
  unsigned first_tile[kMaxStacked];
  int count;
};

// The int8 twin of gemm_kernel over stacked matrices: grid (token tiles, row tiles of all,
// K splits), on xq, the quantized activations. With part set, split z of matrix i's product goes
// to part + z·T·total_rows + first_row[i]·T (laid out [T][n_rows[i]]), else to out[i].
template <typename I>
__global__ void __launch_bounds__(kGemmThreads, kGemmInt8BlocksPerSm)
    gemm_int8_kernel(StackedMatrices m, uint64_t row_bytes, int64_t K, int64_t split_chunks, QuantizedX xq, int64_t T,
                     float* __restrict__ part, int64_t total_rows) {
  grid_dependency_wait();
  int i = 0;  // the block's matrix, chosen with constant indices (a dynamic one would go through local memory)
#pragma unroll
  for (int j = 1; j < kMaxStacked; ++j)
    if (j < m.count && blockIdx.y >= m.first_tile[j]) i = j;
  const uint8_t* W = m.data[0];
  float* out = m.out[0];
  int64_t N = m.n_rows[0], first_row = 0;
  unsigned first_tile = 0;
#pragma unroll
  for (int j = 1; j < kMaxStacked; ++j)
    if (j == i) W = m.data[j], out = m.out[j], N = m.n_rows[j], first_row = m.first_row[j], first_tile = m.first_tile[j];
  if (part) out = part + blockIdx.z * T * total_rows + first_row * T;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kGemmCols, c_begin = blockIdx.z * split_chunks;
  const int64_t c_end = min(c_begin + split_chunks, K / 32);
  gemm_int8_tile<I>(
      W, row_bytes, K, c_begin, c_end, N, static_cast<int64_t>(blockIdx.y - first_tile) * kGemmRows,
      T - t0 < kGemmCols ? T - t0 : kGemmCols, xq, [=](int tt) { return t0 + tt; }, out, [=](int tt) { return t0 + tt; });
}

// A stacked product's split partials: split z of matrix i at partial(i, T) + z·T·rows, laid out
// [T][n_rows of i]; none (part empty) when the one split went straight to the outputs.
struct StackedProduct {
  Tensor part;
  int splits = 1;
  int64_t rows = 0;
  std::vector<int64_t> first_row;
  float* partial(size_t i, int64_t T) const { return part.f32() + first_row[i] * T; }
};

// Launches gemm_int8_kernel<I> for ms (one type and row length, at most kMaxStacked) on xq; with
// one split and !keep_partials it writes outs, else the partials.
template <typename I>
StackedProduct launch_int8_stacked(CudaBackend& be, std::span<const DeviceMatrix* const> ms, std::span<float* const> outs,
                                   const QuantizedActivations& xq, int64_t T, bool keep_partials) {
  [[maybe_unused]] static const bool shared_ready = allow_max_shared(gemm_int8_kernel<I>, kGemmInt8SharedBytes, "gemm_int8_kernel shared memory");
  if (ms.empty() || ms.size() > kMaxStacked) fail("cuda gemm: ", ms.size(), " matrices to stack");
  StackedMatrices m{};
  StackedProduct p;
  int64_t tiles = 0;
  for (const DeviceMatrix* w : ms) {
    m.data[m.count] = w->data, m.out[m.count] = outs[m.count], m.n_rows[m.count] = w->n_rows;
    m.first_row[m.count] = p.rows, m.first_tile[m.count] = static_cast<unsigned>(tiles);
    p.first_row.push_back(p.rows);
    p.rows += w->n_rows, tiles += gemm_row_blocks(w->n_rows), ++m.count;
  }
  if (tiles > 65535) fail("cuda gemm: ", p.rows, " stacked rows exceed the grid");
  const int64_t K = ms[0]->K;
  const unsigned col_tiles = blocks_for(T, kGemmCols);
  const int64_t split_chunks = split_chunks_for(col_tiles * tiles, K, kGemmInt8BlocksPerSm);
  p.splits = static_cast<int>((K / 32 + split_chunks - 1) / split_chunks);
  if (p.splits > 1 || keep_partials) p.part = be.scratch_f32(p.splits * T * p.rows);
  const dim3 grid(col_tiles, static_cast<unsigned>(tiles), static_cast<unsigned>(p.splits));
  launch(be.stream(), "gemm_int8_kernel", gemm_int8_kernel<I>, grid, kGemmThreads, kGemmInt8SharedBytes, m, ms[0]->row_bytes, K, split_chunks, xq.view(), T, p.part.empty() ? nullptr : p.part.f32(), p.rows);
  return p;
}

}  // namespace regolith::cuda
