// K-quants: 256-value super-blocks of 16 or 8 sub-blocks, each with an integer scale (and, for
// Q2_K/Q4_K/Q5_K, an integer min) relative to fp16 super-block scales; plus Q8_K, the
// activation format they are multiplied against. Dequantization follows ggml's expressions
// exactly. The quantizers fit every sub-block by weighted least squares, then choose the
// super-block scales among a max-based and a least-squares candidate and, for the chosen ones,
// move each sub-block's integer scale (and min) by ±1 wherever that lowers the error — ggml
// stops before this last step.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "quant/blocks.h"
#include "quant/fit.h"
#include "quant/formats.h"

namespace regolith::quant {
namespace {

constexpr int QK = kSuperBlock;

// ---- shared super-block search ---------------------------------------------------------------

// Error of one sub-block coded with scale dl and min ml (x ≈ dl·l − ml, l in [0, nmax]).
float affine_sub_error(const float* x, const float* w, int n, float dl, float ml, int nmax, uint8_t* L) {
  float id = dl > 0 ? 1.0f / dl : 0.0f;
  float err = 0;
  for (int i = 0; i < n; ++i) {
    int l = id > 0 ? clamp_int(nearest_int((x[i] + ml) * id), 0, nmax) : 0;
    L[i] = static_cast<uint8_t>(l);
    float diff = dl * l - ml - x[i];
    err += w[i] * diff * diff;
  }
  return err;
}

// Error of one sub-block coded with scale dl (x ≈ dl·l, l in [lo, hi]).
float symmetric_sub_error(const float* x, const float* w, int n, float dl, int lo, int hi, int8_t* L) {
  float id = dl != 0 ? 1.0f / dl : 0.0f;
  float err = 0;
  for (int i = 0; i < n; ++i) {
    int l = id != 0 ? clamp_int(nearest_int(x[i] * id), lo, hi) : 0;
    L[i] = static_cast<int8_t>(l);
    float diff = dl * l - x[i];
    err += w[i] * diff * diff;
  }
  return err;
}

struct AffineLayout {
  int sub;       // values per sub-block
  int nmax;      // largest value code
  int code_max;  // largest scale/min code
};

struct AffineResult {
  float d = 0, dmin = 0;  // fp16-representable
  uint8_t sc[16] = {}, mn[16] = {};
  uint8_t L[QK] = {};
};

// One super-block of an affine K-quant (x ≈ d·sc·l − dmin·mn).
void quantize_affine_superblock(const AffineLayout& lay, const float* x, const float* w, AffineResult& out) {
  const int n_sub = QK / lay.sub;
  float scales[16], mins[16], sw[16];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < n_sub; ++j) {
    AffineFit f = fit_affine(lay.sub, lay.nmax, x + j * lay.sub, w + j * lay.sub, out.L + j * lay.sub, true);
    scales[j] = f.scale;
    mins[j] = -f.offset;
    sw[j] = 0;
    for (int i = 0; i < lay.sub; ++i) sw[j] += w[j * lay.sub + i];
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  uint8_t codes[16];
  float candidates[2][2] = {
      {max_scale / lay.code_max, max_min / lay.code_max},
      {fit_unsigned_codes(n_sub, lay.code_max, scales, sw, codes), fit_unsigned_codes(n_sub, lay.code_max, mins, sw, codes)},
  };
  float best_total = INFINITY;
  uint8_t L[QK], trial[32];
  for (const auto& c : candidates) {
    float d = fp16_round(c[0]), dmin = fp16_round(c[1]);
    float total = 0;
    uint8_t sc[16], mn[16];
    for (int j = 0; j < n_sub && total < best_total; ++j) {
      const float* xs = x + j * lay.sub;
      const float* ws = w + j * lay.sub;
      int s0 = d > 0 ? clamp_int(nearest_int(scales[j] / d), 0, lay.code_max) : 0;
      int m0 = dmin > 0 ? clamp_int(nearest_int(mins[j] / dmin), 0, lay.code_max) : 0;
      float best = INFINITY;
      for (int s = std::max(0, s0 - 1); s <= std::min(lay.code_max, s0 + 1); ++s) {
        for (int m = std::max(0, m0 - 1); m <= std::min(lay.code_max, m0 + 1); ++m) {
          float err = affine_sub_error(xs, ws, lay.sub, d * s, dmin * m, lay.nmax, trial);
          if (err < best) {
            best = err;
            sc[j] = static_cast<uint8_t>(s);
            mn[j] = static_cast<uint8_t>(m);
            std::memcpy(L + j * lay.sub, trial, lay.sub);
          }
        }
      }
      total += best;
    }
    if (total < best_total) {
      best_total = total;
      out.d = d;
      out.dmin = dmin;
      std::memcpy(out.sc, sc, n_sub);
      std::memcpy(out.mn, mn, n_sub);
      std::memcpy(out.L, L, QK);
    }
  }
}

struct SymmetricLayout {
  int lo, hi;            // value codes
  int code_lo, code_hi;  // sub-block scale codes
};

struct SymmetricResult {
  float d = 0;
  int8_t sc[16] = {};
  int8_t L[QK] = {};
};

// One super-block of a symmetric K-quant with 16 sub-blocks (x ≈ d·sc·l).
void quantize_symmetric_superblock(const SymmetricLayout& lay, const float* x, const float* w, SymmetricResult& out) {
  float scales[16], sw[16];
  float max_scale = 0, amax = 0;
  for (int j = 0; j < 16; ++j) {
    scales[j] = fit_scale(16, lay.lo, lay.hi, x + 16 * j, w + 16 * j, out.L + 16 * j);
    sw[j] = 0;
    for (int i = 0; i < 16; ++i) sw[j] += w[16 * j + i];
    if (std::fabs(scales[j]) > amax) {
      amax = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  int8_t codes[16];
  float candidates[2] = {max_scale / lay.code_lo, fit_scale(16, lay.code_lo, lay.code_hi, scales, sw, codes)};
  float best_total = INFINITY;
  int8_t L[QK], trial[16];
  for (float c : candidates) {
    float d = fp16_round(c);
    float total = 0;
    int8_t sc[16];
    for (int j = 0; j < 16 && total < best_total; ++j) {
      int s0 = d != 0 ? clamp_int(nearest_int(scales[j] / d), lay.code_lo, lay.code_hi) : 0;
      float best = INFINITY;
      for (int s = std::max(lay.code_lo, s0 - 1); s <= std::min(lay.code_hi, s0 + 1); ++s) {
        float err = symmetric_sub_error(x + 16 * j, w + 16 * j, 16, d * s, lay.lo, lay.hi, trial);
        if (err < best) {
          best = err;
          sc[j] = static_cast<int8_t>(s);
          std::memcpy(L + 16 * j, trial, 16);
        }
      }
      total += best;
    }
    if (total < best_total) {
      best_total = total;
      out.d = d;
      std::memcpy(out.sc, sc, 16);
      std::memcpy(out.L, L, QK);
    }
  }
}

// Objective weights of one super-block. With an importance row: the importance itself, so that
// the weighted error is the expected squared error of the row's dot products (ggml multiplies it
// by √(σ² + x²), which costs importance-weighted error: up to 9% here on heavy-tailed rows).
// Without: the type's heuristic below, which leans towards the larger values.
bool importance_weights(const float* importance, float* w) {
  if (!importance) return false;
  std::copy(importance, importance + QK, w);
  return true;
}

// √(2·mean(x²) + x²): the plain weighting of Q3_K.
void sigma_weights(const float* x, float* w) {
  const float sigma2 = 2.0f * sum_squares(x, QK) / QK;
  for (int i = 0; i < QK; ++i) w[i] = std::sqrt(sigma2 + x[i] * x[i]);
}

// Weights without importance for the 32-wide affine types: ggml's rms(sub-block) + |x|.
void rms_plus_abs_weights(const float* x, float* w) {
  for (int j = 0; j < QK / 32; ++j) {
    float av = std::sqrt(sum_squares(x + 32 * j, 32) / 32);
    for (int i = 0; i < 32; ++i) w[32 * j + i] = av + std::fabs(x[32 * j + i]);
  }
}

void pack_k4_scales(const uint8_t* sc, const uint8_t* mn, uint8_t* s) {
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] = sc[j];
      s[j + 4] = mn[j];
    } else {
      s[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
      s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
      s[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
    }
  }
}

// 2-bit codes of 128 values in 32 bytes: byte l holds values l, l+32, l+64, l+96.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

}  // namespace

void q3k_scale_codes(const uint8_t* s, int8_t* codes) {
  for (int j = 0; j < 16; ++j) {
    int low = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
    int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    codes[j] = static_cast<int8_t>(low | (high << 4));
  }
}

// ---- Q2_K ------------------------------------------------------------------------------------

void dequantize_q2_k(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ2_K*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d), min = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = b[i].scales[is++];
          const float dl = d * (sc & 0xF), ml = min * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((q[l + 16 * part] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void quantize_q2_k(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ2_K*>(out);
  const AffineLayout lay{16, 3, 15};
  float w[QK];
  AffineResult r;
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    if (!importance_weights(importance ? importance + i * QK : nullptr, w))
      for (int k = 0; k < QK; ++k) w[k] = std::fabs(x[k]);
    quantize_affine_superblock(lay, x, w, r);
    b[i].d = f32_to_f16(r.d);
    b[i].dmin = f32_to_f16(r.dmin);
    for (int j = 0; j < 16; ++j) b[i].scales[j] = static_cast<uint8_t>(r.sc[j] | (r.mn[j] << 4));
    pack_2bit(r.L, b[i].qs);
  }
}

// ---- Q3_K ------------------------------------------------------------------------------------

void dequantize_q3_k(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ3_K*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d_all = f16_to_f32(b[i].d);
    int8_t scales[16];
    q3k_scale_codes(b[i].scales, scales);
    const uint8_t* q = b[i].qs;
    const uint8_t* hm = b[i].hmask;
    uint8_t m = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * (scales[is++] - 32);
          for (int l = 0; l < 16; ++l) {
            const int k = l + 16 * part;
            *y++ = dl * (((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
          }
        }
      }
    }
  }
}

void quantize_q3_k(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ3_K*>(out);
  const SymmetricLayout lay{-4, 3, -32, 31};
  float w[QK];
  SymmetricResult r;
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    if (!importance_weights(importance ? importance + i * QK : nullptr, w)) sigma_weights(x, w);
    quantize_symmetric_superblock(lay, x, w, r);
    b[i].d = f32_to_f16(r.d);
    std::memset(b[i].scales, 0, 12);
    for (int j = 0; j < 16; ++j) {
      int l = r.sc[j] + 32;
      if (j < 8)
        b[i].scales[j] = static_cast<uint8_t>(l & 0xF);
      else
        b[i].scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
      b[i].scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
    }
    // The third bit of value v goes to hmask[v % 32], bit v / 32.
    uint8_t L[QK];
    std::memset(b[i].hmask, 0, 32);
    for (int v = 0; v < QK; ++v) {
      int l = r.L[v] + 4;
      if (l > 3) {
        b[i].hmask[v % 32] |= static_cast<uint8_t>(1 << (v / 32));
        l -= 4;
      }
      L[v] = static_cast<uint8_t>(l);
    }
    pack_2bit(L, b[i].qs);
  }
}

// ---- Q4_K / Q5_K -----------------------------------------------------------------------------

void dequantize_q4_k(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ4_K*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d), min = f16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < 8; j += 2, q += 32) {
      uint8_t sc, m;
      k4_scale_min(j, b[i].scales, sc, m);
      const float d1 = d * sc, m1 = min * m;
      k4_scale_min(j + 1, b[i].scales, sc, m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void quantize_q4_k(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ4_K*>(out);
  const AffineLayout lay{32, 15, 63};
  float w[QK];
  AffineResult r;
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    if (!importance_weights(importance ? importance + i * QK : nullptr, w)) rms_plus_abs_weights(x, w);
    quantize_affine_superblock(lay, x, w, r);
    b[i].d = f32_to_f16(r.d);
    b[i].dmin = f32_to_f16(r.dmin);
    pack_k4_scales(r.sc, r.mn, b[i].scales);
    for (int j = 0; j < QK; j += 64)
      for (int l = 0; l < 32; ++l) b[i].qs[j / 2 + l] = static_cast<uint8_t>(r.L[j + l] | (r.L[j + l + 32] << 4));
  }
}

void dequantize_q5_k(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ5_K*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d), min = f16_to_f32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < 8; j += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      k4_scale_min(j, b[i].scales, sc, m);
      const float d1 = d * sc, m1 = min * m;
      k4_scale_min(j + 1, b[i].scales, sc, m);
      const float d2 = d * sc, m2 = min * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void quantize_q5_k(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ5_K*>(out);
  const AffineLayout lay{32, 31, 63};
  float w[QK];
  AffineResult r;
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    if (!importance_weights(importance ? importance + i * QK : nullptr, w)) rms_plus_abs_weights(x, w);
    quantize_affine_superblock(lay, x, w, r);
    b[i].d = f32_to_f16(r.d);
    b[i].dmin = f32_to_f16(r.dmin);
    pack_k4_scales(r.sc, r.mn, b[i].scales);
    std::memset(b[i].qh, 0, 32);
    for (int j = 0; j < QK; j += 64) {
      const int bit = j / 32;  // chunk c uses qh bits 2c (low half) and 2c+1 (high half)
      for (int l = 0; l < 32; ++l) {
        int l1 = r.L[j + l], l2 = r.L[j + l + 32];
        b[i].qh[l] |= static_cast<uint8_t>(((l1 >> 4) << bit) | ((l2 >> 4) << (bit + 1)));
        b[i].qs[j / 2 + l] = static_cast<uint8_t>((l1 & 0xF) | ((l2 & 0xF) << 4));
      }
    }
  }
}

