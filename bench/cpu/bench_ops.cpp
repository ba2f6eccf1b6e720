// Per-op timing, ref against cpu, at one geometry and token count: every op of ops.h that the
// forward pass calls, on shapes the model gives it. Weight-reading ops also report GB/s of weight
// bytes (the decode roofline); the others are timed for their share of a step.
#include "bench_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace regolith::bench {
namespace {

// The weights of every case, built once and read by both backends.
struct Weights {
  std::unique_ptr<BenchWeight> qkv, lm_head, hc_norm, hc_down, hc_up, hc_inject, conv, ssm_a, dt_bias, gdn_norm;
  std::unique_ptr<BenchWeight> k_norm, gate_exps, up_exps, down_exps;
  Weights(const Geometry& g, GgmlType type) {
    int64_t W = g.S * g.H, C = 2 * g.nk * g.dk + g.nv * g.dv;
    qkv = random_weight("gdn.qkv", type, {g.H, C, 1, 1}, 1);
    lm_head = random_weight("output", type, {g.H, g.vocab, 1, 1}, 2);
    hc_norm = random_weight("hc.norm", GgmlType::F32, {W, 1, 1, 1}, 3, 1.0f);
    hc_down = random_weight("hc.down", type, {W, g.r, 1, 1}, 4);
    hc_up = random_weight("hc.up", type, {g.r, W, 1, 1}, 5);
    hc_inject = random_weight("hc.inject", type, {W, g.S, 1, 1}, 6);
    conv = random_weight("gdn.conv", GgmlType::F32, {4, C, 1, 1}, 7, 0.5f);
    ssm_a = random_weight("ssm_a", GgmlType::F32, {g.nv, 1, 1, 1}, 8, 1.0f);
    for (int64_t h = 0; h < g.nv; ++h) reinterpret_cast<float*>(ssm_a->bytes.data())[h] = -0.5f;
    dt_bias = random_weight("dt_bias", GgmlType::F32, {g.nv, 1, 1, 1}, 9, 1.0f);
    gdn_norm = random_weight("gdn.norm", GgmlType::F32, {g.dv, 1, 1, 1}, 10, 1.0f);
    k_norm = random_weight("index_k_norm", GgmlType::F32, {g.di, 1, 1, 1}, 11, 1.0f);
    gate_exps = random_weight("gate_exps", type, {g.H, g.F, g.E, 1}, 12);
    up_exps = random_weight("up_exps", type, {g.H, g.F, g.E, 1}, 13);
    down_exps = random_weight("down_exps", type, {g.F, g.H, g.E, 1}, 14);
  }
};

Tensor upload(Backend& be, const std::vector<float>& v, std::array<int64_t, 4> ne) {
  Tensor t = be.alloc(DType::F32, ne);
  be.write(t, v.data(), v.size() * 4);
  return t;
}

struct OpCase {
  std::string name;
  uint64_t weight_bytes = 0;
  std::function<void()> run;
};

// The cases on one backend; inputs live in that backend's memory.
std::vector<OpCase> make_cases(Backend& be, const Geometry& g, const Weights& w, int64_t T) {
  int64_t H = g.H, W = g.S * g.H, C = 2 * g.nk * g.dk + g.nv * g.dv;
  std::vector<OpCase> cases;
  auto f32 = [&](int64_t a, int64_t b = 1, int64_t c = 1) { return be.alloc_f32(a, b, c); };
  Tensor x = upload(be, random_values(H * T, 20), {H, T, 1, 1});
  Tensor R = upload(be, random_values(W * T, 21), {W, T, 1, 1});
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = g.ctx - T + t;

  {
    Tensor out = f32(C, T);
    cases.push_back({cat("mul_mat gdn.qkv ", H, "x", C), w.qkv->n_bytes(), [&be, &w, x, out]() mutable { be.mul_mat(w.qkv->w, x, out); }});
    Tensor logits = f32(g.vocab, T);
    cases.push_back({cat("mul_mat output ", H, "x", g.vocab), w.lm_head->n_bytes(),
                     [&be, &w, x, logits]() mutable { be.mul_mat(w.lm_head->w, x, logits); }});
  }
  {
    Tensor hx = f32(H, T), iw = f32(g.S, T);
    cases.push_back({cat("hc_read W=", W, " r=", g.r), w.hc_down->n_bytes() + w.hc_up->n_bytes() + w.hc_inject->n_bytes(),
                     [&be, &w, &g, R, hx, iw]() mutable {
                       be.hc_read({.R = &R, .norm = &w.hc_norm->w, .down = &w.hc_down->w, .up = &w.hc_up->w,
                                   .inject = &w.hc_inject->w, .n_streams = g.S, .eps = 1e-6f, .x = &hx, .inject_w = &iw});
                     }});
    Tensor R2 = upload(be, random_values(W * T, 22), {W, T, 1, 1});
    Tensor iw2 = upload(be, random_values(g.S * T, 23, 0.01f), {g.S, T, 1, 1});
    cases.push_back({cat("hc_write W=", W), 0, [&be, R2, x, iw2]() mutable { be.hc_write(R2, x, iw2); }});
    Tensor n = f32(W, T);
    cases.push_back({cat("rms_norm grouped W=", W), 0, [&be, &w, &g, R, n]() mutable { be.rms_norm(R, &w.hc_norm->w, g.H, 1e-6f, n); }});
  }
  {
    Tensor q = upload(be, random_values(g.hd * g.nh * T, 24), {g.hd, g.nh, T, 1});
    cases.push_back({cat("rope ", g.nh, "x", g.hd, " n_rot=", g.n_rot), 0,
                     [&be, &g, q, pos]() mutable { be.rope(q, pos, g.n_rot, 1e7f); }});
  }
  {
    Tensor qkv = upload(be, random_values(C * T, 25), {C, T, 1, 1}), hist = f32(C, 3), u = f32(C, T);
    cases.push_back({cat("causal_conv C=", C), w.conv->n_bytes(), [&be, &w, qkv, hist, u]() mutable {
                       be.causal_conv(qkv, hist, w.conv->w, 1, u);
                     }});
    Tensor alpha = upload(be, random_values(g.nv * T, 26), {g.nv, T, 1, 1});
    Tensor braw = upload(be, random_values(g.nv * T, 27), {g.nv, T, 1, 1});
    Tensor gg = f32(g.nv, T), beta = f32(g.nv, T);
    cases.push_back({cat("gdn_gates nv=", g.nv), 0, [&be, &w, alpha, braw, gg, beta]() mutable {
                       be.gdn_gates(alpha, braw, w.ssm_a->w, w.dt_bias->w, gg, beta);
                     }});
    be.gdn_gates(alpha, braw, w.ssm_a->w, w.dt_bias->w, gg, beta);
    Tensor state = upload(be, random_values(g.dv * g.dk * g.nv, 28, 0.1f), {g.dv, g.dk, g.nv, 1});
    Tensor o = f32(g.dv * g.nv, T);
    cases.push_back({cat(T == 1 ? "gdn_recurrent " : "gdn_chunked ", g.nv, "x", g.dk, "x", g.dv), 0,
                     [&be, &g, u, gg, beta, state, o]() mutable {
                       be.gdn_scan({.qkv = &u, .g = &gg, .beta = &beta, .state = &state, .out = &o, .n_k_heads = g.nk,
                                    .n_v_heads = g.nv, .dk = g.dk, .dv = g.dv});
                     }});
    Tensor z = upload(be, random_values(g.dv * g.nv * T, 29), {g.dv * g.nv, T, 1, 1}), on = f32(g.dv * g.nv, T);
    cases.push_back({cat("gated_rms_norm ", g.nv, "x", g.dv), 0,
                     [&be, &w, o, z, on]() mutable { be.gated_rms_norm(o, z, w.gdn_norm->w, 1e-6f, on); }});
  }
  {
    int64_t nb = g.ctx / g.ratio, top_blocks = g.top_k / g.ratio;
    int64_t max_sel = std::min(top_blocks * g.ratio + g.ratio - 1, g.ctx);
    Tensor raw = upload(be, random_values(g.di * g.ctx, 30), {g.di, g.ctx, 1, 1}), pooled = f32(g.di, nb + 1);
    cases.push_back({cat("qsa_pool ", nb, " blocks"), 0, [&be, &w, &g, raw, pooled, nb]() mutable {
                       be.qsa_pool({.raw_keys = &raw, .pooled = &pooled, .k_norm = &w.k_norm->w, .block_begin = 0,
                                    .block_end = nb, .ratio = g.ratio, .n_rot = g.n_rot, .theta = 1e7f, .eps = 1e-6f});
                     }});
    be.qsa_pool({.raw_keys = &raw, .pooled = &pooled, .k_norm = &w.k_norm->w, .block_begin = 0, .block_end = nb,
                 .ratio = g.ratio, .n_rot = g.n_rot, .theta = 1e7f, .eps = 1e-6f});
    Tensor iq = upload(be, random_values(g.di * g.nh_idx * T, 31), {g.di, g.nh_idx, T, 1});
    Tensor sel = be.alloc(DType::I32, {max_sel, T, 1, 1}), n_sel = be.alloc(DType::I32, {T, 1, 1, 1});
    cases.push_back({cat("qsa_select ctx=", g.ctx, " top ", top_blocks), 0,
                     [&be, &g, iq, pooled, pos, sel, n_sel, top_blocks]() mutable {
                       be.qsa_select({.iq = &iq, .pooled = &pooled, .positions = pos, .ratio = g.ratio,
                                      .top_blocks = top_blocks, .sel = &sel, .n_sel = &n_sel});
                     }});
    be.qsa_select({.iq = &iq, .pooled = &pooled, .positions = pos, .ratio = g.ratio, .top_blocks = top_blocks,
                   .sel = &sel, .n_sel = &n_sel});
    Tensor q = upload(be, random_values(g.hd * g.nh * T, 32), {g.hd, g.nh, T, 1});
    Tensor gate = upload(be, random_values(g.hd * g.nh * T, 33), {g.hd, g.nh, T, 1});
    Tensor kc = upload(be, random_values(g.hd * g.nkv * g.ctx, 34), {g.hd, g.nkv, g.ctx, 1});
    Tensor vc = upload(be, random_values(g.hd * g.nkv * g.ctx, 35), {g.hd, g.nkv, g.ctx, 1});
    Tensor o = f32(g.hd * g.nh, T);
    cases.push_back({cat("qsa_attend ", g.nh, "x", g.hd, " over ", max_sel), 0, [&be, &g, q, gate, kc, vc, sel, n_sel, o]() mutable {
                       be.qsa_attend({.q = &q, .gate = &gate, .k_cache = &kc, .v_cache = &vc, .sel = &sel, .n_sel = &n_sel,
                                      .scale = 1.0f / std::sqrt(static_cast<float>(g.hd)), .out = &o});
                     }});
  }
  {
    Tensor logits = upload(be, random_values(g.E * T, 36), {g.E, T, 1, 1});
    Tensor ids = be.alloc(DType::I32, {g.k_used, T, 1, 1}), wts = f32(g.k_used, T);
    cases.push_back({cat("moe_route E=", g.E, " k=", g.k_used), 0,
                     [&be, &g, logits, ids, wts]() mutable { be.moe_route(logits, g.k_used, ids, wts); }});
    be.moe_route(logits, g.k_used, ids, wts);
    // Bytes of the experts this call reads (each distinct expert once).
    std::vector<int32_t> id(static_cast<size_t>(g.k_used * T));
    be.read(ids, id.data(), id.size() * 4);
    std::sort(id.begin(), id.end());
    int64_t distinct = std::unique(id.begin(), id.end()) - id.begin();
    uint64_t per_expert = (w.gate_exps->n_bytes() + w.up_exps->n_bytes() + w.down_exps->n_bytes()) / g.E;
    Tensor y = f32(H, T);
    cases.push_back({cat("moe_experts ", distinct, " of ", g.E, " F=", g.F), per_expert * distinct,
                     [&be, &w, x, ids, wts, y]() mutable {
                       be.moe_experts({.x = &x, .gate_exps = &w.gate_exps->w, .up_exps = &w.up_exps->w,
                                       .down_exps = &w.down_exps->w, .ids = &ids, .weights = &wts, .out = &y});
                     }});
    Tensor gs = upload(be, random_values(g.F_sh * T, 37), {g.F_sh, T, 1, 1});
    Tensor us = upload(be, random_values(g.F_sh * T, 38), {g.F_sh, T, 1, 1}), sh = f32(g.F_sh, T);
    cases.push_back({cat("swiglu ", g.F_sh), 0, [&be, gs, us, sh]() mutable { be.swiglu(gs, us, sh); }});
  }
  {
    Tensor key = upload(be, random_values(W * T, 39), {W, T, 1, 1}), G = f32(W, T);
    cases.push_back({cat("ple_gate W=", W), 0, [&be, &g, key, R, x, G]() mutable { be.ple_gate(key, R, x, g.S, G); }});
    Tensor sum = f32(W, T);
    cases.push_back({cat("add W=", W), 0, [&be, R, key, sum]() mutable { be.add(R, key, sum); }});
  }
  return cases;
}

}  // namespace

