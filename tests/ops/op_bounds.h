// Float64 expectations with a bound per value, for ops whose backends may quantize activations.
//
// A backend may multiply quantized weight rows with activations quantized to the format quant
// pairs with the weight type (Q8_0 for 32- and 64-value blocks, Q8_K for 256-value blocks; the CPU
// backend does at small token counts, as llama.cpp does). Such a product differs from the float64
// product of the dequantized weights with the original activations x by at most
// Σ_k |w_k|·|x_k − x̂_k| (x̂: x after that rounding), plus float accumulation. The expectations here
// carry that bound through each op's steps (norms, silu, sigmoid, products of products), and
// expect_within asserts that every backend value lies inside it. The bounds are far smaller than
// the change a wrong row, token, scale or activation format makes.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "op_test_util.h"
#include "quant/dot.h"

namespace regolith::test {

// Each value and how far a backend's value may be from it.
struct Bounded {
  std::vector<double> want, bound;
};

// Float32 evaluation error, relative to the magnitudes a value is made of (Σ|w·x| for a product).
constexpr double kFloatSlack = 1e-6;

// Every type a weight matrix can have.
inline std::vector<GgmlType> every_weight_type() {
  return {GgmlType::F32,    GgmlType::F16,     GgmlType::BF16,   GgmlType::Q4_0,   GgmlType::Q4_1,    GgmlType::Q5_0,
          GgmlType::Q5_1,   GgmlType::Q8_0,    GgmlType::Q2_0,   GgmlType::MXFP4,  GgmlType::IQ4_NL,  GgmlType::Q2_K,
          GgmlType::Q3_K,   GgmlType::Q4_K,    GgmlType::Q5_K,   GgmlType::Q6_K,   GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
          GgmlType::IQ2_S,  GgmlType::IQ3_XXS, GgmlType::IQ3_S,  GgmlType::IQ4_XS};
}

inline bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Values a backend holds exactly (its inputs): no bound.
inline Bounded exact(const std::vector<float>& v) {
  return {std::vector<double>(v.begin(), v.end()), std::vector<double>(v.size(), 0.0)};
}

// Per value, how far the activations a product with rows of `weight_type` reads may be from
// x.want: x's own bound, plus the rounding to the activation format for quantized types. Where a
// block of x is exact, that rounding is computed (quantize, then dequantize, with quant's codecs);
// where the backend's values are only known within a bound, its block maximum bounds it: half a
// step of d = amax/127, plus for Q8_0 the fp16 rounding of d (2⁻¹¹ relative, times |q| ≤ 127;
// 2⁻²⁵ absolute when subnormal); 1e-4 more covers the float rounding of x/d.
inline std::vector<double> activation_error(GgmlType weight_type, const Bounded& x, int64_t K) {
  std::vector<double> err = x.bound;
  if (is_float_type(weight_type)) return err;
  GgmlType format = quant::activation_type(weight_type);
  int64_t block = traits(format).block_size;
  double per_amax = (0.5 + 1e-4 + (format == GgmlType::Q8_0 ? 127.0 / 2048 : 0.0)) / 127;
  double floor = format == GgmlType::Q8_0 ? 127 * std::ldexp(1.0, -25) : 0.0;
  std::vector<float> row(K), rounded(K);
  std::vector<uint8_t> q(row_bytes(format, K));
  for (size_t r0 = 0; r0 < x.want.size(); r0 += K) {
    for (int64_t k = 0; k < K; ++k) row[k] = static_cast<float>(x.want[r0 + k]);
    quantize_row(format, row.data(), K, q.data());
    dequantize_row(format, q.data(), K, rounded.data());
    for (int64_t b = 0; b < K; b += block) {
      double amax = 0, worst_in = 0;
      for (int64_t k = b; k < b + block; ++k) {
        amax = std::max(amax, std::fabs(x.want[r0 + k]) + x.bound[r0 + k]);
        worst_in = std::max(worst_in, x.bound[r0 + k]);
      }
      for (int64_t k = b; k < b + block; ++k) {
        double exact_rounding = std::fabs(static_cast<double>(rounded[k]) - x.want[r0 + k]);
        err[r0 + k] += worst_in == 0 ? exact_rounding : amax * per_amax + floor;
      }
    }
  }
  return err;
}

// y[t·n_rows + n] = Σ_k W[row0 + n][k]·x[t·K + k] over the weight's dequantized values `wv`
// (rows of K), for the T tokens of x, bounded by Σ_k |W|·activation_error + float slack.
inline Bounded product(const std::vector<float>& wv, GgmlType type, int64_t K, int64_t row0, int64_t n_rows,
                       const Bounded& x, int64_t T) {
  std::vector<double> err = activation_error(type, x, K);
  Bounded y{std::vector<double>(n_rows * T), std::vector<double>(n_rows * T)};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < n_rows; ++n) {
      const float* w = wv.data() + (row0 + n) * K;
      double s = 0, e = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += w[k] * x.want[t * K + k];
        e += std::fabs(w[k]) * err[t * K + k];
        mag += std::fabs(w[k]) * (std::fabs(x.want[t * K + k]) + err[t * K + k]);
      }
      y.want[t * n_rows + n] = s;
      y.bound[t * n_rows + n] = e + kFloatSlack * mag;
    }
  return y;
}

