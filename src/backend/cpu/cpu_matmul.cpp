// Matrix products with weight rows: the mul_mat op and the row-split helpers the other op files
// use (HC read, MoE experts). Rows are split over threads; each thread runs the kernel's
// rows × tokens tiles over its rows (kernels_impl.h).
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"
#include "quant/rows.h"

namespace regolith {
namespace cpu {

namespace {

// Rows dequantized at once for types without a direct kernel, and for the direct types once this
// many tokens share them: the kernels widen a row in registers for every block of tokens, so with
// many tokens one widening into an FP32 buffer and the FP32 tiles are cheaper.
constexpr int64_t kDequantRows = 16;
constexpr int64_t kWidenOnceTokens = 8;

}  // namespace

void row_to_f32(const Kernels& k, const WeightRows& w, int64_t r, float* out) {
  const uint8_t* row = w.data + static_cast<uint64_t>(r) * w.row_bytes;
  WType wt;
  if (direct_wtype(w.type, wt))
    k.to_f32[static_cast<int>(wt)](row, w.K, out);
  else
    dequantize_row(w.type, row, w.K, out);
}

void mat_rows(const Kernels& k, const WeightRows& w, int64_t r0, int64_t r1, const float* x, int64_t ldx, int64_t T,
              float* out, int64_t ldo) {
  if (r1 <= r0 || T <= 0) return;
  WType wt;
  if (direct_wtype(w.type, wt) && (wt == WType::F32 || T < kWidenOnceTokens)) {
    k.mat[static_cast<int>(wt)](w.data + static_cast<uint64_t>(r0) * w.row_bytes, w.row_bytes, r1 - r0, w.K, x, ldx, T,
                                out, ldo);
    return;
  }
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(kDequantRows * w.K));
  for (int64_t r = r0; r < r1; r += kDequantRows) {
    int64_t n = std::min(kDequantRows, r1 - r);
    for (int64_t i = 0; i < n; ++i) row_to_f32(k, w, r + i, buf.data() + i * w.K);
    k.mat[static_cast<int>(WType::F32)](reinterpret_cast<const uint8_t*>(buf.data()), w.K * 4, n, w.K, x, ldx, T,
                                        out + (r - r0), ldo);
  }
}

void mat_parallel(ThreadPool& pool, const Kernels& k, const WeightRows& w, int64_t N, const float* x, int64_t ldx,
                  int64_t T, float* out, int64_t ldo) {
  // Chunks of whole 16-row groups keep every kernel tile full.
  int64_t grain = grain_for(N, w.K * T, pool.size());
  if (grain < N) grain = std::min(N, (grain + 15) / 16 * 16);
  pool.parallel_for(N, grain, [&](int64_t r0, int64_t r1) { mat_rows(k, w, r0, r1, x, ldx, T, out + r0, ldo); });
}

const float* weight_f32(const Kernels& k, const Weight& w, std::vector<float>& buf) {
  if (w.type == GgmlType::F32) return reinterpret_cast<const float*>(w.data);
  buf.resize(static_cast<size_t>(w.n_elements()));
  WeightRows rows = rows_of(w);
  for (int64_t r = 0; r < w.n_rows(); ++r) row_to_f32(k, rows, r, buf.data() + r * w.ne[0]);
  return buf.data();
}

}  // namespace cpu

void CpuBackend::mul_mat(const Weight& w, const Tensor& x, Tensor& out) {
  int64_t K = w.ne[0], N = w.ne[1], T = x.ne(1);
  if (w.ne[2] != 1 || w.ne[3] != 1) fail("mul_mat: ", w.name, " is not a matrix");
  cpu::expect_shape(x, {K, T, 1, 1}, "mul_mat", "x");
  cpu::expect_shape(out, {N, T, 1, 1}, "mul_mat", "out");
  cpu::mat_parallel(pool_, k_, cpu::rows_of(w), N, x.f32(), K, T, out.f32(), N);
}

}  // namespace regolith
