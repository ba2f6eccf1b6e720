// CPU QSA (model-spec §4.5): q/gate split, pooled block keys, block selection and gated attention
// over the selection. Indexer scores are FP64 sums (kernels' dot_f64) and the choice goes through
// qsa_top_blocks(), so this backend and ref pick the same blocks. Attention runs per (token, kv
// head): each selected key and value row is loaded once for all the query heads that share it.
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"
#include "backend/qsa_topk.h"

namespace regolith {

using namespace cpu;

void CpuBackend::split_q_gate(const Tensor& qg, Tensor& q, Tensor& gate) {
  check_split_q_gate(qg, q, gate);
  int64_t hd = qg.ne(0) / 2, nh = qg.ne(1), T = qg.ne(2);
  for (int64_t r = 0; r < nh * T; ++r) {
    const float* src = qg.f32() + r * 2 * hd;
    std::copy(src, src + hd, q.f32() + r * hd);
    std::copy(src + hd, src + 2 * hd, gate.f32() + r * hd);
  }
}

void CpuBackend::qsa_pool(const QsaPoolArgs& a) {
  check_qsa_pool(a);
  int64_t d = a.raw_keys->ne(0);
  std::vector<float> wbuf;
  const float* w = weight_f32(k_, *a.k_norm, wbuf);
  int64_t n_blocks = a.block_end - a.block_begin, half = a.n_rot / 2;
  std::vector<float> inv_freq(half);  // as rope() computes it
  for (int64_t i = 0; i < half; ++i)
    inv_freq[i] = 1.0f / std::pow(a.theta, static_cast<float>(2 * i) / static_cast<float>(a.n_rot));
  pool_.parallel_for(n_blocks, grain_for(n_blocks, a.ratio * d, pool_.size()), [&](int64_t b0, int64_t b1) {
    std::vector<double> sum(d);
    for (int64_t b = a.block_begin + b0; b < a.block_begin + b1; ++b) {
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t j = 0; j < a.ratio; ++j) {
        const float* key = a.raw_keys->f32() + (b * a.ratio + j) * d;
        for (int64_t i = 0; i < d; ++i) sum[i] += key[i];
      }
      float* out = a.pooled->f32() + b * d;
      for (int64_t i = 0; i < d; ++i) out[i] = static_cast<float>(sum[i] / a.ratio);
      float r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k_.sum_squares(out, d)) / d + a.eps));
      for (int64_t i = 0; i < d; ++i) out[i] = out[i] * r * w[i];
      // RoPE at the block's first position, the angle as rope() computes it.
      int64_t pos = b * a.ratio;
      for (int64_t i = 0; i < half; ++i) {
        float ang = inv_freq[i] * static_cast<float>(pos);
        float c = static_cast<float>(std::cos(static_cast<double>(ang))), s = static_cast<float>(std::sin(static_cast<double>(ang)));
        float x1 = out[i], x2 = out[i + half];
        out[i] = x1 * c - x2 * s;
        out[i + half] = x2 * c + x1 * s;
      }
    }
  });
}

void CpuBackend::qsa_select(const QsaSelectArgs& a) {
  check_qsa_select(a);
  int64_t d = a.iq->ne(0), nh = a.iq->ne(1), T = a.iq->ne(2), max_sel = a.sel->ne(0);
  int64_t max_nb = 0;
  for (int64_t p : a.positions) max_nb = std::max(max_nb, (p + 1) / a.ratio);
  double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(d));
  // score[t][b] = Σ_h relu(q_{t,h}·K_b) / sqrt(d), split over rows and pieces of kBlockPiece blocks.
  constexpr int64_t kBlockPiece = 128;
  std::vector<double> score(static_cast<size_t>(T * max_nb));
  int64_t n_pieces = std::max<int64_t>(1, (max_nb + kBlockPiece - 1) / kBlockPiece), b_grain = kBlockPiece;
  pool_.parallel_for(T * n_pieces, grain_for(T * n_pieces, b_grain * nh * d, pool_.size()), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      int64_t t = i / n_pieces, piece = i % n_pieces;
      int64_t nb = (a.positions[t] + 1) / a.ratio;
      for (int64_t b = piece * b_grain; b < std::min(nb, (piece + 1) * b_grain); ++b) {
        const float* key = a.pooled->f32() + b * d;
        double s = 0;
        for (int64_t h = 0; h < nh; ++h) s += std::max(0.0, k_.dot_f64(a.iq->f32() + (t * nh + h) * d, key, d));
        score[t * max_nb + b] = s * inv_sqrt_d;
      }
    }
  });
  pool_.parallel_for(T, grain_for(T, 16 * max_nb + max_sel, pool_.size()), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int64_t p = a.positions[t], nb = (p + 1) / a.ratio;
      std::vector<int64_t> blocks =
          qsa_top_blocks(std::span<const double>(score.data() + t * max_nb, static_cast<size_t>(nb)), a.top_blocks);
      // Blocks come back ascending and every block precedes the tail, so positions are ascending.
      int32_t* out = a.sel->i32() + t * max_sel;
      int64_t n = 0;
      for (int64_t b : blocks)
        for (int64_t i = 0; i < a.ratio; ++i) out[n++] = static_cast<int32_t>(b * a.ratio + i);
      for (int64_t i = nb * a.ratio; i <= p; ++i) out[n++] = static_cast<int32_t>(i);
      std::fill(out + n, out + max_sel, -1);
      a.n_sel->i32()[t] = static_cast<int32_t>(n);
    }
  });
}