inline Bounded product(const OwnedWeight& w, const Bounded& x, int64_t T) {
  return product(w.values(), w.w.type, w.w.ne[0], 0, w.w.ne[1], x, T);
}

// Every |got − want| within its bound (a float's own rounding of want aside).
inline void expect_within(const std::vector<float>& got, const Bounded& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.want.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size() && !std::isnan(worst); ++i) {
    double allowed = want.bound[i] + 1e-7 * std::fabs(want.want[i]) + 1e-30;
    double ratio = std::fabs(got[i] - want.want[i]) / allowed;
    if (std::isnan(ratio) || ratio > worst) worst = ratio, at = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": worst at " << at << " got " << got[at] << " want " << want.want[at] << " bound "
                        << want.bound[at];
}

// silu(a)·b per value, bounded through |silu'| ≤ 1.1.
inline Bounded swiglu(const Bounded& a, const Bounded& b) {
  Bounded h{a.want, a.want};
  for (size_t i = 0; i < a.want.size(); ++i) {
    double s = silu(a.want[i]), v = b.want[i];
    h.want[i] = s * v;
    h.bound[i] = 1.1 * a.bound[i] * (std::fabs(v) + b.bound[i]) + std::fabs(s) * b.bound[i] +
                 kFloatSlack * std::fabs(s * v);
  }
  return h;
}

// moe_experts' output [T][H]: Σ_slots weight·down_e·(silu(gate_e·x) ⊙ up_e·x), for the ids and
// route weights the backend was given.
inline Bounded moe_experts_expected(const std::vector<float>& x, const std::vector<int32_t>& ids,
                                    const std::vector<float>& route_w, const OwnedWeight& gate, const OwnedWeight& up,
                                    const OwnedWeight& down, int64_t k) {
  int64_t H = gate.w.ne[0], F = gate.w.ne[1], T = static_cast<int64_t>(x.size()) / H;
  auto gv = gate.values(), uv = up.values(), dv = down.values();
  Bounded out{std::vector<double>(H * T, 0.0), std::vector<double>(H * T, 0.0)};
  for (int64_t t = 0; t < T; ++t) {
    Bounded xt = exact(std::vector<float>(x.begin() + t * H, x.begin() + (t + 1) * H));
    for (int64_t j = 0; j < k; ++j) {
      int64_t e = ids[t * k + j];
      double rw = route_w[t * k + j];
      Bounded h = swiglu(product(gv, gate.w.type, H, e * F, F, xt, 1), product(uv, up.w.type, H, e * F, F, xt, 1));
      Bounded y = product(dv, down.w.type, F, e * H, H, h, 1);
      for (int64_t d = 0; d < H; ++d) {
        out.want[t * H + d] += rw * y.want[d];
        out.bound[t * H + d] += std::fabs(rw) * y.bound[d] + kFloatSlack * std::fabs(rw * y.want[d]);
      }
    }
  }
  return out;
}