// ---- Q6_K ------------------------------------------------------------------------------------

void dequantize_q6_k(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ6_K*>(in);
  for (int64_t i = 0; i < n / QK; ++i) {
    const float d = f16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

void quantize_q6_k(const float* x, int64_t n, void* out, const float* importance) {
  auto* b = static_cast<BlockQ6_K*>(out);
  const SymmetricLayout lay{-32, 31, -128, 127};
  float w[QK];
  SymmetricResult r;
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    if (!importance_weights(importance ? importance + i * QK : nullptr, w))
      for (int k = 0; k < QK; ++k) w[k] = x[k] * x[k];
    quantize_symmetric_superblock(lay, x, w, r);
    b[i].d = f32_to_f16(r.d);
    std::memcpy(b[i].scales, r.sc, 16);
    for (int half = 0; half < 2; ++half) {
      const int8_t* L = r.L + 128 * half;
      uint8_t* ql = b[i].ql + 64 * half;
      uint8_t* qh = b[i].qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        int q1 = L[l] + 32, q2 = L[l + 32] + 32, q3 = L[l + 64] + 32, q4 = L[l + 96] + 32;
        ql[l] = static_cast<uint8_t>((q1 & 0xF) | ((q3 & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xF) | ((q4 & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

// ---- Q8_K (activations) ------------------------------------------------------------------------

void dequantize_q8_k(const void* in, int64_t n, float* y) {
  const auto* b = static_cast<const BlockQ8_K*>(in);
  for (int64_t i = 0; i < n / QK; ++i)
    for (int j = 0; j < QK; ++j) *y++ = b[i].d * b[i].qs[j];
}

// As ggml: the largest magnitude maps to −127 (so that codes stay within ±127), d = −max/127.
void quantize_q8_k(const float* x, int64_t n, void* out, const float*) {
  auto* b = static_cast<BlockQ8_K*>(out);
  for (int64_t i = 0; i < n / QK; ++i, x += QK) {
    float amax = 0, max = 0;
    for (int j = 0; j < QK; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    if (amax == 0) {
      std::memset(&b[i], 0, sizeof b[i]);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK; ++j) b[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int k = 0; k < 16; ++k) sum += b[i].qs[16 * j + k];
      b[i].bsums[j] = static_cast<int16_t>(sum);
    }
    b[i].d = 1 / iscale;
  }
}

}  // namespace regolith::quant
