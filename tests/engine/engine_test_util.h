// Shared helpers of the engine tests: where the test models are, and logits comparison with the
// tolerance of docs/method.md (max |Δlogit| <= 1e-3·max|logit| per position, identical argmax).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/ops.h"

namespace regolith::test {

inline std::string engine_model(const std::string& name) { return std::string(REGOLITH_ENGINE_MODELS) + "/" + name; }

// ref and cpu, plus cuda where it is built in (its tests skip without a device).
inline std::vector<std::string> engine_backends() {
  std::vector<std::string> out{"ref", "cpu"};
  for (const std::string& name : backend_names())
    if (name == "cuda") out.push_back(name);
  return out;
}

struct LogitsDiff {
  double max_abs = 0;        // max |Δ| over all positions
  double max_rel = 0;        // max over positions of max|Δ| / max|reference logit|
  int64_t argmax_mismatches = 0;
  int64_t worst_position = -1;
};

inline int64_t row_argmax(const float* row, int64_t V) { return std::max_element(row, row + V) - row; }

inline LogitsDiff compare_logits(const std::vector<float>& got, const std::vector<float>& want, int64_t V) {
  LogitsDiff d;
  EXPECT_EQ(got.size(), want.size());
  int64_t T = static_cast<int64_t>(std::min(got.size(), want.size())) / V;
  for (int64_t t = 0; t < T; ++t) {
    const float *g = got.data() + t * V, *w = want.data() + t * V;
    double row_abs = 0, row_max = 0;
    for (int64_t i = 0; i < V; ++i) {
      row_abs = std::max(row_abs, static_cast<double>(std::fabs(g[i] - w[i])));
      row_max = std::max(row_max, static_cast<double>(std::fabs(w[i])));
    }
    d.max_abs = std::max(d.max_abs, row_abs);
    if (row_abs / row_max > d.max_rel) d.max_rel = row_abs / row_max, d.worst_position = t;
    if (row_argmax(g, V) != row_argmax(w, V)) ++d.argmax_mismatches;
  }
  return d;
}

inline constexpr double kLogitTolerance = 1e-3;  // docs/method.md; never loosen

inline void expect_within_tolerance(const LogitsDiff& d, const std::string& what) {
  EXPECT_LE(d.max_rel, kLogitTolerance) << what << ": worst position " << d.worst_position;
  EXPECT_EQ(d.argmax_mismatches, 0) << what;
}

}  // namespace regolith::test
