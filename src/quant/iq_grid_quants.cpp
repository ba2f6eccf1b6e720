// Grid I-quants: IQ2_XXS, IQ2_XS, IQ2_S (groups of 8 magnitudes from a 256/512/1024-point
// grid) and IQ3_XXS, IQ3_S (groups of 4 from a 256/512-point grid), with per-value sign bits
// and 4-bit block scales under an fp16 super-block scale. Dequantization follows ggml's
// expressions exactly.
//
// The quantizer differs from ggml's in three ways that only lower the error: it scores grid
// points by their true magnitudes (ggml assumes evenly spaced levels, but the grids' levels are
// 8/25/43 and 4…52/62), it searches the nearest grid points of every cell rather than only of
// off-grid cells, and after the super-block scale is fixed it re-codes every block at its final
// 4-bit scale (trying the two neighbouring scale codes too) instead of keeping the codes chosen
// for the unquantized scale. With an importance matrix it minimizes the importance-weighted error
// itself, where ggml multiplies the importance by √(σ² + x²).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/fit.h"
#include "quant/formats.h"
#include "quant/iq_grids.h"
#include "quant/iq_lattice.h"

namespace regolith::quant {
namespace {

constexpr int QK = kSuperBlock;

struct IqSpec {
  IqLattice::Kind kind;
  int block;                     // values per 4-bit block scale
  bool parity;                   // 7 stored sign bits per 8 values, the 8th implied
  float (*block_scale)(float d, int code);  // ggml's dequantization scale, same float order
  float fudge;                   // ggml's factor on the super-block scale, tried as a candidate
  float sigma;                   // weights without importance: √(σ·mean(x²) + x²)
};

float scale_iq2(float d, int l) { return d * (0.5f + l) * 0.25f; }
float scale_iq3_xxs(float d, int l) { return d * (0.5f + l) * 0.5f; }
float scale_iq3_s(float d, int l) { return d * (1 + 2 * l); }

// Coded super-block before packing.
struct IqCode {
  uint16_t d = 0;
  uint8_t scale[16] = {};   // 4-bit code per block
  uint16_t point[64] = {};  // grid index per group
  uint8_t signs[32] = {};   // 8 sign bits per 8 values (parity-consistent where required)
};

// Best grid points for one block at scale s; returns the weighted error.
float assign_block(const IqLattice& lat, const float* xv, const float* w, int n, float s, uint16_t* points) {
  float total = 0;
  for (int g = 0; g < n / lat.dim(); ++g) {
    float err;
    points[g] = static_cast<uint16_t>(lat.best_point(xv + g * lat.dim(), w + g * lat.dim(), s, err));
    total += err;
  }
  return total;
}

// Least-squares block scale for the given points, and its fit score (Σwxg)²/Σwg².
float block_ls(const IqLattice& lat, const float* xv, const float* w, int n, const uint16_t* points, float& score) {
  float sxg = 0, sg2 = 0;
  for (int g = 0; g < n / lat.dim(); ++g) {
    const float* p = lat.point(points[g]);
    for (int i = 0; i < lat.dim(); ++i) {
      const float wi = w[g * lat.dim() + i];
      sxg += wi * xv[g * lat.dim() + i] * p[i];
      sg2 += wi * p[i] * p[i];
    }
  }
  score = sxg > 0 && sg2 > 0 ? sxg * sxg / sg2 : 0;
  return sxg > 0 && sg2 > 0 ? sxg / sg2 : 0;
}

// Continuous scale of one block: trial scales around "max maps to the top level", keep the best
// least-squares fit, then re-assign at the fitted scale while that helps.
float fit_block(const IqLattice& lat, const float* xv, const float* w, int n) {
  float max = 0;
  for (int i = 0; i < n; ++i) max = std::max(max, xv[i]);
  if (!(max >= 1e-15f)) return 0;
  uint16_t points[8];
  float best_score = 0, best_s = 0;
  for (int k = -7; k <= 7; ++k) {
    float s = max / (lat.top_level() * (1.0f + 0.03f * k));
    assign_block(lat, xv, w, n, s, points);
    float score;
    float fitted = block_ls(lat, xv, w, n, points, score);
    if (score > best_score) {
      best_score = score;
      best_s = fitted;
    }
  }
  for (int it = 0; it < 2 && best_s > 0; ++it) {
    assign_block(lat, xv, w, n, best_s, points);
    float score;
    float fitted = block_ls(lat, xv, w, n, points, score);
    if (!(score > best_score)) break;
    best_score = score;
    best_s = fitted;
  }
  return best_s;
}

// Signs and magnitudes of a super-block. Where only 7 sign bits are stored, a group of 8 with an
// odd number of negatives keeps the sign of its least important value wrong: that value's
// magnitude becomes negative, which the fit then accounts for.
void split_signs(const IqSpec& spec, const float* x, const float* w, float* xv, uint8_t* signs) {
  for (int g = 0; g < QK / 8; ++g) {
    uint8_t s = 0;
    for (int i = 0; i < 8; ++i) {
      const float v = x[8 * g + i];
      xv[8 * g + i] = std::fabs(v);
      if (v < 0) s |= static_cast<uint8_t>(1 << i);
    }
    if (spec.parity && (std::popcount(static_cast<unsigned>(s)) & 1)) {
      int imin = 0;
      float min = INFINITY;
      for (int i = 0; i < 8; ++i) {
        const float c = w[8 * g + i] * x[8 * g + i] * x[8 * g + i];
        if (c < min) {
          min = c;
          imin = i;
        }
      }
      xv[8 * g + imin] = -xv[8 * g + imin];
      s ^= static_cast<uint8_t>(1 << imin);
    }
    signs[g] = s;
  }
}

void quantize_superblock(const IqSpec& spec, const float* x, const float* w, IqCode& code) {
  const IqLattice& lat = IqLattice::get(spec.kind);
  const int n_blocks = QK / spec.block;
  const int groups = spec.block / lat.dim();
  float xv[QK];
  split_signs(spec, x, w, xv, code.signs);
  float scales[16], max_s = 0;
  for (int b = 0; b < n_blocks; ++b) {
    scales[b] = fit_block(lat, xv + b * spec.block, w + b * spec.block, spec.block);
    max_s = std::max(max_s, scales[b]);
  }
  if (max_s == 0) {
    code.d = 0;
    std::memset(code.scale, 0, sizeof code.scale);
    std::memset(code.point, 0, sizeof code.point);
    std::memset(code.signs, 0, sizeof code.signs);
    return;
  }
  const float unit = spec.block_scale(1.0f, 0);
  const float base = max_s / (31 * unit);
  const float factors[4] = {1.0f, 0.98f, 1.02f, spec.fudge};
  float best_total = INFINITY;
  uint16_t points[64], trial[8];
  for (int f = 0; f < (spec.fudge != 1.0f ? 4 : 3); ++f) {
    const float d = fp16_round(base * factors[f]);
    if (!(d > 0)) continue;
    float total = 0;
    uint8_t sc[16];
    for (int b = 0; b < n_blocks && total < best_total; ++b) {
      int l0 = clamp_int(nearest_int(0.5f * (scales[b] / (d * unit) - 1)), 0, 15);
      float best = INFINITY;
      for (int l = std::max(0, l0 - 1); l <= std::min(15, l0 + 1); ++l) {
        float err = assign_block(lat, xv + b * spec.block, w + b * spec.block, spec.block, spec.block_scale(d, l), trial);
        if (err < best) {
          best = err;
          sc[b] = static_cast<uint8_t>(l);
          std::memcpy(points + b * groups, trial, groups * sizeof(uint16_t));
        }
      }
      total += best;
    }
    if (total < best_total) {
      best_total = total;
      code.d = f32_to_f16(d);
      std::memcpy(code.scale, sc, n_blocks);
      std::memcpy(code.point, points, (QK / lat.dim()) * sizeof(uint16_t));
    }
  }
}

// Objective weights of one super-block: the importance itself when given (the expected squared
// error of the dot products); otherwise √(σ·mean(x²) + x²), which leans towards the larger
// values (ggml's x² there costs plain RMSE).
void iq_weights(const IqSpec& spec, const float* x, const float* importance, float* w) {
  const float mean2 = sum_squares(x, QK) / QK;
  for (int i = 0; i < QK; ++i) w[i] = importance ? importance[i] : std::sqrt(spec.sigma * mean2 + x[i] * x[i]);
}

template <typename Pack>
void quantize_rows(const IqSpec& spec, const float* x, int64_t n, const float* importance, Pack pack) {
  float w[QK];
  IqCode code;
  for (int64_t i = 0; i < n / QK; ++i) {
    iq_weights(spec, x + i * QK, importance ? importance + i * QK : nullptr, w);
    quantize_superblock(spec, x + i * QK, w, code);
    pack(i, code);
  }
}

// ggml sets magnitudes' signs by multiplying with ±1.0f; negating is the same operation.
inline float signed_value(float v, bool negative) { return negative ? -v : v; }

const uint8_t* grid_bytes(const uint64_t* grid, int index) { return reinterpret_cast<const uint8_t*>(grid + index); }
const uint8_t* grid_bytes(const uint32_t* grid, int index) { return reinterpret_cast<const uint8_t*>(grid + index); }

const IqSpec kIq2Xxs{IqLattice::Kind::iq2_xxs, 32, true, scale_iq2, 1.0f, 1.0f};
const IqSpec kIq2Xs{IqLattice::Kind::iq2_xs, 16, true, scale_iq2, 1.0f, 1.0f};
const IqSpec kIq2S{IqLattice::Kind::iq2_s, 16, false, scale_iq2, 0.9875f, 2.0f};
const IqSpec kIq3Xxs{IqLattice::Kind::iq3_xxs, 32, true, scale_iq3_xxs, 1.0125f, 2.0f};
const IqSpec kIq3S{IqLattice::Kind::iq3_s, 32, false, scale_iq3_s, 1.033f, 2.0f};

}  // namespace

// ---- IQ2_XXS: per 32 values two words: 4 grid bytes; 4 × 7 sign bits | scale << 28 ----------

void dequantize_iq2_xxs(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockIq2Xxs*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t aux[2];
      std::memcpy(aux, b[i].qs + 4 * ib, 8);
      const float db = d * (0.5f + (aux[1] >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* grid = grid_bytes(kIq2XxsGrid, (aux[0] >> (8 * l)) & 255);
        const uint8_t signs = signs_from_seven(aux[1] >> (7 * l));
        for (int j = 0; j < 8; ++j) y[j] = signed_value(db * grid[j], signs & (1 << j));
      }
    }
  }
}

