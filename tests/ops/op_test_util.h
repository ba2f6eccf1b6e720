// Helpers of the op tests: seeded inputs, weights encoded in any readable type, upload/download,
// and comparison against float64 expectations computed in the test itself.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"
#include "core/error.h"
#include "quant/rows.h"

namespace regolith::test {

// A backend by name for a test's SetUp. A device backend whose device is absent (CI has nvcc but
// no GPU) gives null and the reason, so the test skips instead of failing.
inline std::unique_ptr<Backend> backend_or_skip_reason(const std::string& name, std::string& reason) {
  try {
    return make_backend(name);
  } catch (const Error& e) {
    if (name != "cuda") throw;
    reason = e.what();
    return nullptr;
  }
}

// Names parameterized tests by backend ("Backends/BasicOps.GetRows/cuda"), so CTest labels can
// select a backend's instances.
inline std::string backend_param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

inline std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& v : out) v = dist(rng);
  return out;
}

// A weight with its own bytes; values() are what the backend reads (after encoding).
struct OwnedWeight {
  std::vector<uint8_t> bytes;
  Weight w;
  std::vector<float> values() const {
    std::vector<float> out(w.n_elements());
    for (int64_t r = 0; r < w.n_rows(); ++r) dequantize_row(w.type, bytes.data() + r * w.row_bytes, w.ne[0], out.data() + r * w.ne[0]);
    return out;
  }
};

inline std::unique_ptr<OwnedWeight> make_weight(const std::string& name, GgmlType type, std::array<int64_t, 4> ne,
                                                const std::vector<float>& values) {
  auto o = std::make_unique<OwnedWeight>();
  o->w.name = name;
  o->w.type = type;
  o->w.ne = ne;
  o->w.row_bytes = row_bytes(type, ne[0]);
  o->bytes.resize(o->w.row_bytes * o->w.n_rows());
  for (int64_t r = 0; r < o->w.n_rows(); ++r) quantize_row(type, values.data() + r * ne[0], ne[0], o->bytes.data() + r * o->w.row_bytes);
  o->w.data = o->bytes.data();
  return o;
}

inline Tensor upload(Backend& be, const std::vector<float>& v, std::array<int64_t, 4> ne) {
  Tensor t = be.alloc(DType::F32, ne);
  be.write(t, v.data(), v.size() * sizeof(float));
  return t;
}

inline Tensor upload_i32(Backend& be, const std::vector<int32_t>& v, std::array<int64_t, 4> ne) {
  Tensor t = be.alloc(DType::I32, ne);
  be.write(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

// max|got − want| <= tol · max(1, max|want|)
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1, worst = 0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < got.size(); ++i)
    if (std::fabs(got[i] - want[i]) > worst) worst = std::fabs(got[i] - want[i]), at = i;
  EXPECT_LE(worst, tol * scale) << what << ": worst at " << at << " got " << got[at] << " want " << want[at];
}

inline double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
inline double silu(double x) { return x * sigmoid(x); }

}  // namespace regolith::test
