// Shared helpers of the quant tests: the type lists, seeded test rows and the error metric.
#pragma once

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "core/ggml_type.h"
#include "quant/rows.h"

namespace regolith {
// gtest prints parameters with this.
inline void PrintTo(GgmlType t, std::ostream* os) { *os << type_name(t); }
}  // namespace regolith

namespace regolith::quant_test {

// Every type with a codec, activation formats included.
inline std::vector<GgmlType> all_types() {
  return {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,  GgmlType::Q4_0,    GgmlType::Q4_1,   GgmlType::Q5_0,
          GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q8_1,  GgmlType::Q2_0,    GgmlType::MXFP4,  GgmlType::Q2_K,
          GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,  GgmlType::Q6_K,    GgmlType::Q8_K,   GgmlType::IQ2_XXS,
          GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ4_NL, GgmlType::IQ4_XS};
}

// The quantized weight types.
inline std::vector<GgmlType> weight_types() {
  return {GgmlType::Q4_0, GgmlType::Q4_1,    GgmlType::Q5_0,   GgmlType::Q5_1,  GgmlType::Q8_0,    GgmlType::Q2_0,
          GgmlType::MXFP4, GgmlType::Q2_K,   GgmlType::Q3_K,   GgmlType::Q4_K,  GgmlType::Q5_K,    GgmlType::Q6_K,
          GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ4_NL,
          GgmlType::IQ4_XS};
}

inline std::vector<float> gaussian_row(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> d(0, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// Student-t with 3 degrees of freedom: occasional outliers many sigmas out.
inline std::vector<float> heavy_tailed_row(int64_t n, std::mt19937& rng) {
  std::student_t_distribution<float> d(3.0f);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// Log-normal per-column weights, like the mean squared activations of a real model.
inline std::vector<float> importance_row(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0, 1.5f);
  std::vector<float> w(n);
  for (float& v : w) v = std::exp(d(rng));
  return w;
}

// sqrt(Σ w (x − x̂)² / Σ w) over rows of n values, weights per column.
inline double weighted_rmse(GgmlType t, const std::vector<float>& x, const std::vector<uint8_t>& q, int64_t n,
                            const float* w) {
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  const uint64_t rb = row_bytes(t, n);
  std::vector<float> y(n);
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, q.data() + r * rb, n, y.data());
    for (int64_t i = 0; i < n; ++i) {
      double diff = static_cast<double>(x[r * n + i]) - y[i];
      num += w[i] * diff * diff;
      den += w[i];
    }
  }
  return std::sqrt(num / den);
}

}  // namespace regolith::quant_test