void quantize_iq2_xxs(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockIq2Xxs*>(out);
  quantize_rows(kIq2Xxs, x, n, importance, [&](int64_t i, const IqCode& c) {
    b[i].d = c.d;
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t aux[2] = {0, static_cast<uint32_t>(c.scale[ib]) << 28};
      for (int k = 0; k < 4; ++k) {
        aux[0] |= static_cast<uint32_t>(c.point[4 * ib + k]) << (8 * k);
        aux[1] |= static_cast<uint32_t>(c.signs[4 * ib + k] & 127) << (7 * k);
      }
      std::memcpy(b[i].qs + 4 * ib, aux, 8);
    }
  });
}

// ---- IQ2_XS: per 8 values a 16-bit word: 9-bit grid index | 7 sign bits << 9 ------------------

void dequantize_iq2_xs(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockIq2Xs*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int ib = 0; ib < 8; ++ib) {
      const float db[2] = {d * (0.5f + (b[i].scales[ib] & 0xf)) * 0.25f, d * (0.5f + (b[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t q = b[i].qs[4 * ib + l];
        const uint8_t* grid = grid_bytes(kIq2XsGrid, q & 511);
        const uint8_t signs = signs_from_seven(q >> 9);
        for (int j = 0; j < 8; ++j) y[j] = signed_value(db[l / 2] * grid[j], signs & (1 << j));
      }
    }
  }
}

void quantize_iq2_xs(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockIq2Xs*>(out);
  quantize_rows(kIq2Xs, x, n, importance, [&](int64_t i, const IqCode& c) {
    b[i].d = c.d;
    for (int g = 0; g < 32; ++g) b[i].qs[g] = static_cast<uint16_t>(c.point[g] | ((c.signs[g] & 127) << 9));
    for (int ib = 0; ib < 8; ++ib) b[i].scales[ib] = static_cast<uint8_t>(c.scale[2 * ib] | (c.scale[2 * ib + 1] << 4));
  });
}

// ---- IQ2_S: 10-bit grid index (low byte in qs, high bits in qh), full sign bytes ---------------

void dequantize_iq2_s(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockIq2S*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* qs = b[i].qs;
    const uint8_t* signs = b[i].qs + QK / 8;
    for (int ib = 0; ib < 8; ++ib, qs += 4, signs += 4) {
      const float db[2] = {d * (0.5f + (b[i].scales[ib] & 0xf)) * 0.25f, d * (0.5f + (b[i].scales[ib] >> 4)) * 0.25f};
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* grid = grid_bytes(kIq2SGrid, qs[l] | ((b[i].qh[ib] << (8 - 2 * l)) & 0x300));
        for (int j = 0; j < 8; ++j) y[j] = signed_value(db[l / 2] * grid[j], signs[l] & (1 << j));
      }
    }
  }
}