void CpuBackend::qsa_attend(const QsaAttendArgs& a) {
  check_qsa_attend(a);
  int64_t hd = a.q->ne(0), nh = a.q->ne(1), T = a.q->ne(2), nkv = a.k_cache->ne(1), cap = a.k_cache->ne(2);
  const QsaRows rows(a);
  const int64_t max_sel = rows.slots();
  for (int64_t t = 0; t < T; ++t) {
    int64_t n = rows.count(t);
    if (n < 0 || n > max_sel) fail("qsa_attend: row ", t, " selects ", n, " of ", max_sel, " slots");
    for (int64_t j = 0; j < n; ++j) {
      int32_t p = rows.positions(t)[j];
      if (p < 0 || p >= cap) fail("qsa_attend: selected position ", p, " outside the cache");
    }
  }
  int64_t group = nh / nkv;
  pool_.parallel_for(T * nkv, grain_for(T * nkv, group * max_sel * hd * 2, pool_.size()), [&](int64_t i0, int64_t i1) {
    std::vector<float> s, o(group * hd);
    for (int64_t i = i0; i < i1; ++i) {
      int64_t t = i / nkv, g = i % nkv, n = rows.count(t);
      const int32_t* sel = rows.positions(t);
      const float* q = a.q->f32() + (t * nh + g * group) * hd;  // the group's heads, hd apart
      s.resize(group * n);
      // Selected positions come in ascending runs (whole blocks, then the tail); within a run the
      // cache rows are nkv·hd apart, so each run is one strided matrix for the kernels.
      auto for_runs = [&](auto&& fn) {
        for (int64_t j0 = 0, j1; j0 < n; j0 = j1) {
          for (j1 = j0 + 1; j1 < n && sel[j1] == sel[j1 - 1] + 1; ++j1) {
          }
          fn(j0, j1, (static_cast<int64_t>(sel[j0]) * nkv + g) * hd);
        }
      };
      // s[h][j] = q_h·K_j for the group's heads at once.
      for_runs([&](int64_t j0, int64_t j1, int64_t row) {
        k_.mat[0](reinterpret_cast<const uint8_t*>(a.k_cache->f32() + row), nkv * hd * 4, j1 - j0, hd, q, hd, group,
                  s.data() + j0, n);
      });
      for (int64_t h = 0; h < group; ++h) {
        float* sh = s.data() + h * n;
        k_.scale(a.scale, sh, n);
        float mx = n ? *std::max_element(sh, sh + n) : 0.0f;
        float sum = k_.exp_sum(sh, n, mx);
        k_.scale(1.0f / sum, sh, n);
      }
      // o = P·V, run by run.
      std::fill(o.begin(), o.end(), 0.0f);
      for_runs([&](int64_t j0, int64_t j1, int64_t row) {
        k_.gemm_nn(s.data() + j0, n, a.v_cache->f32() + row, nkv * hd, o.data(), hd, group, hd, j1 - j0, true);
      });
      for (int64_t h = 0; h < group; ++h) {
        const float* gate = a.gate->f32() + (t * nh + g * group + h) * hd;
        float* out = a.out->f32() + t * nh * hd + (g * group + h) * hd;
        for (int64_t e = 0; e < hd; ++e) out[e] = o[h * hd + e] * sigmoidf(gate[e]);
      }
    }
  });
}

}  // namespace regolith
