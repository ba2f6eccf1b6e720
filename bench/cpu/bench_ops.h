// Per-op timing of the CPU benchmark (bench_ops.cpp).
#pragma once

#include <string>
#include <vector>

#include "bench_common.h"

namespace regolith::bench {

struct OpsOptions {
  std::string geometry = "tiny";
  GgmlType type = GgmlType::Q8_0;
  int64_t T = 1;
  int n_threads = 0;
  double min_seconds = 0.3;
  std::vector<std::string> backends{"ref", "cpu"};
  std::string filter;  // only ops whose name contains this
};

void bench_ops(const OpsOptions& options);

}  // namespace regolith::bench
