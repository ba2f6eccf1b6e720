// Helpers shared by the reference ops: weight rows as floats, FP64 dots, threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/parallel.h"
#include "quant/rows.h"

namespace regolith::ref {

// Row r of a weight as floats (a pointer into the file for F32, else dequantized into a buffer).
class RowReader {
 public:
  explicit RowReader(const Weight& w) : w_(w), buf_(w.type == GgmlType::F32 ? 0 : w.ne[0]) {}
  const float* row(int64_t r) {
    const uint8_t* p = w_.data + static_cast<uint64_t>(r) * w_.row_bytes;
    if (w_.type == GgmlType::F32) return reinterpret_cast<const float*>(p);
    dequantize_row(w_.type, p, w_.ne[0], buf_.data());
    return buf_.data();
  }

 private:
  const Weight& w_;
  std::vector<float> buf_;
};

inline std::vector<float> weight_values(const Weight& w) {
  std::vector<float> out(w.n_elements());
  RowReader rows(w);
  for (int64_t r = 0; r < w.n_rows(); ++r) {
    const float* p = rows.row(r);
    std::copy(p, p + w.ne[0], out.begin() + r * w.ne[0]);
  }
  return out;
}

inline double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

inline double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }
// PyTorch's softplus (beta 1, threshold 20).
inline double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

// Splits [0, n) over threads when each piece carries enough work (`cost` per item) to pay for a
// thread; tiny ops stay on the calling thread.
inline void parallel_rows(int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kWorkPerThread = 1 << 16;
  int64_t min_items = std::max<int64_t>(1, kWorkPerThread / std::max<int64_t>(1, cost));
  parallel_for(n, fn, min_items);
}

// FP32 RoPE angle as transformers computes it: inv_freq and position product in float32.
inline float rope_angle(int64_t pos, int64_t i, int64_t n_rot, float theta) {
  float inv_freq = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(n_rot));
  return inv_freq * static_cast<float>(pos);
}

// Rotates the first n_rot values of one head in place (NeoX: pairs (i, i + n_rot/2)).
inline void rope_head(float* x, int64_t pos, int64_t n_rot, float theta) {
  int64_t half = n_rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    float ang = rope_angle(pos, i, n_rot, theta);
    double c = static_cast<float>(std::cos(static_cast<double>(ang)));
    double s = static_cast<float>(std::sin(static_cast<double>(ang)));
    double x1 = x[i], x2 = x[i + half];
    x[i] = static_cast<float>(x1 * c - x2 * s);
    x[i + half] = static_cast<float>(x2 * c + x1 * s);
  }
}

// x·rsqrt(mean(x²) + eps) over n values, times w (null: 1).
inline void rms_norm_row(const float* x, const float* w, int64_t n, double eps, float* out) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  double r = 1.0 / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] * r * (w ? w[i] : 1.0));
}

}  // namespace regolith::ref
