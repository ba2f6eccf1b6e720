// The block choice of a QSA query row, shared by every backend so they agree exactly: the k
// highest scores. Exactly equal scores — in practice blocks whose every indexer head has a
// non-positive dot product, which relu turns into a score of exactly 0 — are resolved the way the
// transformers reference resolves them on the CPU: torch.topk runs std::nth_element (or
// std::partial_sort when 64·k <= n) over (score, index) pairs comparing scores only, so the kept
// set among ties is libstdc++'s introselect order, not "lower index first" (model-spec §4.5 leaves
// torch's order unspecified). The committed fixtures contain such ties and pin this choice; for
// distinct scores the two rules agree.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace regolith {

inline std::vector<int64_t> qsa_top_blocks(std::span<const double> scores, int64_t k) {
  int64_t n = static_cast<int64_t>(scores.size());
  k = std::min(k, n);
  std::vector<std::pair<double, int64_t>> q(n);
  for (int64_t b = 0; b < n; ++b) q[b] = {scores[b], b};
  auto higher = [](const std::pair<double, int64_t>& x, const std::pair<double, int64_t>& y) { return x.first > y.first; };
  if (k > 0) {
    if (k * 64 <= n)
      std::partial_sort(q.begin(), q.begin() + k, q.end(), higher);
    else
      std::nth_element(q.begin(), q.begin() + (k - 1), q.end(), higher);
  }
  std::vector<int64_t> out(k);
  for (int64_t j = 0; j < k; ++j) out[j] = q[j].second;
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace regolith
