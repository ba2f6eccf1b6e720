// CPU generic ops: row gather, norms, RoPE, elementwise, causal conv (mul_mat: cpu_matmul.cpp).
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace regolith {

using namespace cpu;

void CpuBackend::get_rows(const Weight& table, std::span<const int64_t> ids, Tensor& out) {
  check_get_rows(table, ids, out);
  int64_t n = table.ne[0];
  WeightRows rows = rows_of(table);
  int64_t n_ids = static_cast<int64_t>(ids.size());
  pool_.parallel_for(n_ids, grain_for(n_ids, n, pool_.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) row_to_f32(k_, rows, ids[i], out.f32() + i * n);
  });
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_add(a, b, out);
  const float *pa = a.f32(), *pb = b.f32();
  float* po = out.f32();
  int64_t n = a.n_elements();
  pool_.parallel_for(n, grain_for(n, 1, pool_.size(), 1 << 16), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) po[i] = pa[i] + pb[i];
  });
}

void CpuBackend::repeat_streams(const Tensor& x, int64_t n_streams, Tensor& out) {
  check_repeat_streams(x, n_streams, out);
  int64_t H = x.ne(0), T = x.ne(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < n_streams; ++s)
      std::copy(x.f32() + t * H, x.f32() + (t + 1) * H, out.f32() + (t * n_streams + s) * H);
}

void CpuBackend::rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out) {
  check_rms_norm(x, w, group, out);
  int64_t n = x.ne(0);
  std::vector<float> wbuf;
  const float* wv = w ? weight_f32(k_, *w, wbuf) : nullptr;
  bool per_row = w && w->n_elements() == n;
  int64_t n_groups = x.n_elements() / group;
  pool_.parallel_for(n_groups, grain_for(n_groups, group, pool_.size()), [&](int64_t g0, int64_t g1) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      const float* xp = x.f32() + gi * group;
      float* op = out.f32() + gi * group;
      double ss = k_.sum_squares(xp, group);
      float r = static_cast<float>(1.0 / std::sqrt(ss / group + eps));
      const float* wp = wv ? wv + (per_row ? (gi * group) % n : 0) : nullptr;
      if (wp)
        for (int64_t i = 0; i < group; ++i) op[i] = xp[i] * r * wp[i];
      else
        for (int64_t i = 0; i < group; ++i) op[i] = xp[i] * r;
    }
  });
}

void CpuBackend::rope(Tensor& x, std::span<const int64_t> positions, int64_t n_rot, float theta) {
  check_rope(x, positions, n_rot);
  int64_t hd = x.ne(0), nh = x.ne(1), T = x.ne(2);
  int64_t half = n_rot / 2;
  // The angle exactly as ref (and transformers) compute it in FP32, once per token for all heads.
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(n_rot));
  pool_.parallel_for(T, grain_for(T, nh * hd + half * 40, pool_.size()), [&](int64_t t0, int64_t t1) {
    std::vector<float> c(half), s(half);
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        float ang = inv_freq[i] * static_cast<float>(positions[t]);
        c[i] = static_cast<float>(std::cos(static_cast<double>(ang)));
        s[i] = static_cast<float>(std::sin(static_cast<double>(ang)));
      }
      for (int64_t h = 0; h < nh; ++h) {
        float* p = x.f32() + (t * nh + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          float x1 = p[i], x2 = p[i + half];
          p[i] = x1 * c[i] - x2 * s[i];
          p[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
    }
  });
}

void CpuBackend::swiglu(const Tensor& g, const Tensor& u, Tensor& out) {
  check_swiglu(g, u, out);
  int64_t n = g.n_elements();
  pool_.parallel_for(n, grain_for(n, 8, pool_.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out.f32()[i] = siluf(g.f32()[i]) * u.f32()[i];
  });
}

void CpuBackend::add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& s) {
  check_add_sigmoid_gated(acc, x, s);
  int64_t n = acc.ne(0), T = acc.ne(1);
  for (int64_t t = 0; t < T; ++t) k_.axpy(sigmoidf(s.f32()[t]), x.f32() + t * n, acc.f32() + t * n, n);
}

void CpuBackend::causal_conv(const Tensor& x, Tensor& history, const Weight& w, int64_t dilation, Tensor& out) {
  check_causal_conv(x, history, w, dilation, out);
  int64_t C = x.ne(0), T = x.ne(1), K = w.ne[0], L = (K - 1) * dilation;
  std::vector<float> wbuf;
  const float* wv = weight_f32(k_, w, wbuf);  // [C][K]
  // Row j of the sequence [history | x], oldest first.
  auto seq = [&](int64_t j) { return j < L ? history.f32() + j * C : x.f32() + (j - L) * C; };
  // Channel ranges over threads (decode has one token); within a range the taps are transposed
  // to [K][range] so that the channel loop runs over contiguous memory.
  constexpr int64_t kChannels = 256;
  pool_.parallel_for(C, grain_for(C, K * T * 2, pool_.size(), 1 << 14) / kChannels * kChannels + kChannels,
                     [&](int64_t c0, int64_t c1) {
    int64_t nc = c1 - c0;
    std::vector<float> taps(static_cast<size_t>(K * nc));
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t k = 0; k < K; ++k) taps[k * nc + c] = wv[(c0 + c) * K + k];
    for (int64_t t = 0; t < T; ++t) {
      float* o = out.f32() + t * C + c0;
      for (int64_t c = 0; c < nc; ++c) o[c] = 0;
      for (int64_t k = 0; k < K; ++k) {
        const float* src = seq(L + t - (K - 1 - k) * dilation) + c0;
        const float* tk = taps.data() + k * nc;
        for (int64_t c = 0; c < nc; ++c) o[c] += tk[c] * src[c];
      }
      for (int64_t c = 0; c < nc; ++c) o[c] = siluf(o[c]);
    }
  });
  // The new history: the last L rows of [history | x].
  if (L > 0) {
    if (T >= L) {
      std::copy(x.f32() + (T - L) * C, x.f32() + T * C, history.f32());
    } else {
      std::copy(history.f32() + T * C, history.f32() + L * C, history.f32());
      std::copy(x.f32(), x.f32() + T * C, history.f32() + (L - T) * C);
    }
  }
}

}  // namespace regolith
