// Reference hyper-connection read/write (model-spec §4.2) and the PLE gate (§4.8.4).
#include <cmath>

#include "backend/ref/ref_backend.h"
#include "backend/ref/ref_util.h"

namespace regolith {

using namespace ref;

void RefBackend::hc_read(const HcReadArgs& a) {
  check_hc_read(a);
  const Tensor& R = *a.R;
  int64_t S = a.n_streams, W = R.ne(0), T = R.ne(1), H = W / S, r = a.down->ne[1];
  std::vector<float> g = weight_values(*a.norm);
  parallel_rows(T, 2 * W * r, [&](int64_t t0, int64_t t1) {
    RowReader down(*a.down), up(*a.up);
    std::unique_ptr<RowReader> inject = a.inject ? std::make_unique<RowReader>(*a.inject) : nullptr;
    std::vector<float> n(W), lo(r);
    for (int64_t t = t0; t < t1; ++t) {
      const float* Rt = R.f32() + t * W;
      for (int64_t s = 0; s < S; ++s) rms_norm_row(Rt + s * H, g.data() + s * H, H, a.eps, n.data() + s * H);
      for (int64_t j = 0; j < r; ++j) lo[j] = static_cast<float>(silu(dot(down.row(j), n.data(), W) / S));
      float* x = a.x->f32() + t * H;
      std::vector<double> acc(H, 0.0);
      for (int64_t i = 0; i < W; ++i) acc[i % H] += sigmoid(dot(up.row(i), lo.data(), r)) * n[i];
      for (int64_t d = 0; d < H; ++d) x[d] = static_cast<float>(acc[d] / S);
      if (inject)
        for (int64_t s = 0; s < S; ++s)
          a.inject_w->f32()[t * S + s] = static_cast<float>(2.0 * sigmoid(dot(inject->row(s), n.data(), W) / S));
    }
  });
}

void RefBackend::hc_write(Tensor& R, const Tensor& y, const Tensor& inject_w) {
  check_hc_write(R, y, inject_w);
  int64_t W = R.ne(0), T = R.ne(1), H = y.ne(0), S = inject_w.ne(0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) {
      double wi = inject_w.f32()[t * S + s];
      float* Rp = R.f32() + t * W + s * H;
      for (int64_t d = 0; d < H; ++d) Rp[d] = static_cast<float>(Rp[d] + wi * y.f32()[t * H + d]);
    }
}

void RefBackend::ple_gate(const Tensor& key, const Tensor& qry, const Tensor& val, int64_t n_streams, Tensor& out) {
  check_ple_gate(key, qry, val, n_streams, out);
  int64_t W = key.ne(0), T = key.ne(1), H = val.ne(0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < n_streams; ++s) {
      double score = dot(key.f32() + t * W + s * H, qry.f32() + t * W + s * H, H) / std::sqrt(static_cast<double>(H));
      double ss = score == 0 ? 0.0 : std::copysign(std::sqrt(std::max(std::fabs(score), 1e-6)), score);
      double gate = sigmoid(ss);
      for (int64_t d = 0; d < H; ++d) out.f32()[t * W + s * H + d] = static_cast<float>(gate * val.f32()[t * H + d]);
    }
}

}  // namespace regolith
