#include "quant/iq_lattice.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "quant/iq_grids.h"

namespace regolith::quant {

IqLattice::IqLattice(const void* table, int n_points, int dim, int n_candidates) : dim_(dim) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n_points) * dim);
  for (int p = 0; p < n_points; ++p)
    for (int i = 0; i < dim; ++i) {
      uint64_t entry = dim == 8 ? static_cast<const uint64_t*>(table)[p] : static_cast<const uint32_t*>(table)[p];
      bytes[static_cast<size_t>(p) * dim + i] = static_cast<uint8_t>(entry >> (8 * i));
    }
  std::vector<uint8_t> distinct(bytes);
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  n_levels_ = static_cast<int>(distinct.size());
  for (int l = 0; l < n_levels_; ++l) levels_[l] = distinct[l];
  for (int l = 0; l + 1 < n_levels_; ++l) thresholds_[l] = 0.5f * (levels_[l] + levels_[l + 1]);
  values_.assign(bytes.begin(), bytes.end());

  int n_cells = 1;
  for (int i = 0; i < dim; ++i) n_cells *= n_levels_;
  n_candidates = std::min(n_candidates, n_points);
  start_.resize(n_cells + 1);
  candidates_.reserve(static_cast<size_t>(n_cells) * n_candidates);
  std::vector<float> dist(n_points);
  std::vector<int> order(n_points);
  float centre[8];
  for (int cell = 0; cell < n_cells; ++cell) {
    for (int i = 0, c = cell; i < dim; ++i, c /= n_levels_) centre[i] = levels_[c % n_levels_];
    for (int p = 0; p < n_points; ++p) {
      float d2 = 0;
      for (int i = 0; i < dim; ++i) {
        float diff = values_[static_cast<size_t>(p) * dim + i] - centre[i];
        d2 += diff * diff;
      }
      dist[p] = d2;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + n_candidates, order.end(),
                      [&](int a, int b) { return dist[a] < dist[b] || (dist[a] == dist[b] && a < b); });
    start_[cell] = static_cast<uint32_t>(candidates_.size());
    for (int k = 0; k < n_candidates; ++k) candidates_.push_back(static_cast<uint16_t>(order[k]));
  }
  start_[n_cells] = static_cast<uint32_t>(candidates_.size());
}

const IqLattice& IqLattice::get(Kind kind) {
  // Candidate counts trade speed for quality: 8-dim grids have many more near neighbours.
  switch (kind) {
    case Kind::iq2_xxs: {
      static const IqLattice lattice(kIq2XxsGrid, 256, 8, 24);
      return lattice;
    }
    case Kind::iq2_xs: {
      static const IqLattice lattice(kIq2XsGrid, 512, 8, 24);
      return lattice;
    }
    case Kind::iq2_s: {
      static const IqLattice lattice(kIq2SGrid, 1024, 8, 24);
      return lattice;
    }
    case Kind::iq3_xxs: {
      static const IqLattice lattice(kIq3XxsGrid, 256, 4, 12);
      return lattice;
    }
    case Kind::iq3_s:
      break;
  }
  static const IqLattice lattice(kIq3SGrid, 512, 4, 12);
  return lattice;
}

int IqLattice::best_point(const float* x, const float* w, float s, float& err) const {
  const float is = s > 0 ? 1.0f / s : 0.0f;
  int cell = 0;
  for (int i = dim_ - 1; i >= 0; --i) {
    const float t = x[i] * is;
    int level = 0;
    while (level + 1 < n_levels_ && t > thresholds_[level]) ++level;
    cell = cell * n_levels_ + level;
  }
  int best = candidates_[start_[cell]];
  float best_err = INFINITY;
  for (uint32_t k = start_[cell]; k < start_[cell + 1]; ++k) {
    const float* p = point(candidates_[k]);
    float e = 0;
    for (int i = 0; i < dim_; ++i) {
      const float diff = s * p[i] - x[i];
      e += w[i] * diff * diff;
    }
    if (e < best_err) {
      best_err = e;
      best = candidates_[k];
    }
  }
  err = best_err;
  return best;
}

}  // namespace regolith::quant
