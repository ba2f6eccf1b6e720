// CPU MoE (model-spec §4.6): the softmax router with renormalised top-k, and the routed SwiGLU
// experts with tokens grouped per expert, so that each active expert's matrices are read once per
// call whatever the token count: gate/up split over (expert, row range), down split over output
// rows (each thread owns its rows of every token's sum, so no two threads add into one value).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"

namespace regolith {

using namespace cpu;

void CpuBackend::moe_route(const Tensor& logits, int64_t k, Tensor& ids, Tensor& weights) {
  check_moe_route(logits, k, ids, weights);
  int64_t E = logits.ne(0), T = logits.ne(1);
  pool_.parallel_for(T, grain_for(T, E * 16, pool_.size()), [&](int64_t t0, int64_t t1) {
    std::vector<double> p(E);
    std::vector<int32_t> order(E);
    for (int64_t t = t0; t < t1; ++t) {
      // As ref: FP64 softmax, order by probability with ties to the lower id, renormalised top k.
      const float* l = logits.f32() + t * E;
      double mx = *std::max_element(l, l + E), sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(static_cast<double>(l[e]) - mx);
      for (int64_t e = 0; e < E; ++e) p[e] /= sum;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
      double top = 0;
      for (int64_t j = 0; j < k; ++j) top += p[order[j]];
      for (int64_t j = 0; j < k; ++j) {
        ids.i32()[t * k + j] = order[j];
        weights.f32()[t * k + j] = static_cast<float>(p[order[j]] / top);
      }
    }
  });
}

void CpuBackend::moe_experts(const MoeExpertsArgs& a) {
  check_moe_experts(a);
  const Weight &wg = *a.gate_exps, &wu = *a.up_exps, &wd = *a.down_exps;
  int64_t H = wg.ne[0], F = wg.ne[1], E = wg.ne[2], T = a.x->ne(1), k = a.ids->ne(0);

  // Group the (token, slot) pairs by expert: pairs[first[e] .. first[e + 1]) are expert e's.
  int64_t n_pairs = T * k;
  std::vector<int64_t> first(E + 1, 0), pairs(n_pairs);
  for (int64_t p = 0; p < n_pairs; ++p) {
    int64_t e = a.ids->i32()[p];
    if (e < 0 || e >= E) fail("moe_experts: expert id ", e, " out of range");
    ++first[e + 1];
  }
  for (int64_t e = 0; e < E; ++e) first[e + 1] += first[e];
  {
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (int64_t p = 0; p < n_pairs; ++p) pairs[fill[a.ids->i32()[p]]++] = p;
  }
  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (first[e + 1] > first[e]) active.push_back(e);

  // Each expert's inputs side by side: X [pairs][H] in expert order.
  std::vector<float> X(static_cast<size_t>(n_pairs * H));
  for (int64_t i = 0; i < n_pairs; ++i) {
    const float* src = a.x->f32() + (pairs[i] / k) * H;
    std::copy(src, src + H, X.data() + i * H);
  }

  // Tokens meet an expert's rows in groups of n = its pair count; each pair's input is quantized
  // once for the experts whose groups take the dot kernels (mat_input).
  int64_t n_active = static_cast<int64_t>(active.size()), fewest = n_pairs;
  for (int64_t e : active) fewest = std::min(fewest, first[e + 1] - first[e]);
  auto expert_input = [&](const MatInput& in, int64_t e) { return in.tokens(first[e], first[e + 1] - first[e]); };

  // h [pairs][F] = silu(gate_e·x) ⊙ up_e·x, over (expert, rows of F) items.
  QuantizedTokens Xq, hq;
  MatInput X_in = mat_input(pool_, {wg.type, wu.type}, fewest, X.data(), H, H, n_pairs, Xq);
  std::vector<float> h(static_cast<size_t>(n_pairs * F));
  int64_t pieces = std::max<int64_t>(1, (4 * pool_.size() + n_active - 1) / std::max<int64_t>(1, n_active));
  int64_t f_grain = std::min(F, ((F + pieces - 1) / pieces + 15) / 16 * 16);
  int64_t f_pieces = (F + f_grain - 1) / f_grain;
  int64_t n_items = n_active * f_pieces;
  // Items come in about four per thread already; claimed one at a time, so that no thread holds a
  // second expert while another waits (a call too small to split stays on the caller).
  int64_t item_cost = 2 * n_pairs * F * H / std::max<int64_t>(1, n_items);
  int64_t item_grain = grain_for(n_items, item_cost, pool_.size()) < n_items ? 1 : n_items;
  pool_.parallel_for(n_items, item_grain, [&](int64_t i0, int64_t i1) {
    std::vector<float> g, u;
    for (int64_t i = i0; i < i1; ++i) {
      int64_t e = active[i / f_pieces], f0 = (i % f_pieces) * f_grain, f1 = std::min(F, f0 + f_grain);
      int64_t p0 = first[e], n = first[e + 1] - p0, nf = f1 - f0;
      MatInput in = expert_input(X_in, e);
      g.resize(n * nf), u.resize(n * nf);
      mat_rows(k_, rows_of(wg, e * F), f0, f1, in, g.data(), nf);
      mat_rows(k_, rows_of(wu, e * F), f0, f1, in, u.data(), nf);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t f = 0; f < nf; ++f) h[(p0 + j) * F + f0 + f] = siluf(g[j * nf + f]) * u[j * nf + f];
    }
  });

  // out[t][d] = Σ_slots w·(down_e·h)[d], over ranges of d.
  float* out = a.out->f32();
  std::fill(out, out + T * H, 0.0f);
  MatInput h_in = mat_input(pool_, {wd.type}, fewest, h.data(), F, F, n_pairs, hq);
  int64_t d_grain = grain_for(H, n_pairs * F, pool_.size());
  pool_.parallel_for(H, d_grain, [&](int64_t d0, int64_t d1) {
    std::vector<float> y;
    int64_t nd = d1 - d0;
    for (int64_t e : active) {
      int64_t p0 = first[e], n = first[e + 1] - p0;
      y.resize(n * nd);
      mat_rows(k_, rows_of(wd, e * H), d0, d1, expert_input(h_in, e), y.data(), nd);
      for (int64_t j = 0; j < n; ++j) {
        int64_t p = pairs[p0 + j];
        k_.axpy(a.weights->f32()[p], y.data() + j * nd, out + (p / k) * H + d0, nd);
      }
    }
  });
}

}  // namespace regolith
