// CPU hyper-connection read/write (model-spec §4.2) and the PLE gate (§4.8.4). hc_read is one
// pass per token block: grouped norm, then the down and inject products in one threaded split of
// their rows, then up, the sigmoid mix of the streams and the inject gates.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace regolith {

using namespace cpu;

void CpuBackend::hc_read(const HcReadArgs& a) {
  const Tensor& R = *a.R;
  int64_t S = a.n_streams;
  if (S <= 0 || R.ne(0) % S) fail("hc_read: ", S, " streams do not divide ", R.ne(0));
  int64_t W = R.ne(0), T = R.ne(1), H = W / S, r = a.down->ne[1];
  if (a.norm->n_elements() != W || a.down->ne[0] != W || a.up->ne[0] != r || a.up->ne[1] != W)
    fail("hc_read: weights ", a.norm->name, ", ", a.down->name, ", ", a.up->name, " do not fit width ", W);
  expect_shape(*a.x, {H, T, 1, 1}, "hc_read", "x");
  int64_t n_inject = 0;
  if (a.inject) {
    if (a.inject->ne[0] != W || a.inject->ne[1] != S) fail("hc_read: ", a.inject->name, " does not fit");
    expect_shape(*a.inject_w, {S, T, 1, 1}, "hc_read", "inject_w");
    n_inject = S;
  }
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
  int64_t W = R.ne(0), T = R.ne(1), H = y.ne(0), S = inject_w.ne(0);
  if (H * S != W) fail("hc_write: ", S, " streams of ", H, " do not make ", W);
  expect_shape(y, {H, T, 1, 1}, "hc_write", "y");
  expect_shape(inject_w, {S, T, 1, 1}, "hc_write", "inject_w");
  pool_.parallel_for(T * S, grain_for(T * S, H, pool_.size(), 1 << 16), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t t = i / S;
      k_.axpy(inject_w.f32()[i], y.f32() + t * H, R.f32() + i * H, H);
    }
  });
}

void CpuBackend::ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) {
  int64_t W = key.ne(0), T = key.ne(1), H = val.ne(0);
  if (H * n_streams != W) fail("ple_gate: ", n_streams, " streams of ", H, " do not make ", W);
  expect_shape(qry, key.ne(), "ple_gate", "qry");
  expect_shape(val, {H, T, 1, 1}, "ple_gate", "val");
  expect_shape(out, key.ne(), "ple_gate", "out");
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
