// Numerical building blocks shared by the quantizers: least-squares fits of a group of values to
// integer codes with one scale (and optionally an offset), under per-value weights. Every fit
// searches a set of candidate scales, keeps the best by weighted squared error, then polishes it
// by re-assigning codes; callers re-quantize the scales themselves.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/half.h"

namespace regolith::quant {

// Round to nearest, ties to even; out-of-range and NaN inputs saturate instead of overflowing.
inline int nearest_int(float v) {
  if (!(std::fabs(v) < 1e8f)) return v > 0 ? 100000000 : -100000000;
  return static_cast<int>(std::lrintf(v));
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

// The value an fp16 field will hold after storing f.
inline float fp16_round(float f) { return f16_to_f32(f32_to_f16(f)); }

// x[i] ≈ s·L[i], L[i] integer in [lo, hi]; minimizes Σ w (x − s·L)². Returns s (0 for an
// all-zero group). `spread` candidate scales on each side of the max-magnitude mapping.
float fit_scale(int n, int lo, int hi, const float* x, const float* w, int8_t* L, int spread = 10);

// x[i] ≈ s·L[i] + offset, L[i] in [0, nmax]; minimizes Σ w (x − s·L − offset)². With
// offset_nonpositive the offset is held ≤ 0 (the K-quants store it as an unsigned "min").
// Candidate scales map [min, max] onto nmax + r for r in [r_lo, r_hi] in steps of r_step.
struct AffineFit {
  float scale = 0;
  float offset = 0;
};
AffineFit fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* L, bool offset_nonpositive,
                     float r_lo = -1.0f, float r_hi = 1.0f, float r_step = 0.05f);

// Weighted squared error of x against s·L + offset.
float affine_error(int n, const float* x, const float* w, const uint8_t* L, float scale, float offset);

// Values v[i] ≥ 0 (sub-block scales) ≈ d·L[i] with L in [0, nmax]; returns d.
float fit_unsigned_codes(int n, int nmax, const float* v, const float* w, uint8_t* L);

// Σ x² over n values.
inline float sum_squares(const float* x, int n) {
  float s = 0;
  for (int i = 0; i < n; ++i) s += x[i] * x[i];
  return s;
}

}  // namespace regolith::quant
