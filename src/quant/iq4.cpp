// IQ4_NL (32-value blocks, fp16 scale) and IQ4_XS (256-value super-blocks of eight 32-value
// blocks with 6-bit scales): 4-bit codes into the fixed non-uniform table kIq4NlValues.
// Dequantization follows ggml's expressions exactly. The quantizer searches block scales over
// both signs of the table (its ends are −127 and +113), polishes by re-assigning codes, and
// for IQ4_XS moves each 6-bit scale by ±1 where that lowers the error.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/fit.h"
#include "quant/formats.h"
#include "quant/iq_grids.h"

namespace regolith::quant {
namespace {

constexpr int kBlock = 32;

// Index of the table value nearest to v. The midpoints between table values are multiples of
// 1/2, so a table over half-unit cells of [-128, 128) answers exactly (ties go up).
struct NearestTable {
  int8_t index[512];
};

constexpr NearestTable make_nearest_table() {
  NearestTable t{};
  for (int k = 0; k < 512; ++k) {
    const float centre = (k - 256) * 0.5f + 0.25f;
    int best = 0;
    for (int i = 1; i < 16; ++i) {
      float di = centre - kIq4NlValues[i], db = centre - kIq4NlValues[best];
      if (di * di < db * db) best = i;
    }
    t.index[k] = static_cast<int8_t>(best);
  }
  return t;
}

constexpr NearestTable kNearest = make_nearest_table();

inline int nearest_value(float v) {
  const float c = 2.0f * v + 256.0f;
  const int k = c <= 0.0f ? 0 : c >= 511.0f ? 511 : static_cast<int>(c);
  return kNearest.index[k];
}

// Codes for the stored scale d and their weighted error.
float codes_for_scale(const float* x, const float* w, float d, uint8_t* L) {
  float id = d != 0 ? 1.0f / d : 0.0f;
  float err = 0;
  for (int i = 0; i < kBlock; ++i) {
    int l = nearest_value(id * x[i]);
    L[i] = static_cast<uint8_t>(l);
    float diff = d * kIq4NlValues[l] - x[i];
    err += w[i] * diff * diff;
  }
  return err;
}

// Least-squares scale for one block: x ≈ d·table[L].
float fit_block(const float* x, const float* w) {
  float amax = 0, max = 0;
  for (int i = 0; i < kBlock; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (!(amax >= 1e-15f)) return 0;
  auto score = [&](float id, float& d) {
    float sqx = 0, sq2 = 0;
    for (int i = 0; i < kBlock; ++i) {
      float q = kIq4NlValues[nearest_value(id * x[i])];
      sqx += w[i] * q * x[i];
      sq2 += w[i] * q * q;
    }
    d = sq2 > 0 ? sqx / sq2 : 0;
    return sq2 > 0 ? sqx * sqx / sq2 : -1.0f;
  };
  float best_d = 0, best = -1;
  auto consider = [&](float id) {
    float d;
    float s = score(id, d);
    if (s > best) {
      best = s;
      best_d = d;
    }
  };
  consider(127.0f / max);  // ggml's first guess
  for (int t = -8; t <= 8; ++t) {
    consider((kIq4NlValues[0] + t) / max);
    consider((kIq4NlValues[15] + t) / max);
  }
  for (int it = 0; it < 3 && best_d != 0; ++it) {
    float before = best;
    consider(1.0f / best_d);
    if (!(best > before)) break;
  }
  return best_d;
}

// Objective weights: the importance itself when given (the expected squared error of the dot
// products); otherwise √(σ² + x²), σ² twice the mean square over `span` values (ggml's x² there
// costs plain RMSE).
void block_weights(const float* x, const float* importance, int span, float* w, int n) {
  float sigma2 = 2.0f * sum_squares(x, span) / span;
  for (int i = 0; i < n; ++i) w[i] = importance ? importance[i] : std::sqrt(sigma2 + x[i] * x[i]);
}

void pack_nibbles(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
}

uint16_t f16_step(uint16_t h, int dir) { return static_cast<uint16_t>(h + dir); }

}  // namespace

void dequantize_iq4_nl(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockIq4Nl*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * kIq4NlValues[b[i].qs[j] & 0xf];
      y[j + 16] = d * kIq4NlValues[b[i].qs[j] >> 4];
    }
  }
}

