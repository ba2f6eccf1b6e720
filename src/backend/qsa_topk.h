// The block choice of a QSA query row, shared by every backend so they agree exactly: the k
// highest scores, equal scores going to the lower block index (model-spec §4.5; NInfer, Strata
// and llama.cpp use the same rule). Exact ties are common, not exotic: a block whose every indexer
// head has a non-positive dot product scores exactly 0 after the relu. The reference fixtures are
// generated with the same rule (tools/reference/make_fixtures.py), since torch.topk leaves the
// order of ties unspecified. Returns the chosen block indices in ascending order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace regolith {

inline std::vector<int64_t> qsa_top_blocks(std::span<const double> scores, int64_t k) {
  int64_t n = static_cast<int64_t>(scores.size());
  k = std::clamp<int64_t>(k, 0, n);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  auto before = [&](int64_t a, int64_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace regolith
