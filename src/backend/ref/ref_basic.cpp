// Reference generic ops: row gather, matrix product, norms, RoPE, elementwise, causal conv.
#include <cmath>

#include "backend/ref/ref_backend.h"
#include "backend/ref/ref_util.h"

namespace regolith {

using namespace ref;

void RefBackend::get_rows(const Weight& table, std::span<const int64_t> ids, Tensor& out) {
  check_get_rows(table, ids, out);
  int64_t n = table.ne[0];
  RowReader rows(table);
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* r = rows.row(ids[i]);
    std::copy(r, r + n, out.f32() + static_cast<int64_t>(i) * n);
  }
}

void RefBackend::mul_mat(const Weight& w, const Tensor& x, Tensor& out) {
  check_mul_mat(w, x, out);
  int64_t K = w.ne[0], N = w.ne[1], T = x.ne(1);
  const float* xp = x.f32();
  float* op = out.f32();
  parallel_rows(N, K * T, [&](int64_t n0, int64_t n1) {
    RowReader rows(w);
    for (int64_t n = n0; n < n1; ++n) {
      const float* wr = rows.row(n);
      for (int64_t t = 0; t < T; ++t) op[t * N + n] = static_cast<float>(dot(wr, xp + t * K, K));
    }
  });
}

void RefBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_add(a, b, out);
  for (int64_t i = 0; i < a.n_elements(); ++i) out.f32()[i] = a.f32()[i] + b.f32()[i];
}

void RefBackend::repeat_streams(const Tensor& x, int64_t n_streams, Tensor& out) {
  check_repeat_streams(x, n_streams, out);
  int64_t H = x.ne(0), T = x.ne(1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < n_streams; ++s)
      std::copy(x.f32() + t * H, x.f32() + (t + 1) * H, out.f32() + (t * n_streams + s) * H);
}

void RefBackend::rms_norm(const Tensor& x, const Weight* w, int64_t group, float eps, Tensor& out) {
  check_rms_norm(x, w, group, out);
  int64_t n = x.ne(0);
  std::vector<float> wv;
  if (w) wv = weight_values(*w);
  int64_t n_groups = x.n_elements() / group;
  for (int64_t gi = 0; gi < n_groups; ++gi) {
    const float* wp = wv.empty() ? nullptr : wv.data() + (wv.size() == static_cast<size_t>(n) ? (gi * group) % n : 0);
    rms_norm_row(x.f32() + gi * group, wp, group, eps, out.f32() + gi * group);
  }
}

void RefBackend::rope(Tensor& x, std::span<const int64_t> positions, int64_t n_rot, float theta) {
  check_rope(x, positions, n_rot);
  int64_t hd = x.ne(0), nh = x.ne(1), T = x.ne(2);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) rope_head(x.f32() + (t * nh + h) * hd, positions[t], n_rot, theta);
}

void RefBackend::swiglu(const Tensor& g, const Tensor& u, Tensor& out) {
  check_swiglu(g, u, out);
  for (int64_t i = 0; i < g.n_elements(); ++i) out.f32()[i] = static_cast<float>(silu(g.f32()[i]) * u.f32()[i]);
}

void RefBackend::add_sigmoid_gated(Tensor& acc, const Tensor& x, const Tensor& s) {
  check_add_sigmoid_gated(acc, x, s);
  int64_t n = acc.ne(0), T = acc.ne(1);
  for (int64_t t = 0; t < T; ++t) {
    double gate = sigmoid(s.f32()[t]);
    for (int64_t i = 0; i < n; ++i) acc.f32()[t * n + i] = static_cast<float>(acc.f32()[t * n + i] + gate * x.f32()[t * n + i]);
  }
}

void RefBackend::causal_conv(const Tensor& x, Tensor& history, const Weight& w, int64_t dilation, Tensor& out) {
  check_causal_conv(x, history, w, dilation, out);
  int64_t C = x.ne(0), T = x.ne(1), K = w.ne[0], L = (K - 1) * dilation;
  std::vector<float> wv = weight_values(w);  // [C][K]
  // The sequence [history | x], oldest first.
  std::vector<float> seq(static_cast<size_t>((L + T) * C));
  std::copy(history.f32(), history.f32() + L * C, seq.begin());
  std::copy(x.f32(), x.f32() + T * C, seq.begin() + L * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(wv[c * K + k]) * seq[(L + t - (K - 1 - k) * dilation) * C + c];
      out.f32()[t * C + c] = static_cast<float>(silu(s));
    }
  std::copy(seq.end() - L * C, seq.end(), history.f32());
}

}  // namespace regolith