void quantize_iq4_nl(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockIq4Nl*>(out);
  for (int64_t i = 0; i < n / kBlock; ++i) {
    const float* xb = x + i * kBlock;
    float w[kBlock];
    block_weights(xb, importance ? importance + i * kBlock : nullptr, kBlock, w, kBlock);
    float d = fit_block(xb, w);
    // The fitted scale and its two fp16 neighbours; codes are re-assigned for each.
    uint16_t h = f32_to_f16(d);
    uint8_t L[kBlock] = {}, trial[kBlock];
    float best_err = INFINITY;
    uint16_t best_h = h;
    for (int dir = -1; dir <= 1; ++dir) {
      uint16_t c = dir == 0 || (h & 0x7fff) == 0 ? h : f16_step(h, dir);
      if (dir != 0 && (c == h || (c & 0x7c00) == 0x7c00)) continue;
      float err = codes_for_scale(xb, w, f16_to_f32(c), trial);
      if (err < best_err) {
        best_err = err;
        best_h = c;
        std::memcpy(L, trial, kBlock);
      }
    }
    b[i].d = best_h;
    pack_nibbles(L, b[i].qs);
  }
}

void dequantize_iq4_xs(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockIq4Xs*>(in);
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < 8; ++ib, y += 32, qs += 16) {
      const int ls = ((b[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((b[i].scales_h >> 2 * ib) & 3) << 4);
      const float dl = d * (ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * kIq4NlValues[qs[j] & 0xf];
        y[j + 16] = dl * kIq4NlValues[qs[j] >> 4];
      }
    }
  }
}

void quantize_iq4_xs(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockIq4Xs*>(out);
  for (int64_t i = 0; i < n / kSuperBlock; ++i) {
    const float* xs = x + i * kSuperBlock;
    float w[kSuperBlock], scales[8], sw[8];
    block_weights(xs, importance ? importance + i * kSuperBlock : nullptr, kSuperBlock, w, kSuperBlock);
    float amax = 0, max_scale = 0;
    for (int ib = 0; ib < 8; ++ib) {
      scales[ib] = fit_block(xs + 32 * ib, w + 32 * ib);
      sw[ib] = 0;
      for (int j = 0; j < 32; ++j) sw[ib] += w[32 * ib + j];
      if (std::fabs(scales[ib]) > amax) {
        amax = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    int8_t codes[8];
    float candidates[2] = {-max_scale / 32, fit_scale(8, -32, 31, scales, sw, codes)};
    float best_total = INFINITY;
    uint8_t best_L[kSuperBlock] = {}, L[kSuperBlock] = {}, trial[32];
    int best_ls[8] = {};
    float best_d = 0;
    for (float c : candidates) {
      float d = fp16_round(c);
      float total = 0;
      int ls[8];
      for (int ib = 0; ib < 8 && total < best_total; ++ib) {
        int l0 = d != 0 ? clamp_int(nearest_int(scales[ib] / d), -32, 31) : 0;
        float best = INFINITY;
        for (int l = std::max(-32, l0 - 1); l <= std::min(31, l0 + 1); ++l) {
          float err = codes_for_scale(xs + 32 * ib, w + 32 * ib, d * l, trial);
          if (err < best) {
            best = err;
            ls[ib] = l;
            std::memcpy(L + 32 * ib, trial, 32);
          }
        }
        total += best;
      }
      if (total < best_total) {
        best_total = total;
        best_d = d;
        std::memcpy(best_ls, ls, sizeof ls);
        std::memcpy(best_L, L, kSuperBlock);
      }
    }
    b[i].d = f32_to_f16(best_d);
    b[i].scales_h = 0;
    std::memset(b[i].scales_l, 0, 4);
    for (int ib = 0; ib < 8; ++ib) {
      int l = best_ls[ib] + 32;
      b[i].scales_l[ib / 2] |= static_cast<uint8_t>((l & 0xf) << 4 * (ib % 2));
      b[i].scales_h |= static_cast<uint16_t>((l >> 4) << 2 * ib);
      pack_nibbles(best_L + 32 * ib, b[i].qs + 16 * ib);
    }
  }
}

}  // namespace regolith::quant
