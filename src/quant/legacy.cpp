// The 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, MXFP4) and the 64-value
// Q2_0. Dequantization evaluates exactly ggml's expressions in ggml's order, so results are
// bit-identical. Quantizers search scales by weighted least squares and keep ggml's own
// max-based choice as one candidate, so their error is never above it for the same weights.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/fit.h"
#include "quant/formats.h"
#include "quant/iq_grids.h"

namespace regolith::quant {
namespace {

constexpr int kBlock = 32;

// Objective weights for one row: the importance itself (the mean squared activation of each
// column, so the weighted error is the expected squared error of the row's dot products), or
// uniform without one. ggml multiplies the importance by √(σ² + x²) here; on heavy-tailed rows
// that costs importance-weighted error (Q4_1: up to 1% worse than plain importance).
void row_weights(const float* importance, int64_t n, float* w) {
  if (importance)
    std::copy(importance, importance + n, w);
  else
    std::fill(w, w + n, 1.0f);
}

float signed_absmax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  return max;
}

// Codes in [lo, hi] for a stored (fp16-rounded) scale d and their weighted error.
float symmetric_codes(const float* x, const float* w, int n, float d, int lo, int hi, int8_t* L) {
  float id = d != 0 ? 1.0f / d : 0.0f;
  float err = 0;
  for (int i = 0; i < n; ++i) {
    int l = clamp_int(nearest_int(x[i] * id), lo, hi);
    L[i] = static_cast<int8_t>(l);
    float diff = l * d - x[i];
    err += w[i] * diff * diff;
  }
  return err;
}

// Best fp16 scale among a least-squares fit and ggml's reference choice d = max/ref_divisor.
float pick_symmetric(const float* x, const float* w, int n, int lo, int hi, float ref_divisor, int8_t* L) {
  int8_t trial[64];
  std::memset(L, 0, n);
  float candidates[2] = {signed_absmax(x, n) / ref_divisor, fit_scale(n, lo, hi, x, w, trial)};
  float best_d = 0, best_err = INFINITY;
  for (float c : candidates) {
    float d = fp16_round(c);
    float err = symmetric_codes(x, w, n, d, lo, hi, trial);
    if (err < best_err) {
      best_err = err;
      best_d = d;
      std::memcpy(L, trial, n);
    }
  }
  return best_d;
}

float affine_codes_error(const float* x, const float* w, int n, float d, float m, int nmax, uint8_t* L) {
  float id = d != 0 ? 1.0f / d : 0.0f;
  float err = 0;
  for (int i = 0; i < n; ++i) {
    int l = clamp_int(nearest_int((x[i] - m) * id), 0, nmax);
    L[i] = static_cast<uint8_t>(l);
    float diff = l * d + m - x[i];
    err += w[i] * diff * diff;
  }
  return err;
}

// The fp16 values one step below and above h (h itself where a step would leave the finite range).
float f16_neighbour(float v, int dir) {
  uint16_t h = f32_to_f16(v);
  if (dir == 0 || (h & 0x7fff) == 0) return v;
  uint16_t n = static_cast<uint16_t>(h + ((h & 0x8000) ? -dir : dir));
  return (n & 0x7c00) == 0x7c00 ? v : f16_to_f32(n);
}

// Scale and offset (stored fp16) for x ≈ d·q + m, q in [0, nmax]: the better of a weighted
// least-squares fit and ggml's min/max mapping, then the fp16 neighbours of the winner.
void pick_affine(const float* x, const float* w, int n, int nmax, uint8_t* L, float& d, float& m) {
  float min = *std::min_element(x, x + n), max = *std::max_element(x, x + n);
  uint8_t trial[kBlock];
  std::memset(L, 0, n);
  d = m = 0;
  AffineFit fit = fit_affine(n, nmax, x, w, trial, false);
  AffineFit candidates[2] = {{(max - min) / nmax, min}, fit};
  float best_err = INFINITY;
  auto consider = [&](float cd, float cm) {
    float err = affine_codes_error(x, w, n, cd, cm, nmax, trial);
    if (err < best_err) {
      best_err = err;
      d = cd;
      m = cm;
      std::memcpy(L, trial, n);
    }
  };
  for (const AffineFit& c : candidates) consider(fp16_round(c.scale), fp16_round(c.offset));
  const float d0 = d, m0 = m;
  for (int i = -1; i <= 1; ++i)
    for (int j = -1; j <= 1; ++j)
      if (i || j) consider(f16_neighbour(d0, i), f16_neighbour(m0, j));
}

void store_f16(uint16_t& field, float v) { field = f32_to_f16(v); }

// Q5 formats keep the fifth bit of value j in bit j of a 32-bit word.
void pack_q5(const int* q, uint8_t* qs, uint8_t* qh_bytes) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

float e8m0_to_f32_half(uint8_t e) {
  uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  return std::bit_cast<float>(bits);
}

void dequantize_q4_0(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ4_0*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[j] = ((b[i].qs[j] & 0x0F) - 8) * d;
      y[j + 16] = ((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void quantize_q4_0(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ4_0*>(out);
  std::vector<float> w(n);
  row_weights(importance, n, w.data());
  for (int64_t i = 0; i < n / kBlock; ++i) {
    int8_t L[kBlock];
    float d = pick_symmetric(x + i * kBlock, w.data() + i * kBlock, kBlock, -8, 7, -8.0f, L);
    store_f16(b[i].d, d);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = static_cast<uint8_t>((L[j] + 8) | ((L[j + 16] + 8) << 4));
  }
}

void dequantize_q4_1(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ4_1*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[j] = (b[i].qs[j] & 0x0F) * d + m;
      y[j + 16] = (b[i].qs[j] >> 4) * d + m;
    }
  }
}

void quantize_q4_1(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ4_1*>(out);
  std::vector<float> w(n);
  row_weights(importance, n, w.data());
  for (int64_t i = 0; i < n / kBlock; ++i) {
    uint8_t L[kBlock];
    float d, m;
    pick_affine(x + i * kBlock, w.data() + i * kBlock, kBlock, 15, L, d, m);
    store_f16(b[i].d, d);
    store_f16(b[i].m, m);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

void dequantize_q5_0(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ5_0*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int x0 = ((b[i].qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) - 16;
      const int x1 = ((b[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) - 16;
      y[j] = x0 * d;
      y[j + 16] = x1 * d;
    }
  }
}

void quantize_q5_0(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ5_0*>(out);
  std::vector<float> w(n);
  row_weights(importance, n, w.data());
  for (int64_t i = 0; i < n / kBlock; ++i) {
    int8_t L[kBlock];
    float d = pick_symmetric(x + i * kBlock, w.data() + i * kBlock, kBlock, -16, 15, -16.0f, L);
    store_f16(b[i].d, d);
    int q[kBlock];
    for (int j = 0; j < kBlock; ++j) q[j] = L[j] + 16;
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

void dequantize_q5_1(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ5_1*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int x0 = (b[i].qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10);
      const int x1 = (b[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
      y[j] = x0 * d + m;
      y[j + 16] = x1 * d + m;
    }
  }
}

void quantize_q5_1(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ5_1*>(out);
  std::vector<float> w(n);
  row_weights(importance, n, w.data());
  for (int64_t i = 0; i < n / kBlock; ++i) {
    uint8_t L[kBlock];
    float d, m;
    pick_affine(x + i * kBlock, w.data() + i * kBlock, kBlock, 31, L, d, m);
    store_f16(b[i].d, d);
    store_f16(b[i].m, m);
    int q[kBlock];
    for (int j = 0; j < kBlock; ++j) q[j] = L[j];
    pack_q5(q, b[i].qs, b[i].qh);
  }
}

void dequantize_q8_0(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ8_0*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kBlock; ++j) y[j] = b[i].qs[j] * d;
  }
}

// Q8_0 stays ggml's amax/127 rounding (its error is already far below every other format's,
// and activations quantized this way match ggml's byte for byte); importance is not used.
void quantize_q8_0(const float* x, int64_t n, void* out, const float*) {
  auto* b = static_cast<BlockQ8_0*>(out);
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) {
    float amax = 0;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_f16(b[i].d, d);
    for (int j = 0; j < kBlock; ++j) b[i].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
}

void dequantize_q8_1(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ8_1*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < kBlock; ++j) y[j] = b[i].qs[j] * d;
  }
}

void quantize_q8_1(const float* x, int64_t n, void* out, const float*) {
  auto* b = static_cast<BlockQ8_1*>(out);
  for (int64_t i = 0; i < n / kBlock; ++i, x += kBlock) {
    float amax = 0;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < kBlock; ++j) {
      b[i].qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
      sum += b[i].qs[j];
    }
    store_f16(b[i].d, d);
    store_f16(b[i].s, sum * d);
  }
}

void dequantize_q2_0(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ2_0*>(in);
  for (int64_t i = 0; i < n / 64; ++i, y += 64) {
    const float d = f16_to_f32(b[i].d);
    for (int j = 0; j < 64; ++j) y[j] = (((b[i].qs[j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
  }
}

void quantize_q2_0(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ2_0*>(out);
  std::vector<float> w(n);
  row_weights(importance, n, w.data());
  for (int64_t i = 0; i < n / 64; ++i) {
    const float* xb = x + i * 64;
    const float* wb = w.data() + i * 64;
    int8_t L[64] = {}, trial[64];
    // Candidates: ggml's d = max|x| (codes −1..1 only), and least-squares fits that use the
    // asymmetric +2 level on either sign.
    float amax = std::fabs(signed_absmax(xb, 64));
    float candidates[2] = {amax, fit_scale(64, -1, 2, xb, wb, trial, 16)};
    float best_d = 0, best_err = INFINITY;
    for (float c : candidates) {
      float d = fp16_round(c);
      float err = symmetric_codes(xb, wb, 64, d, -1, 2, trial);
      if (err < best_err) {
        best_err = err;
        best_d = d;
        std::memcpy(L, trial, 64);
      }
    }
    store_f16(b[i].d, best_d);
    std::memset(b[i].qs, 0, sizeof b[i].qs);
    for (int j = 0; j < 64; ++j) b[i].qs[j / 4] |= static_cast<uint8_t>((L[j] + 1) << (2 * (j % 4)));
  }
}

void dequantize_mxfp4(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockMxfp4*>(in);
  for (int64_t i = 0; i < n / kBlock; ++i, y += kBlock) {
    const float d = e8m0_to_f32_half(b[i].e);
    for (int j = 0; j < 16; ++j) {
      y[j] = kFp4Values[b[i].qs[j] & 0x0F] * d;
      y[j + 16] = kFp4Values[b[i].qs[j] >> 4] * d;
    }
  }
}

namespace {

// E2M1 code of the magnitude nearest to |v| in half units: the midpoints between the doubled
// magnitudes 0,1,2,3,4,6,8,12 are multiples of 1/2.
constexpr uint8_t kFp4Magnitude[32] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4, 5, 5, 5, 5, 6, 6,
                                       6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7};

float mxfp4_codes(const float* x, const float* w, float d, uint8_t* L) {
  const float id = 1.0f / d;  // d is a power of two: exact
  float err = 0;
  for (int j = 0; j < kBlock; ++j) {
    const float a = 2.0f * std::fabs(x[j] * id);
    const int m = kFp4Magnitude[a >= 31.0f ? 31 : static_cast<int>(a)];
    const int code = x[j] < 0 && m ? m + 8 : m;
    L[j] = static_cast<uint8_t>(code);
    const float diff = kFp4Values[code] * d - x[j];
    err += w[j] * diff * diff;
  }
  return err;
}

}  // namespace

void quantize_mxfp4(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockMxfp4*>(out);
  std::vector<float> w(n);
  row_weights(importance, n, w.data());
  for (int64_t i = 0; i < n / kBlock; ++i) {
    const float* xb = x + i * kBlock;
    const float* wb = w.data() + i * kBlock;
    float amax = 0;
    for (int j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(xb[j]));
    // ggml's exponent puts amax in [4, 8)·2^(e−128), i.e. within the top two E2M1 magnitudes;
    // one step either way is also tried.
    int e0 = amax > 0 && std::isfinite(amax) ? std::ilogb(amax) - 2 + 127 : 0;
    uint8_t L[kBlock], trial[kBlock];
    float best_err = INFINITY;
    int best_e = clamp_int(e0, 0, 254);
    for (int e = e0 - 1; e <= e0 + 1; ++e) {
      if (e < 0 || e > 254) continue;
      float err = mxfp4_codes(xb, wb, e8m0_to_f32_half(static_cast<uint8_t>(e)), trial);
      if (err < best_err) {
        best_err = err;
        best_e = e;
        std::memcpy(L, trial, kBlock);
      }
    }
    if (best_err == INFINITY) mxfp4_codes(xb, wb, e8m0_to_f32_half(static_cast<uint8_t>(best_e)), L);
    b[i].e = static_cast<uint8_t>(best_e);
    for (int j = 0; j < 16; ++j) b[i].qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
  }
}

}  // namespace regolith::quant