void quantize_iq2_s(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockIq2S*>(out);
  quantize_rows(kIq2S, x, n, importance, [&](int64_t i, const IqCode& c) {
    std::memset(&b[i], 0, sizeof b[i]);
    b[i].d = c.d;
    for (int g = 0; g < 32; ++g) {
      b[i].qs[g] = static_cast<uint8_t>(c.point[g] & 255);
      b[i].qh[g / 4] |= static_cast<uint8_t>((c.point[g] >> 8) << (2 * (g % 4)));
      b[i].qs[QK / 8 + g] = c.signs[g];
    }
    for (int ib = 0; ib < 8; ++ib) b[i].scales[ib] = static_cast<uint8_t>(c.scale[2 * ib] | (c.scale[2 * ib + 1] << 4));
  });
}

// ---- IQ3_XXS: 64 grid bytes, then per 32 values a word of 4 × 7 sign bits | scale << 28 --------

void dequantize_iq3_xxs(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockIq3Xxs*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < 8; ++ib, qs += 8) {
      uint32_t aux;
      std::memcpy(&aux, b[i].qs + QK / 4 + 4 * ib, 4);
      const float db = d * (0.5f + (aux >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = signs_from_seven(aux >> (7 * l));
        const uint8_t* g1 = grid_bytes(kIq3XxsGrid, qs[2 * l]);
        const uint8_t* g2 = grid_bytes(kIq3XxsGrid, qs[2 * l + 1]);
        for (int j = 0; j < 4; ++j) {
          y[j] = signed_value(db * g1[j], signs & (1 << j));
          y[j + 4] = signed_value(db * g2[j], signs & (1 << (j + 4)));
        }
      }
    }
  }
}