// moe_ffn's shared expert [T][H]: sigmoid(inp·x)·down(silu(gate·x) ⊙ up·x), bounded through
// |sigmoid'| ≤ 0.25.
inline Bounded shared_expert_expected(const std::vector<float>& x, const OwnedWeight& gate, const OwnedWeight& up,
                                      const OwnedWeight& down, const OwnedWeight& inp) {
  const int64_t H = gate.w.ne[0], T = static_cast<int64_t>(x.size()) / H;
  const Bounded xb = exact(x);
  const Bounded y = product(down, swiglu(product(gate, xb, T), product(up, xb, T)), T), s = product(inp, xb, T);
  Bounded out{std::vector<double>(H * T), std::vector<double>(H * T)};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < H; ++d) {
      const double g = sigmoid(s.want[t]), v = y.want[t * H + d];
      out.want[t * H + d] = g * v;
      out.bound[t * H + d] = 0.25 * s.bound[t] * (std::fabs(v) + y.bound[t * H + d]) + g * y.bound[t * H + d] +
                             kFloatSlack * std::fabs(g * v);
    }
  return out;
}

// hc_read's x [T][H] and inject weights [T][S] (model-spec §4.2): n = each stream RMS-normed with
// its slice of gamma; lo = silu(down·n / S); x = (1/S)·Σ_s sigmoid(up·lo)_s ⊙ n_s;
// inject_w = 2·sigmoid(inject·n / S).
struct HcReadExpected {
  Bounded x, inject_w;
};

inline HcReadExpected hc_read_expected(const std::vector<float>& R, const OwnedWeight& norm, const OwnedWeight& down,
                                       const OwnedWeight& up, const OwnedWeight* inject, int64_t S, double eps) {
  int64_t W = down.w.ne[0], H = W / S, T = static_cast<int64_t>(R.size()) / W;
  auto g = norm.values();
  Bounded n{std::vector<double>(W * T), std::vector<double>(W * T)};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) {
      const float* Rs = R.data() + t * W + s * H;
      double ss = 0;
      for (int64_t d = 0; d < H; ++d) ss += static_cast<double>(Rs[d]) * Rs[d];
      for (int64_t d = 0; d < H; ++d) {
        double v = Rs[d] / std::sqrt(ss / H + eps) * g[s * H + d];
        n.want[t * W + s * H + d] = v;
        n.bound[t * W + s * H + d] = kFloatSlack * std::fabs(v);
      }
    }
  Bounded lo = product(down, n, T);
  for (size_t i = 0; i < lo.want.size(); ++i) {
    double v = silu(lo.want[i] / S);
    lo.bound[i] = 1.1 * lo.bound[i] / S + kFloatSlack * std::fabs(v);
    lo.want[i] = v;
  }
  Bounded m = product(up, lo, T);
  HcReadExpected out{{std::vector<double>(H * T, 0.0), std::vector<double>(H * T, 0.0)}, {}};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t d = 0; d < H; ++d) {
      double acc = 0, bound = 0;
      for (int64_t s = 0; s < S; ++s) {
        int64_t i = t * W + s * H + d;
        double sg = sigmoid(m.want[i]);
        acc += sg * n.want[i];
        bound += 0.25 * m.bound[i] * (std::fabs(n.want[i]) + n.bound[i]) + sg * n.bound[i] +
                 kFloatSlack * std::fabs(sg * n.want[i]);
      }
      out.x.want[t * H + d] = acc / S;
      out.x.bound[t * H + d] = bound / S;
    }
  if (inject) {
    out.inject_w = product(*inject, n, T);
    for (size_t i = 0; i < out.inject_w.want.size(); ++i) {
      double v = 2 * sigmoid(out.inject_w.want[i] / S);
      out.inject_w.bound[i] = 0.5 * out.inject_w.bound[i] / S + kFloatSlack * v;
      out.inject_w.want[i] = v;
    }
  }
  return out;
}

}  // namespace regolith::test
