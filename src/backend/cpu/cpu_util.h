// Helpers shared by the CPU backend's op files: weight rows as the kernels see them, the threaded
// row-split matrix product, scalar activations.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/thread_pool.h"
#include "backend/ops.h"
#include "core/error.h"

namespace regolith::cpu {

// Consecutive rows of a weight: K values of `type` each, row r at data + r·row_bytes.
struct WeightRows {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  uint64_t row_bytes = 0;
  int64_t K = 0;
};

inline WeightRows rows_of(const Weight& w, int64_t first_row = 0) {
  return {w.type, w.data + static_cast<uint64_t>(first_row) * w.row_bytes, w.row_bytes, w.ne[0]};
}

// Whether T tokens meet rows of `type` through quant's dot kernels (quant/dot.h) with quantized
// activations; otherwise they meet FP32 rows (float types, and quantized types at more tokens).
bool uses_vec_dot(GgmlType type, int64_t T);

// The tokens a product reads: x[t·ldx + k], t < T, K values each. Rows that take quant's dot
// kernels read the same tokens quantized to the activation format quant pairs with their type
// (Q8_0 or Q8_K), token t at q8_0 + t·row_bytes(Q8_0, K) (q8_k likewise); null where no row of
// this input needs that format.
struct MatInput {
  const float* x = nullptr;
  int64_t ldx = 0, K = 0, T = 0;
  const uint8_t* q8_0 = nullptr;
  const uint8_t* q8_k = nullptr;

  // Tokens [t0, t0 + n).
  MatInput tokens(int64_t t0, int64_t n) const;
};

// The quantized tokens behind a MatInput.
struct QuantizedTokens {
  std::vector<uint8_t> q8_0, q8_k;
};

// x's T tokens of K values as the input of rows of each of `types`, quantized into buf once per
// activation format those rows read when `group_T` tokens meet them: T for one product; MoE passes
// its smallest expert group, since each expert multiplies its own tokens.
MatInput mat_input(ThreadPool& pool, std::initializer_list<GgmlType> types, int64_t group_T, const float* x, int64_t ldx,
                   int64_t K, int64_t T, QuantizedTokens& buf);

// out[t·ldo + r − r0] = W_r · x_t for r in [r0, r1), t < T, on the calling thread: through quant's
// dot kernels when uses_vec_dot(type, T) (`in` must then hold the tokens in the rows' format, see
// mat_input), else through the FP32 tiles, rows of types without a direct kernel dequantized a
// few at a time into a thread-local buffer.
void mat_rows(const Kernels& k, const WeightRows& w, int64_t r0, int64_t r1, const MatInput& in, float* out, int64_t ldo);

// The same over rows [0, N), split over the pool when the product is large enough to pay for it.
void mat_parallel(ThreadPool& pool, const Kernels& k, const WeightRows& w, int64_t N, const MatInput& in, float* out,
                  int64_t ldo);

// Row r of a weight widened to FP32 into out (K values).
void row_to_f32(const Kernels& k, const WeightRows& w, int64_t r, float* out);

// All values of a small weight (norm gammas, conv taps, gates) as FP32: the mapping itself for
// F32, else a copy in buf.
const float* weight_f32(const Kernels& k, const Weight& w, std::vector<float>& buf);

// Items per parallel_for chunk (one item costs `row_cost`): at least `work` units per chunk and at
// most four chunks per thread; a range of little work stays one chunk (the calling thread runs it).
inline int64_t grain_for(int64_t n, int64_t row_cost, int64_t n_threads, int64_t work = 1 << 15) {
  if (n * row_cost < 2 * work || n_threads <= 1) return n;
  int64_t by_work = std::max<int64_t>(1, work / std::max<int64_t>(1, row_cost));
  int64_t by_balance = (n + 4 * n_threads - 1) / (4 * n_threads);
  return std::min(std::max(by_work, by_balance), n);
}

inline float sigmoidf(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float siluf(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace regolith::cpu
