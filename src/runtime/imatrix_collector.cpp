#include "runtime/imatrix_collector.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "gguf/gguf.h"

namespace regolith {
namespace {

// Expert `e` of a stacked {K, N, E} weight as a {K, N} matrix.
Weight expert_view(const Weight& w, int64_t e) {
  Weight v = w;
  v.ne = {w.ne[0], w.ne[1], 1, 1};
  v.data = w.data + e * w.ne[1] * w.row_bytes;
  return v;
}

}  // namespace

ImatrixCollector::ImatrixCollector(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

ImatrixEntry& ImatrixCollector::entry(const Weight& w, int64_t n_mat) {
  ImatrixEntry& e = entries_[w.name];
  if (e.counts.empty()) {
    e.row_len = w.ne[0];
    e.in_sum2.assign(n_mat * w.ne[0], 0.0);
    e.counts.assign(n_mat, 0);
  } else if (e.row_len != w.ne[0] || static_cast<int64_t>(e.counts.size()) != n_mat) {
    fail("imatrix: ", w.name, " is used as ", n_mat, " matrices of rows of ", w.ne[0], " and as ", e.counts.size(),
         " of ", e.row_len);
  }
  return e;
}

void ImatrixCollector::accumulate(const Weight& w, int64_t n_mat, int64_t mat, const float* rows, int64_t n) {
  ImatrixEntry& e = entry(w, n_mat);
  double* sum = e.in_sum2.data() + mat * e.row_len;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = rows + r * e.row_len;
    for (int64_t i = 0; i < e.row_len; ++i) sum[i] += static_cast<double>(x[i]) * x[i];
  }
  e.counts[mat] += n;
}

void ImatrixCollector::mul_mat(const Weight& w, const Tensor& x, Tensor& out) {
  inner_->mul_mat(w, x, out);
  std::vector<float> xv = inner_->read_f32(x);
  accumulate(w, 1, 0, xv.data(), x.ne(1));
}

void ImatrixCollector::mul_mat_shared_input(std::span<const Weight* const> ws, const Tensor& x,
                                            std::span<Tensor* const> outs) {
  inner_->mul_mat_shared_input(ws, x, outs);
  std::vector<float> xv = inner_->read_f32(x);
  for (const Weight* w : ws) accumulate(*w, 1, 0, xv.data(), x.ne(1));
}

void ImatrixCollector::moe_experts(const MoeExpertsArgs& a) {
  inner_->moe_experts(a);
  const Weight &wg = *a.gate_exps, &wu = *a.up_exps, &wd = *a.down_exps;
  const int64_t H = wg.ne[0], F = wg.ne[1], E = wg.ne[2], T = a.x->ne(1), k = a.ids->ne(0);
  std::vector<float> x = inner_->read_f32(*a.x);
  std::vector<int32_t> ids = inner_->read_i32(*a.ids);
  std::vector<std::vector<int64_t>> routed(E);  // tokens per expert
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      if (e < 0 || e >= E) fail("imatrix: expert id ", e, " outside ", wg.name, "'s ", E, " experts");
      routed[e].push_back(t);
    }
  for (const Weight* w : {&wg, &wu, &wd}) entry(*w, E);  // every expert has a row, routed or not
  std::vector<float> xe;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t n = static_cast<int64_t>(routed[e].size());
    if (n == 0) continue;
    xe.resize(n * H);
    for (int64_t i = 0; i < n; ++i) std::copy_n(x.data() + routed[e][i] * H, H, xe.data() + i * H);
    accumulate(wg, E, e, xe.data(), n);
    accumulate(wu, E, e, xe.data(), n);
    // The down projection's input: silu(gate_e·x) ⊙ up_e·x of each routed token.
    Tensor xt = inner_->alloc_f32(H, n), g = inner_->alloc_f32(F, n), u = inner_->alloc_f32(F, n),
           h = inner_->alloc_f32(F, n);
    inner_->write(xt, xe.data(), xe.size() * sizeof(float));
    inner_->mul_mat(expert_view(wg, e), xt, g);
    inner_->mul_mat(expert_view(wu, e), xt, u);
    inner_->swiglu(g, u, h);
    std::vector<float> hv = inner_->read_f32(h);
    accumulate(wd, E, e, hv.data(), n);
  }
}

void ImatrixCollector::hc_read(const HcReadArgs& a) {
  inner_->hc_read(a);
  const int64_t W = a.R->ne(0), T = a.R->ne(1), S = a.n_streams, r = a.down->ne[1];
  // down and inject multiply the grouped-normed streams n; up multiplies silu(down·n / S).
  Tensor n = inner_->alloc_f32(W, T), lo = inner_->alloc_f32(r, T);
  inner_->rms_norm(*a.R, a.norm, W / S, a.eps, n);
  std::vector<float> nv = inner_->read_f32(n);
  accumulate(*a.down, 1, 0, nv.data(), T);
  if (a.inject) accumulate(*a.inject, 1, 0, nv.data(), T);
  inner_->mul_mat(*a.down, n, lo);
  std::vector<float> lv = inner_->read_f32(lo);
  for (float& v : lv) {
    const double s = v / static_cast<double>(S);
    v = static_cast<float>(s / (1.0 + std::exp(-s)));
  }
  accumulate(*a.up, 1, 0, lv.data(), T);
}

void ImatrixCollector::write_gguf(const std::string& path, const std::vector<std::string>& datasets,
                                  uint32_t chunk_count, uint32_t chunk_size) const {
  if (entries_.empty()) fail("imatrix: nothing was collected");
  GgufWriter w(path);
  w.set("general.type", "imatrix");
  w.set("imatrix.datasets", GgufValue::array(GgufType::STRING, datasets));
  w.set("imatrix.chunk_count", chunk_count);
  w.set("imatrix.chunk_size", chunk_size);
  for (const auto& [name, e] : entries_) {
    const int64_t n_mat = static_cast<int64_t>(e.counts.size());
    w.add_tensor(name + ".in_sum2", GgmlType::F32, {e.row_len, n_mat});
    w.add_tensor(name + ".counts", GgmlType::F32, {1, n_mat});
  }
  w.write_header();
  auto put = [&](const std::vector<float>& v) {
    w.write_data({reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
  };
  for (const auto& [name, e] : entries_) {
    std::vector<float> sums(e.in_sum2.begin(), e.in_sum2.end()), counts(e.counts.begin(), e.counts.end());
    for (float v : sums)
      if (!std::isfinite(v)) fail("imatrix: non-finite activation sums for ", name);
    put(sums);
    put(counts);
  }
  w.finish();
}

}  // namespace regolith
