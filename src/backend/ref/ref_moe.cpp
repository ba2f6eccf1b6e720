// Reference MoE: softmax router with renormalised top-k, and the routed SwiGLU experts (model-spec §4.6).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/ref/ref_backend.h"
#include "backend/ref/ref_util.h"

namespace regolith {

using namespace ref;

void RefBackend::moe_route(const Tensor& logits, int64_t k, Tensor& ids, Tensor& weights) {
  check_moe_route(logits, k, ids, weights);
  int64_t E = logits.ne(0), T = logits.ne(1);
  std::vector<double> p(E);
  std::vector<int32_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits.f32() + t * E;
    double mx = *std::max_element(l, l + E), sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(static_cast<double>(l[e]) - mx);
    for (int64_t e = 0; e < E; ++e) p[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    double top = 0;
    for (int64_t j = 0; j < k; ++j) top += p[order[j]];
    for (int64_t j = 0; j < k; ++j) {
      ids.i32()[t * k + j] = order[j];
      weights.f32()[t * k + j] = static_cast<float>(p[order[j]] / top);
    }
  }
}

void RefBackend::moe_experts(const MoeExpertsArgs& a) {
  check_moe_experts(a);
  const Weight &wg = *a.gate_exps, &wu = *a.up_exps, &wd = *a.down_exps;
  int64_t H = wg.ne[0], F = wg.ne[1], E = wg.ne[2], T = a.x->ne(1), k = a.ids->ne(0);
  parallel_rows(T, 3 * k * F * H, [&](int64_t t0, int64_t t1) {
    RowReader gate(wg), up(wu), down(wd);
    std::vector<float> h(F);
    std::vector<double> y(H);
    for (int64_t t = t0; t < t1; ++t) {
      const float* x = a.x->f32() + t * H;
      std::fill(y.begin(), y.end(), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        int64_t e = a.ids->i32()[t * k + j];
        if (e < 0 || e >= E) fail("moe_experts: expert id ", e, " out of range");
        double w = a.weights->f32()[t * k + j];
        for (int64_t f = 0; f < F; ++f)
          h[f] = static_cast<float>(silu(dot(gate.row(e * F + f), x, H)) * dot(up.row(e * F + f), x, H));
        for (int64_t d = 0; d < H; ++d) y[d] += w * dot(down.row(e * H + d), h.data(), F);
      }
      for (int64_t d = 0; d < H; ++d) a.out->f32()[t * H + d] = static_cast<float>(y[d]);
    }
  });
}

}  // namespace regolith
