// Search structure over an I-quant grid: the grid's points as magnitudes, and for every cell of
// the lattice of per-coordinate levels, a short list of the grid points nearest to it. To code a
// group of values at a given scale, round each value to its nearest level, then pick the best of
// the listed points under the caller's weights. Built once per grid, on first use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace regolith::quant {

class IqLattice {
 public:
  enum class Kind { iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s };
  static const IqLattice& get(Kind kind);

  int dim() const { return dim_; }
  const float* point(int index) const { return &values_[static_cast<std::size_t>(index) * dim_]; }
  float top_level() const { return levels_[n_levels_ - 1]; }

  // The best grid point for magnitudes x (weights w) at scale s, and its weighted error.
  int best_point(const float* x, const float* w, float s, float& err) const;

 private:
  IqLattice(const void* table, int n_points, int dim, int n_candidates);

  int dim_ = 0, n_levels_ = 0;
  float levels_[8] = {};
  float thresholds_[7] = {};     // midpoints between consecutive levels
  std::vector<float> values_;     // n_points × dim magnitudes
  std::vector<uint32_t> start_;   // per cell: offset into candidates_, plus an end sentinel
  std::vector<uint16_t> candidates_;
};

}  // namespace regolith::quant