void quantize_iq3_xxs(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockIq3Xxs*>(out);
  quantize_rows(kIq3Xxs, x, n, importance, [&](int64_t i, const IqCode& c) {
    b[i].d = c.d;
    for (int g = 0; g < 64; ++g) b[i].qs[g] = static_cast<uint8_t>(c.point[g]);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t aux = static_cast<uint32_t>(c.scale[ib]) << 28;
      for (int k = 0; k < 4; ++k) aux |= static_cast<uint32_t>(c.signs[4 * ib + k] & 127) << (7 * k);
      std::memcpy(b[i].qs + QK / 4 + 4 * ib, &aux, 4);
    }
  });
}

// ---- IQ3_S: 9-bit grid index (low byte in qs, bit 8 in qh), full sign bytes -------------------

void dequantize_iq3_s(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockIq3S*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* qs = b[i].qs;
    const uint8_t* signs = b[i].signs;
    for (int ib = 0; ib < 8; ++ib, qs += 8, signs += 4) {
      const float db = d * (1 + 2 * ((b[i].scales[ib / 2] >> (4 * (ib % 2))) & 0xf));
      const uint8_t qh = b[i].qh[ib];
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* g1 = grid_bytes(kIq3SGrid, qs[2 * l] | ((qh << (8 - 2 * l)) & 256));
        const uint8_t* g2 = grid_bytes(kIq3SGrid, qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256));
        for (int j = 0; j < 4; ++j) {
          y[j] = signed_value(db * g1[j], signs[l] & (1 << j));
          y[j + 4] = signed_value(db * g2[j], signs[l] & (1 << (j + 4)));
        }
      }
    }
  }
}

void quantize_iq3_s(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockIq3S*>(out);
  quantize_rows(kIq3S, x, n, importance, [&](int64_t i, const IqCode& c) {
    std::memset(&b[i], 0, sizeof b[i]);
    b[i].d = c.d;
    for (int g = 0; g < 64; ++g) {
      b[i].qs[g] = static_cast<uint8_t>(c.point[g] & 255);
      b[i].qh[g / 8] |= static_cast<uint8_t>((c.point[g] >> 8) << (g % 8));
    }
    std::memcpy(b[i].signs, c.signs, 32);
    for (int ib = 0; ib < 8; ib += 2) b[i].scales[ib / 2] = static_cast<uint8_t>(c.scale[ib] | (c.scale[ib + 1] << 4));
  });
}

}  // namespace regolith::quant
