// Reference QSA (model-spec §4.5): q/gate split, pooled block keys, per-row block selection
// (top blocks, then the incomplete tail) and gated attention over the selection.
#include <algorithm>
#include <cmath>

#include "backend/qsa_topk.h"
#include "backend/ref/ref_backend.h"
#include "backend/ref/ref_util.h"

namespace regolith {

using namespace ref;

void RefBackend::split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) {
  check_split_q_gate(qg, q, gate);
  int64_t hd = qg.ne(0) / 2, nh = qg.ne(1), T = qg.ne(2);
  for (int64_t r = 0; r < nh * T; ++r) {
    const float* src = qg.f32() + r * 2 * hd;
    std::copy(src, src + hd, q.f32() + r * hd);
    std::copy(src + hd, src + 2 * hd, gate.f32() + r * hd);
  }
}

void RefBackend::qsa_pool(const QsaPoolArgs& a) {
  check_qsa_pool(a);
  int64_t d = a.raw_keys->ne(0);
  std::vector<float> w = weight_values(*a.k_norm), mean(d);
  for (int64_t b = a.block_begin; b < a.block_end; ++b) {
    for (int64_t i = 0; i < d; ++i) {
      double s = 0;
      for (int64_t j = 0; j < a.ratio; ++j) s += a.raw_keys->f32()[(b * a.ratio + j) * d + i];
      mean[i] = static_cast<float>(s / a.ratio);
    }
    float* out = a.pooled->f32() + b * d;
    rms_norm_row(mean.data(), w.data(), d, a.eps, out);
    rope_head(out, b * a.ratio, a.n_rot, a.theta);
  }
}

void RefBackend::qsa_select(const QsaSelectArgs& a) {
  check_qsa_select(a);
  int64_t d = a.iq->ne(0), nh = a.iq->ne(1), T = a.iq->ne(2), max_sel = a.sel->ne(0);
  for (int64_t t = 0; t < T; ++t) {
    int64_t p = a.positions[t], nb = (p + 1) / a.ratio;
    std::vector<double> score(nb);
    for (int64_t b = 0; b < nb; ++b) {
      double s = 0;
      for (int64_t h = 0; h < nh; ++h)
        s += std::max(0.0, dot(a.iq->f32() + (t * nh + h) * d, a.pooled->f32() + b * d, d));
      score[b] = s / std::sqrt(static_cast<double>(d));
    }
    std::vector<int32_t> positions;
    for (int64_t b : qsa_top_blocks(score, a.top_blocks))
      for (int64_t i = 0; i < a.ratio; ++i) positions.push_back(static_cast<int32_t>(b * a.ratio + i));
    for (int64_t i = nb * a.ratio; i <= p; ++i) positions.push_back(static_cast<int32_t>(i));
    std::sort(positions.begin(), positions.end());
    std::copy(positions.begin(), positions.end(), a.sel->i32() + t * max_sel);
    std::fill(a.sel->i32() + t * max_sel + positions.size(), a.sel->i32() + (t + 1) * max_sel, -1);
    a.n_sel->i32()[t] = static_cast<int32_t>(positions.size());
  }
}

void RefBackend::qsa_attend(const QsaAttendArgs& a) {
  check_qsa_attend(a);
  int64_t hd = a.q->ne(0), nh = a.q->ne(1), T = a.q->ne(2), nkv = a.k_cache->ne(1), cap = a.k_cache->ne(2);
  const QsaRows rows(a);
  int64_t group = nh / nkv;
  parallel_rows(T, nh * rows.slots() * hd * 2, [&](int64_t t0, int64_t t1) {
    std::vector<double> s, o(hd);
    for (int64_t t = t0; t < t1; ++t) {
      int64_t n = rows.count(t);
      const int32_t* sel = rows.positions(t);
      s.assign(n, 0.0);
      for (int64_t h = 0; h < nh; ++h) {
        int64_t g = h / group;
        const float* q = a.q->f32() + (t * nh + h) * hd;
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          if (sel[j] < 0 || sel[j] >= cap) fail("qsa_attend: selected position ", sel[j], " outside the cache");
          s[j] = dot(q, a.k_cache->f32() + (sel[j] * nkv + g) * hd, hd) * a.scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += s[j] = std::exp(s[j] - mx);
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const float* v = a.v_cache->f32() + (sel[j] * nkv + g) * hd;
          for (int64_t i = 0; i < hd; ++i) o[i] += s[j] / sum * v[i];
        }
        const float* gate = a.gate->f32() + (t * nh + h) * hd;
        for (int64_t i = 0; i < hd; ++i) a.out->f32()[t * nh * hd + h * hd + i] = static_cast<float>(o[i] * sigmoid(gate[i]));
      }
    }
  });
}

}  // namespace regolith
