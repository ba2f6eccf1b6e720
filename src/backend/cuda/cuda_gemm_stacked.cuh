// Products of several matrices of one type and row length on the same activations as one launch of
// a tile kernel (the FP32 tile of cuda_gemm.cuh, the int8 tile of cuda_gemm_int8.cuh), K split to
// fill the GPU.
#pragma once

#include <span>
#include <vector>

#include "backend/cuda/cuda_backend_impl.cuh"
#include "backend/cuda/cuda_gemm_int8.cuh"

namespace regolith::cuda {

// Matrices stacked for one launch: matrix i's row tiles are tiles [first_tile[i], first_tile[i + 1])
// of grid.y (no tile spans two), so that small ones (GDN's a and b rows, QSA's k, v and indexer
// rows, the shared expert's gate beside the router) ride with the large ones instead of each
// filling the GPU through K splits of its own.
constexpr int kMaxStacked = 5;  // QSA's five input products
struct StackedMatrices {
  const uint8_t* data[kMaxStacked];
  float* out[kMaxStacked];
  int64_t n_rows[kMaxStacked];
  int64_t first_row[kMaxStacked];  // rows of the matrices before it
  unsigned first_tile[kMaxStacked];
  int count;
};

// A block's share of a stacked product: its matrix (W, N rows), its first row n0, where its sums go.
struct StackedTile {
  const uint8_t* W;
  int64_t N, n0;
  float* out;
};

// Block (x, y, z)'s tile: the matrix of row tile y, chosen with constant indices (a dynamic one
// would go through local memory). With part set, split z of matrix i's product goes to part +
// z·T·total_rows + first_row[i]·T (laid out [T][n_rows[i]]), else to out[i].
__device__ __forceinline__ StackedTile stacked_tile(const StackedMatrices& m, int64_t T, float* part, int64_t total_rows) {
  int i = 0;
#pragma unroll
  for (int j = 1; j < kMaxStacked; ++j)
    if (j < m.count && blockIdx.y >= m.first_tile[j]) i = j;
  StackedTile tile{m.data[0], m.n_rows[0], static_cast<int64_t>(blockIdx.y) * kGemmRows, m.out[0]};
  int64_t first_row = 0;
#pragma unroll
  for (int j = 1; j < kMaxStacked; ++j)
    if (j == i) {
      tile = {m.data[j], m.n_rows[j], static_cast<int64_t>(blockIdx.y - m.first_tile[j]) * kGemmRows, m.out[j]};
      first_row = m.first_row[j];
    }
  if (part) tile.out = part + blockIdx.z * T * total_rows + first_row * T;
  return tile;
}

// The kernel and its launcher are internal to each file that includes this header: with external
// linkage the files' copies of a kernel template share one host stub, and the shared-memory limit
// set through one file's copy did not reach the other's (launches failed with "invalid argument").
namespace {

// The int8 tile over stacked matrices: grid (token tiles, row tiles of all, K splits) on xq, the
// quantized activations; split z covers chunks [z·split_chunks, (z + 1)·split_chunks).
template <typename I>
__global__ void __launch_bounds__(kGemmThreads, kGemmInt8BlocksPerSm)
    gemm_int8_kernel(StackedMatrices m, uint64_t row_bytes, int64_t K, int64_t split_chunks, QuantizedX xq, int64_t T,
                     float* __restrict__ part, int64_t total_rows) {
  grid_dependency_wait();
  const StackedTile tile = stacked_tile(m, T, part, total_rows);
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kGemmCols, c_begin = blockIdx.z * split_chunks;
  const int64_t c_end = min(c_begin + split_chunks, K / 32);
  gemm_int8_tile<I>(
      tile.W, row_bytes, K, c_begin, c_end, tile.N, tile.n0, T - t0 < kGemmCols ? T - t0 : kGemmCols, xq,
      [=](int tt) { return t0 + tt; }, tile.out, [=](int tt) { return t0 + tt; });
}

}  // namespace

// A stacked product's split partials: split z of matrix i at partial(i, T) + z·T·rows, laid out
// [T][n_rows of i]; none (part empty) when the one split went straight to the outputs.
struct StackedProduct {
  Tensor part;
  int splits = 1;
  int64_t rows = 0;
  std::vector<int64_t> first_row;
  float* partial(size_t i, int64_t T) const { return part.f32() + first_row[i] * T; }
};

// The stacked product of ms (one type and row length, at most kMaxStacked) by T tokens:
// launch_tiles(grid, m, split_chunks, part, rows) launches the tile kernel, blocks_per_sm of them
// on a multiprocessor. With one split (the tiles fill the GPU) and !keep_partials the tiles write
// outs, else the partials.
template <typename LaunchTiles>
StackedProduct stacked_product(CudaBackend& be, std::span<const DeviceMatrix* const> ms, std::span<float* const> outs,
                               int64_t T, int blocks_per_sm, bool keep_partials, LaunchTiles launch_tiles) {
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
  const int64_t n_chunks = (ms[0]->K + 31) / 32;
  const unsigned col_tiles = blocks_for(T, kGemmCols);
  const int64_t split_chunks = split_chunks_for(col_tiles * tiles, ms[0]->K, blocks_per_sm);
  p.splits = static_cast<int>((n_chunks + split_chunks - 1) / split_chunks);
  if (p.splits > 1 || keep_partials) p.part = be.scratch_f32(p.splits * T * p.rows);
  launch_tiles(dim3(col_tiles, static_cast<unsigned>(tiles), static_cast<unsigned>(p.splits)), m, split_chunks,
               p.part.empty() ? nullptr : p.part.f32(), p.rows);
  return p;
}

namespace {

// gemm_int8_kernel<I> over ms on xq (stacked_product).
template <typename I>
StackedProduct launch_int8_stacked(CudaBackend& be, std::span<const DeviceMatrix* const> ms, std::span<float* const> outs,
                                   const QuantizedActivations& xq, int64_t T, bool keep_partials) {
  [[maybe_unused]] static const bool shared_ready = allow_max_shared(gemm_int8_kernel<I>, kGemmInt8SharedBytes, "gemm_int8_kernel shared memory");
  return stacked_product(be, ms, outs, T, kGemmInt8BlocksPerSm, keep_partials,
                         [&](dim3 grid, const StackedMatrices& m, int64_t split_chunks, float* part, int64_t rows) {
                           launch(be.stream(), "gemm_int8_kernel", gemm_int8_kernel<I>, grid, kGemmThreads, kGemmInt8SharedBytes, m, ms[0]->row_bytes, ms[0]->K, split_chunks, xq.view(), T, part, rows);
                         });
}

}  // namespace

}  // namespace regolith::cuda
