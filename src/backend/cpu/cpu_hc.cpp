// CPU hyper-connection read/write (model-spec §4.2) and the PLE gate (§4.8.4). hc_read is one
// pass per token block: grouped norm, then the down and inject products in one threaded split of
// their rows, then up, the sigmoid mix of the streams and the inject gates.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace regolith {

using namespace cpu;

void CpuBackend::hc_read(const HcReadArgs& a) {
  check_hc_read(a);
  const Tensor& R = *a.R;
  int64_t S = a.n_streams, W = R.ne(0), T = R.ne(1), H = W / S, r = a.down->ne[1];
  int64_t n_inject = a.inject ? S : 0;
  std::vector<float> gbuf;
  const float* gamma = weight_f32(k_, *a.norm, gbuf);
  float inv_S = 1.0f / static_cast<float>(S);

  // n [T][W]: each stream RMS-normed with its slice of gamma.
  std::vector<float> n(static_cast<size_t>(T * W));
  pool_.parallel_for(T * S, grain_for(T * S, H, pool_.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t s = i % S;
      const float* src = R.f32() + i * H;
      float* dst = n.data() + i * H;
      float rs = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k_.sum_squares(src, H)) / H + a.eps));
      for (int64_t d = 0; d < H; ++d) dst[d] = src[d] * rs * gamma[s * H + d];
    }
  });

  // down (r rows) and inject (S rows) over n in one split: lo [T][r], iw [T][S].
  std::vector<float> lo(static_cast<size_t>(T * r)), iw(static_cast<size_t>(T * std::max<int64_t>(n_inject, 1)));
  WeightRows down = rows_of(*a.down), inject = a.inject ? rows_of(*a.inject) : WeightRows{};
  QuantizedTokens nq, loq;
  MatInput n_in = mat_input(pool_, {down.type, a.inject ? inject.type : down.type}, T, n.data(), W, W, T, nq);
  int64_t n_rows = r + n_inject;
  pool_.parallel_for(n_rows, grain_for(n_rows, W * T, pool_.size()), [&](int64_t r0, int64_t r1) {
    if (r0 < r) mat_rows(k_, down, r0, std::min(r1, r), n_in, lo.data() + r0, r);
    if (r1 > r) mat_rows(k_, inject, std::max(r0, r) - r, r1 - r, n_in, iw.data() + (std::max(r0, r) - r), S);
  });
  for (float& v : lo) v = siluf(v * inv_S);

  // x = (1/S)·Σ_s sigmoid(up·lo)_s ⊙ n_s
  std::vector<float> m(static_cast<size_t>(T * W));
  MatInput lo_in = mat_input(pool_, {a.up->type}, T, lo.data(), r, r, T, loq);
  mat_parallel(pool_, k_, rows_of(*a.up), W, lo_in, m.data(), W);
  pool_.parallel_for(T, grain_for(T, W * 8, pool_.size()), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* x = a.x->f32() + t * H;
      const float *mt = m.data() + t * W, *nt = n.data() + t * W;
      for (int64_t d = 0; d < H; ++d) x[d] = 0;
      for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < H; ++d) x[d] += sigmoidf(mt[s * H + d]) * nt[s * H + d];
      for (int64_t d = 0; d < H; ++d) x[d] *= inv_S;
      if (n_inject)
        for (int64_t s = 0; s < S; ++s) a.inject_w->f32()[t * S + s] = 2.0f * sigmoidf(iw[t * S + s] * inv_S);
    }
  });
}

void CpuBackend::hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) {
  check_hc_write(R, y, inject_w);
  int64_t T = R.ne(1), H = y.ne(0), S = inject_w.ne(0);
  pool_.parallel_for(T * S, grain_for(T * S, H, pool_.size(), 1 << 16), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t t = i / S;
      k_.axpy(inject_w.f32()[i], y.f32() + t * H, R.f32() + i * H, H);
    }
  });
}

void CpuBackend::ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) {
  check_ple_gate(key, qry, val, n_streams, out);
  int64_t T = key.ne(1), H = val.ne(0);
  double inv_sqrt_H = 1.0 / std::sqrt(static_cast<double>(H));
  pool_.parallel_for(T * n_streams, grain_for(T * n_streams, 3 * H, pool_.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t t = i / n_streams;
      // FP64 score: ssqrt's slope near 0 (up to 500) would magnify float rounding into the gate.
      double score = k_.dot_f64(key.f32() + i * H, qry.f32() + i * H, H) * inv_sqrt_H;
      double ss = score == 0 ? 0.0 : std::copysign(std::sqrt(std::max(std::fabs(score), 1e-6)), score);
      float gate = static_cast<float>(1.0 / (1.0 + std::exp(-ss)));
      const float* v = val.f32() + t * H;
      float* o = out.f32() + i * H;
      for (int64_t d = 0; d < H; ++d) o[d] = gate * v[d];
    }
  });
}

}  // namespace regolith
