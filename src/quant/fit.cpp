#include "quant/fit.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace regolith::quant {
namespace {

constexpr int kMaxGroup = 256;

struct Sums {
  float lx = 0;  // Σ w·x·l
  float l2 = 0;  // Σ w·l²
  // The error of the least-squares scale is Σwx² − lx²/l2, so a larger lx²/l2 is better.
  bool better_than(const Sums& o) const { return l2 > 0 && lx * lx * o.l2 > o.lx * o.lx * l2; }
};

Sums codes_for(int n, int lo, int hi, const float* x, const float* w, float iscale, int8_t* L) {
  Sums s;
  for (int i = 0; i < n; ++i) {
    int l = clamp_int(nearest_int(iscale * x[i]), lo, hi);
    L[i] = static_cast<int8_t>(l);
    s.lx += w[i] * x[i] * l;
    s.l2 += w[i] * l * l;
  }
  return s;
}

// Coordinate descent: move one code at a time to the value the current least-squares scale
// asks for, keeping the move when the fit improves.
void refine_codes(int n, int lo, int hi, const float* x, const float* w, int8_t* L, Sums& s) {
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      if (w[i] <= 0) continue;
      float lx = s.lx - w[i] * x[i] * L[i];
      float l2 = s.l2 - w[i] * L[i] * L[i];
      if (lx == 0 || l2 <= 0) continue;
      int l = clamp_int(nearest_int(x[i] * l2 / lx), lo, hi);
      if (l == L[i]) continue;
      Sums t{lx + w[i] * x[i] * l, l2 + w[i] * l * l};
      if (t.better_than(s)) {
        L[i] = static_cast<int8_t>(l);
        s = t;
        ++changed;
      }
    }
    if (!changed) break;
  }
}

float best_of_scales(int n, int lo, int hi, const float* x, const float* w, int8_t* L, const float* iscales,
                     int count) {
  int8_t trial[kMaxGroup];
  Sums best{0, 1};
  bool have = false;
  for (int c = 0; c < count; ++c) {
    Sums s = codes_for(n, lo, hi, x, w, iscales[c], trial);
    if (!have || s.better_than(best)) {
      if (s.l2 <= 0) continue;
      best = s;
      have = true;
      std::memcpy(L, trial, n);
    }
  }
  if (!have) {
    std::memset(L, 0, n);
    return 0;
  }
  refine_codes(n, lo, hi, x, w, L, best);
  return best.l2 > 0 ? best.lx / best.l2 : 0.0f;
}

struct Moments {
  float w = 0, x = 0, l = 0, l2 = 0, xl = 0;
};

Moments moments(int n, const float* x, const float* w, const uint8_t* L) {
  Moments m;
  for (int i = 0; i < n; ++i) {
    m.w += w[i];
    m.x += w[i] * x[i];
    m.l += w[i] * L[i];
    m.l2 += w[i] * L[i] * L[i];
    m.xl += w[i] * L[i] * x[i];
  }
  return m;
}

// Least-squares scale and offset for fixed codes; false when the codes cannot determine them.
bool solve_affine(const Moments& m, bool offset_nonpositive, AffineFit& f) {
  float det = m.w * m.l2 - m.l * m.l;
  if (!(det > 0)) return false;
  f.scale = (m.w * m.xl - m.x * m.l) / det;
  f.offset = (m.l2 * m.x - m.l * m.xl) / det;
  if (offset_nonpositive && f.offset > 0) {
    f.offset = 0;
    f.scale = m.l2 > 0 ? m.xl / m.l2 : 0;
  }
  return f.scale > 0;
}

void affine_codes(int n, int nmax, const float* x, float iscale, float origin, uint8_t* L) {
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(clamp_int(nearest_int(iscale * (x[i] - origin)), 0, nmax));
}

}  // namespace

float fit_scale(int n, int lo, int hi, const float* x, const float* w, int8_t* L, int spread) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    if (a > amax) {
      amax = a;
      max = x[i];
    }
  }
  if (!(amax >= 1e-15f)) {
    std::memset(L, 0, n);
    return 0;
  }
  float iscales[2 * (2 * 16 + 1)];
  int count = 0;
  spread = std::min(spread, 16);
  for (int k = -spread; k <= spread; ++k) {
    iscales[count++] = (lo - 0.1f * k) / max;  // the largest magnitude lands near the low end
    iscales[count++] = (hi + 0.1f * k) / max;  // ... or near the high end
  }
  return best_of_scales(n, lo, hi, x, w, L, iscales, count);
}

float fit_unsigned_codes(int n, int nmax, const float* v, const float* w, uint8_t* L) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = std::max(max, v[i]);
  if (!(max >= 1e-15f)) {
    std::memset(L, 0, n);
    return 0;
  }
  float iscales[17];
  int count = 0;
  for (int k = -8; k <= 8; ++k) iscales[count++] = (nmax + 0.1f * k) / max;
  int8_t codes[kMaxGroup];
  // Values are non-negative, so the codes stay in [0, nmax] and fit int8 for nmax ≤ 127.
  float d = best_of_scales(n, 0, nmax, v, w, codes, iscales, count);
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(codes[i]);
  return d;
}

float affine_error(int n, const float* x, const float* w, const uint8_t* L, float scale, float offset) {
  float err = 0;
  for (int i = 0; i < n; ++i) {
    float diff = scale * L[i] + offset - x[i];
    err += w[i] * diff * diff;
  }
  return err;
}

AffineFit fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* L, bool offset_nonpositive,
                     float r_lo, float r_hi, float r_step) {
  float min = x[0], max = x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
  }
  if (offset_nonpositive && min > 0) min = 0;
  if (!(max > min)) {
    std::memset(L, 0, n);
    return {0, min};
  }
  // Start from the plain min/max mapping, then try stretched and shrunk scales.
  AffineFit best{(max - min) / nmax, min};
  affine_codes(n, nmax, x, nmax / (max - min), min, L);
  float best_err = affine_error(n, x, w, L, best.scale, best.offset);
  uint8_t trial[kMaxGroup];
  int steps = static_cast<int>(std::lround((r_hi - r_lo) / r_step));
  for (int k = 0; k <= steps; ++k) {
    float iscale = (nmax + r_lo + r_step * k) / (max - min);
    affine_codes(n, nmax, x, iscale, min, trial);
    AffineFit f;
    if (!solve_affine(moments(n, x, w, trial), offset_nonpositive, f)) continue;
    float err = affine_error(n, x, w, trial, f.scale, f.offset);
    if (err < best_err) {
      best_err = err;
      best = f;
      std::memcpy(L, trial, n);
    }
  }
  // Lloyd polish: re-assign codes for the fitted scale and offset, refit, while it helps.
  for (int it = 0; it < 3 && best.scale > 0; ++it) {
    affine_codes(n, nmax, x, 1.0f / best.scale, best.offset, trial);
    AffineFit f;
    if (!solve_affine(moments(n, x, w, trial), offset_nonpositive, f)) break;
    float err = affine_error(n, x, w, trial, f.scale, f.offset);
    if (!(err < best_err)) break;
    best_err = err;
    best = f;
    std::memcpy(L, trial, n);
  }
  return best;
}

}  // namespace regolith::quant