void bench_ops(const OpsOptions& o) {
  Geometry g = geometry(o.geometry);
  std::printf("# ops: geometry %s, weights %s, T=%lld, threads %d (cpu), min %.2f s per op\n", g.name.c_str(),
              std::string(type_name(o.type)).c_str(), (long long)o.T, o.n_threads, o.min_seconds);
  Weights w(g, o.type);
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::vector<OpCase>> cases;
  for (const std::string& name : o.backends) {
    backends.push_back(make_bench_backend(name, o.n_threads));
    cases.push_back(make_cases(*backends.back(), g, w, o.T));
  }
  std::printf("%-34s %12s", "op", "weight MB");
  for (const std::string& name : o.backends) std::printf(" %12s", (name + " ms").c_str());
  if (o.backends.size() > 1) std::printf(" %9s", "speedup");
  std::printf(" %10s\n", "last GB/s");
  for (size_t i = 0; i < cases[0].size(); ++i) {
    if (cases[0][i].name.find(o.filter) == std::string::npos) continue;
    std::printf("%-34s %12.2f", cases[0][i].name.c_str(), cases[0][i].weight_bytes / 1e6);
    std::vector<double> ms;
    for (size_t b = 0; b < backends.size(); ++b) {
      Timing t = time_it(cases[b][i].run, 2, o.min_seconds);
      ms.push_back(t.mean_s * 1e3);
      std::printf(" %12.3f", ms.back());
      std::fflush(stdout);
    }
    if (ms.size() > 1) std::printf(" %8.1fx", ms.front() / ms.back());
    if (cases[0][i].weight_bytes)
      std::printf(" %10.2f", cases[0][i].weight_bytes / (ms.back() * 1e-3) / 1e9);
    std::printf("\n");
  }
}

}  // namespace regolith::bench
