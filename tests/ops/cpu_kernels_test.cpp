// The CPU backend against ref on the sizes its kernels special-case: vector tails (K, dv, hd not
// multiples of 8 or 16), tile remainders (rows not a multiple of the row block, token counts
// around the token block and the 64-token chunk), T = 1 decode versus prefill, GDN chunk edges,
// QSA rows whose blocks are split over threads, experts with one token and with many. Products
// with quantized weights are checked for every weight type on both sides of the token count where
// the backend switches from quant's dot kernels (quantized activations) to FP32 tiles, against the
// float64 product with a bound from the activation rounding (op_bounds.h). Every case runs for
// each instruction set this CPU has and with 1 and 3 threads; the kernels' building blocks and
// the thread pool are checked on their own as well.
#include <atomic>
#include <numeric>
#include <stdexcept>
#include <tuple>

#include "backend/cpu/cpu_backend.h"
#include "backend/ref/ref_backend.h"
#include "core/error.h"
#include "op_bounds.h"

namespace regolith::test {
namespace {

using cpu::Isa;

// cpu within tol·max(1, max|ref|) of ref, as the op tests compare against float64.
void expect_near_ref(Backend& ref, Backend& be, const Tensor& want, const Tensor& got, double tol, const std::string& what) {
  auto w = ref.read_f32(want);
  expect_close(be.read_f32(got), std::vector<double>(w.begin(), w.end()), tol, what);
}

class CpuVsRef : public ::testing::TestWithParam<std::tuple<Isa, int>> {
 protected:
  void SetUp() override {
    if (!cpu::isa_supported(std::get<0>(GetParam()))) GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(std::get<0>(GetParam()));
    be = std::make_unique<CpuBackend>(CpuOptions{.n_threads = std::get<1>(GetParam()), .isa = std::get<0>(GetParam())});
  }
  // The same host values in both backends.
  std::pair<Tensor, Tensor> both(const std::vector<float>& v, std::array<int64_t, 4> ne) {
    return {upload(ref, v, ne), upload(*be, v, ne)};
  }
  RefBackend ref;
  std::unique_ptr<CpuBackend> be;
};

TEST_P(CpuVsRef, MulMatTailsAndTiles) {
  struct Case {
    GgmlType type;
    int64_t K, N;
  };
  std::vector<Case> cases;
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    for (int64_t K : {1, 7, 8, 15, 16, 17, 33, 100, 257}) cases.push_back({t, K, 13});
  for (int64_t K : {32, 96, 160}) cases.push_back({GgmlType::Q8_0, K, 11});
  for (int64_t N : {1, 2, 3, 4, 5, 8, 9, 17, 33}) cases.push_back({GgmlType::F16, 48, N});
  uint32_t seed = 100;
  for (const Case& c : cases)
    for (int64_t T : {1, 2, 3, 4, 5, 7, 13, 64, 65, 130}) {
      if (T > 13 && c.K > 100) continue;
      auto w = make_weight("w", c.type, {c.K, c.N, 1, 1}, random_values(c.K * c.N, ++seed, 0.3f));
      auto x = random_values(c.K * T, ++seed);
      Tensor out = be->alloc_f32(c.N, T);
      be->mul_mat(w->w, upload(*be, x, {c.K, T, 1, 1}), out);
      expect_within(be->read_f32(out), product(*w, exact(x), T),
                    cat("mul_mat ", type_name(c.type), " K=", c.K, " N=", c.N, " T=", T));
    }
}

// Every weight type, around the dot kernels' token limit (16; Q8_0's is 1) and the 16-row chunks
// of the row split: outputs in the wrong row or token, or from another token's activations, are
// far outside the bound.
TEST_P(CpuVsRef, MulMatEveryWeightTypeAndTokenCount) {
  uint32_t seed = 300;
  for (GgmlType type : every_weight_type()) {
    int64_t block = traits(type).block_size, K = block == 1 ? 100 : block == 256 ? 512 : 3 * block;
    for (int64_t N : {1, 7, 16, 37}) {
      auto w = make_weight("w", type, {K, N, 1, 1}, random_values(K * N, ++seed, 0.3f));
      for (int64_t T : {1, 2, 3, 8, 9, 16, 17, 33}) {
        auto x = random_values(K * T, ++seed);
        Tensor out = be->alloc_f32(N, T);
        be->mul_mat(w->w, upload(*be, x, {K, T, 1, 1}), out);
        expect_within(be->read_f32(out), product(*w, exact(x), T),
                      cat("mul_mat ", type_name(type), " K=", K, " N=", N, " T=", T));
      }
    }
  }
}

TEST_P(CpuVsRef, GetRowsEveryDirectTypeAndDequantized) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0}) {
    int64_t n = type == GgmlType::Q8_0 || type == GgmlType::Q4_0 ? 96 : 37;
    auto table = make_weight("table", type, {n, 29, 1, 1}, random_values(n * 29, 7));
    std::vector<int64_t> ids{28, 0, 5, 5, 17, 3, 28};
    Tensor ro = ref.alloc_f32(n, 7), co = be->alloc_f32(n, 7);
    ref.get_rows(table->w, ids, ro);
    be->get_rows(table->w, ids, co);
    expect_near_ref(ref, *be, ro, co, 0, cat("get_rows ", type_name(type)));
  }
}

TEST_P(CpuVsRef, NormsRopeElementwise) {
  for (int64_t T : {1, 6}) {
    int64_t hd = 19, nh = 3;
    auto x = random_values(hd * nh * T, 10 + T, 2.0f), z = random_values(hd * nh * T, 20 + T);
    auto [rx, cx] = both(x, {hd, nh, T, 1});
    auto [rz, cz] = both(z, {hd * nh, T, 1, 1});
    auto gw = make_weight("g", GgmlType::F32, {hd, 1, 1, 1}, random_values(hd, 30));
    auto fw = make_weight("f", GgmlType::BF16, {hd * nh, 1, 1, 1}, random_values(hd * nh, 31));
    for (const Weight* w : std::vector<const Weight*>{&gw->w, &fw->w, nullptr}) {
      // Per head: rows of hd; grouped (a weight over the whole row): rows of nh·hd normed per hd.
      std::array<int64_t, 4> ne = w == &fw->w ? std::array<int64_t, 4>{hd * nh, T, 1, 1} : std::array<int64_t, 4>{hd, nh, T, 1};
      Tensor ro = ref.alloc(DType::F32, ne), co = be->alloc(DType::F32, ne);
      ref.rms_norm(rx.reshaped(ne), w, hd, 1e-6f, ro);
      be->rms_norm(cx.reshaped(ne), w, hd, 1e-6f, co);
      expect_near_ref(ref, *be, ro, co, 1e-6, cat("rms_norm T=", T, w ? " " + w->name : " no weight"));
    }
    Tensor ro = ref.alloc_f32(hd * nh, T), co = be->alloc_f32(hd * nh, T);
    Tensor rxf = rx.reshaped({hd * nh, T, 1, 1}), cxf = cx.reshaped({hd * nh, T, 1, 1});
    ref.gated_rms_norm(rxf, rz, gw->w, 1e-6f, ro);
    be->gated_rms_norm(cxf, cz, gw->w, 1e-6f, co);
    expect_near_ref(ref, *be, ro, co, 1e-6, cat("gated_rms_norm T=", T));
    ref.swiglu(rxf, rz, ro);
    be->swiglu(cxf, cz, co);
    expect_near_ref(ref, *be, ro, co, 1e-6, cat("swiglu T=", T));
    ref.add(rxf, rz, ro);
    be->add(cxf, cz, co);
    expect_near_ref(ref, *be, ro, co, 0, cat("add T=", T));
    auto [rs, cs] = both(random_values(T, 32), {1, T, 1, 1});
    ref.add_sigmoid_gated(ro, rz, rs);
    be->add_sigmoid_gated(co, cz, cs);
    expect_near_ref(ref, *be, ro, co, 1e-6, cat("add_sigmoid_gated T=", T));

    std::vector<int64_t> pos(T);
    std::iota(pos.begin(), pos.end(), 4093);
    auto [rr, cr] = both(x, {hd, nh, T, 1});
    ref.rope(rr, pos, 10, 1e7f);
    be->rope(cr, pos, 10, 1e7f);
    expect_near_ref(ref, *be, rr, cr, 1e-6, cat("rope T=", T));
  }
}

TEST_P(CpuVsRef, CausalConvTokenCounts) {
  int64_t C = 37, K = 4;
  for (int64_t dil : {1, 3})
    for (int64_t T : {1, 2, 9}) {
      int64_t L = (K - 1) * dil;
      auto w = make_weight("conv", GgmlType::F32, {K, C, 1, 1}, random_values(K * C, 40));
      auto hist = random_values(C * L, 41);
      auto [rh, ch] = both(hist, {C, L, 1, 1});
      auto [rx, cx] = both(random_values(C * T, 42 + T), {C, T, 1, 1});
      Tensor ro = ref.alloc_f32(C, T), co = be->alloc_f32(C, T);
      ref.causal_conv(rx, rh, w->w, dil, ro);
      be->causal_conv(cx, ch, w->w, dil, co);
      expect_near_ref(ref, *be, ro, co, 1e-6, cat("causal_conv dil=", dil, " T=", T));
      expect_near_ref(ref, *be, rh, ch, 0, cat("causal_conv history dil=", dil, " T=", T));
    }
}

TEST_P(CpuVsRef, HcReadWriteAndPleGate) {
  int64_t S = 4, H = 64, W = S * H;
  struct Types {
    GgmlType down, up, inject;
  };
  // The last reads n in two activation formats (Q4_K: Q8_K, Q4_0: Q8_0).
  for (Types ty : {Types{GgmlType::F32, GgmlType::F32, GgmlType::F32}, Types{GgmlType::BF16, GgmlType::BF16, GgmlType::BF16},
                   Types{GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::Q8_0}, Types{GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::Q4_0}})
    for (int64_t T : {1, 5}) {
      int64_t r = is_float_type(ty.up) ? 7 : 32;
      auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 50));
      auto down = make_weight("down", ty.down, {W, r, 1, 1}, random_values(W * r, 51, 0.3f));
      auto up = make_weight("up", ty.up, {r, W, 1, 1}, random_values(r * W, 52, 0.3f));
      auto inject = make_weight("inject", ty.inject, {W, S, 1, 1}, random_values(W * S, 53, 0.3f));
      auto R = random_values(W * T, 54, 2.0f);
      auto [rR, cR] = both(R, {W, T, 1, 1});
      Tensor rx = ref.alloc_f32(H, T), cx = be->alloc_f32(H, T), riw = ref.alloc_f32(S, T), ciw = be->alloc_f32(S, T);
      HcReadArgs args{.R = &rR, .norm = &norm->w, .down = &down->w, .up = &up->w, .inject = &inject->w, .n_streams = S,
                      .eps = 1e-6f, .x = &rx, .inject_w = &riw};
      ref.hc_read(args);
      args.R = &cR, args.x = &cx, args.inject_w = &ciw;
      be->hc_read(args);
      std::string what = cat(" ", type_name(ty.down), "/", type_name(ty.up), "/", type_name(ty.inject), " T=", T);
      HcReadExpected want = hc_read_expected(R, *norm, *down, *up, inject.get(), S, 1e-6);
      expect_within(be->read_f32(cx), want.x, "hc_read x" + what);
      expect_within(be->read_f32(ciw), want.inject_w, "hc_read inject" + what);
      // hc_write on the same inject weights in both.
      auto [ry, cy] = both(random_values(H * T, 55), {H, T, 1, 1});
      auto [rw, cw] = both(ref.read_f32(riw), {S, T, 1, 1});
      ref.hc_write(rR, ry, rw);
      be->hc_write(cR, cy, cw);
      expect_near_ref(ref, *be, rR, cR, 1e-6, "hc_write" + what);

      auto key = random_values(W * T, 56), qry = random_values(W * T, 57);
      for (int64_t d = 0; d < H; ++d) key[d] = 0;  // an exact zero score
      auto [rk, ck] = both(key, {W, T, 1, 1});
      auto [rq, cq] = both(qry, {W, T, 1, 1});
      Tensor rg = ref.alloc_f32(W, T), cg = be->alloc_f32(W, T);
      ref.ple_gate(rk, rq, ry, S, rg);
      be->ple_gate(ck, cq, cy, S, cg);
      expect_near_ref(ref, *be, rg, cg, 1e-6, "ple_gate" + what);
    }
}

TEST_P(CpuVsRef, GdnAwkwardHeadsAndChunkEdges) {
  struct Shape {
    int64_t nk, nv, dk, dv;
  };
  for (Shape s : {Shape{1, 3, 5, 19}, Shape{2, 4, 16, 33}, Shape{2, 2, 32, 64}})
    for (int64_t T : {1, 2, 63, 64, 65, 129}) {
      int64_t C = 2 * s.nk * s.dk + s.nv * s.dv;
      auto qkv = random_values(C * T, 60 + T);
      auto g = random_values(s.nv * T, 61 + T, 0.3f);
      for (float& v : g) v = -std::fabs(v);
      auto beta = random_values(s.nv * T, 62 + T);
      for (float& v : beta) v = 1 / (1 + std::exp(-v));
      auto state = random_values(s.dv * s.dk * s.nv, 63, 0.5f);
      for (bool chunked : {false, true}) {
        auto [rq, cq] = both(qkv, {C, T, 1, 1});
        auto [rg, cg] = both(g, {s.nv, T, 1, 1});
        auto [rb, cb] = both(beta, {s.nv, T, 1, 1});
        auto [rs, cs] = both(state, {s.dv, s.dk, s.nv, 1});
        Tensor ro = ref.alloc_f32(s.dv * s.nv, T), co = be->alloc_f32(s.dv * s.nv, T);
        GdnScanArgs a{.qkv = &rq, .g = &rg, .beta = &rb, .state = &rs, .out = &ro, .n_k_heads = s.nk, .n_v_heads = s.nv,
                      .dk = s.dk, .dv = s.dv};
        chunked ? ref.gdn_chunked(a) : ref.gdn_recurrent(a);
        a.qkv = &cq, a.g = &cg, a.beta = &cb, a.state = &cs, a.out = &co;
        chunked ? be->gdn_chunked(a) : be->gdn_recurrent(a);
        std::string what = cat(chunked ? "gdn_chunked" : "gdn_recurrent", " dk=", s.dk, " dv=", s.dv, " T=", T);
        expect_near_ref(ref, *be, ro, co, 2e-6, what + " out");
        expect_near_ref(ref, *be, rs, cs, 2e-6, what + " state");
      }
    }
}

TEST_P(CpuVsRef, QsaLongRowsAndGroups) {
  int64_t d = 24, ratio = 4, nh_i = 3, n = 1203, nb = n / ratio;  // 300 blocks: rows split over threads
  auto kn = make_weight("k_norm", GgmlType::F32, {d, 1, 1, 1}, random_values(d, 70));
  auto [rraw, craw] = both(random_values(d * n, 71), {d, n, 1, 1});
  Tensor rp = ref.alloc_f32(d, nb + 1), cp = be->alloc_f32(d, nb + 1);
  for (auto [b0, b1] : {std::pair<int64_t, int64_t>{0, 1}, {1, 7}, {7, nb}}) {
    QsaPoolArgs pa{.raw_keys = &rraw, .pooled = &rp, .k_norm = &kn->w, .block_begin = b0, .block_end = b1,
                   .ratio = ratio, .n_rot = 8, .theta = 1e7f, .eps = 1e-6f};
    ref.qsa_pool(pa);
    pa.raw_keys = &craw, pa.pooled = &cp;
    be->qsa_pool(pa);
  }
  expect_near_ref(ref, *be, rp, cp, 1e-6, "qsa_pool");
  // Select on ref's pooled keys in both, so that only the selection itself is compared.
  auto pooled = ref.read_f32(rp);
  Tensor cp_same = upload(*be, pooled, {d, nb + 1, 1, 1});
  for (std::vector<int64_t> pos : {std::vector<int64_t>{n - 1}, std::vector<int64_t>{2, 401, 402, 1202}}) {
    int64_t T = static_cast<int64_t>(pos.size()), top = 9, max_sel = top * ratio + ratio - 1;
    auto iq = random_values(d * nh_i * T, 72 + T);
    auto [riq, ciq] = both(iq, {d, nh_i, T, 1});
    Tensor rsel = ref.alloc(DType::I32, {max_sel, T, 1, 1}), csel = be->alloc(DType::I32, {max_sel, T, 1, 1});
    Tensor rn = ref.alloc(DType::I32, {T, 1, 1, 1}), cn = be->alloc(DType::I32, {T, 1, 1, 1});
    QsaSelectArgs sa{.iq = &riq, .pooled = &rp, .positions = pos, .ratio = ratio, .top_blocks = top, .sel = &rsel, .n_sel = &rn};
    ref.qsa_select(sa);
    sa.iq = &ciq, sa.pooled = &cp_same, sa.sel = &csel, sa.n_sel = &cn;
    be->qsa_select(sa);
    EXPECT_EQ(be->read_i32(cn), ref.read_i32(rn)) << "qsa_select n_sel T=" << T;
    EXPECT_EQ(be->read_i32(csel), ref.read_i32(rsel)) << "qsa_select sel T=" << T;

    // Attention over that selection: 6 heads on 2 kv heads, head width 17.
    int64_t hd = 17, nh = 6, nkv = 2;
    auto [rq, cq] = both(random_values(hd * nh * T, 73), {hd, nh, T, 1});
    auto [rgt, cgt] = both(random_values(hd * nh * T, 74), {hd, nh, T, 1});
    auto [rk, ck] = both(random_values(hd * nkv * n, 75), {hd, nkv, n, 1});
    auto [rv, cv] = both(random_values(hd * nkv * n, 76), {hd, nkv, n, 1});
    Tensor ro = ref.alloc_f32(hd * nh, T), co = be->alloc_f32(hd * nh, T);
    QsaAttendArgs aa{.q = &rq, .gate = &rgt, .k_cache = &rk, .v_cache = &rv, .sel = &rsel, .n_sel = &rn,
                     .scale = 1 / std::sqrt(17.0f), .out = &ro};
    ref.qsa_attend(aa);
    aa.q = &cq, aa.gate = &cgt, aa.k_cache = &ck, aa.v_cache = &cv, aa.sel = &csel, aa.n_sel = &cn, aa.out = &co;
    be->qsa_attend(aa);
    expect_near_ref(ref, *be, ro, co, 1e-6, cat("qsa_attend T=", T));
  }
}

// Experts grouped per call: at T = 33 some experts meet more tokens than the dot kernels take and
// some fewer, so one call runs both paths; at 64 nearly all run FP32 tiles.
TEST_P(CpuVsRef, MoeDecodeAndGroupedPrefill) {
  int64_t E = 9, k = 3, H = 256, F = 256;
  struct Types {
    GgmlType gate, up, down;
  };
  // Q4_0 gate and Q4_K up read the pairs' inputs in two activation formats.
  std::vector<Types> types{{GgmlType::Q8_0, GgmlType::F16, GgmlType::Q8_0}, {GgmlType::BF16, GgmlType::BF16, GgmlType::BF16},
                           {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::IQ4_NL}, {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K},
                           {GgmlType::IQ2_XXS, GgmlType::IQ3_S, GgmlType::Q5_K}};
  std::vector<std::array<std::unique_ptr<OwnedWeight>, 3>> weights;
  for (Types ty : types)
    weights.push_back({make_weight("gate", ty.gate, {H, F, E, 1}, random_values(H * F * E, 81, 0.1f)),
                       make_weight("up", ty.up, {H, F, E, 1}, random_values(H * F * E, 82, 0.1f)),
                       make_weight("down", ty.down, {F, H, E, 1}, random_values(F * H * E, 83, 0.1f))});
  for (int64_t T : {1, 2, 7, 33, 64}) {
    auto logits = random_values(E * T, 80 + T, 2.0f);
    logits[0] = logits[1] = 9.0f;  // a tie: lower id first
    auto [rl, cl] = both(logits, {E, T, 1, 1});
    Tensor rids = ref.alloc(DType::I32, {k, T, 1, 1}), cids = be->alloc(DType::I32, {k, T, 1, 1});
    Tensor rw = ref.alloc_f32(k, T), cw = be->alloc_f32(k, T);
    ref.moe_route(rl, k, rids, rw);
    be->moe_route(cl, k, cids, cw);
    ASSERT_EQ(be->read_i32(cids), ref.read_i32(rids)) << "moe_route ids T=" << T;
    expect_near_ref(ref, *be, rw, cw, 1e-6, cat("moe_route weights T=", T));
    auto x = random_values(H * T, 84);
    Tensor cx = upload(*be, x, {H, T, 1, 1}), co = be->alloc_f32(H, T);
    for (size_t i = 0; i < types.size(); ++i) {
      const auto& [wg, wu, wd] = weights[i];
      be->moe_experts({.x = &cx, .gate_exps = &wg->w, .up_exps = &wu->w, .down_exps = &wd->w, .ids = &cids,
                       .weights = &cw, .out = &co});
      expect_within(be->read_f32(co), moe_experts_expected(x, be->read_i32(cids), be->read_f32(cw), *wg, *wu, *wd, k),
                    cat("moe_experts ", type_name(types[i].gate), "/", type_name(types[i].up), "/",
                        type_name(types[i].down), " T=", T));
    }
  }
}

TEST_P(CpuVsRef, BadInputsThrowLikeRef) {
  auto table = make_weight("table", GgmlType::F16, {7, 13, 1, 1}, random_values(7 * 13, 1));
  Tensor out = be->alloc_f32(7, 1);
  std::vector<int64_t> bad{13};
  EXPECT_THROW(be->get_rows(table->w, bad, out), Error);
  auto w = make_weight("w", GgmlType::F32, {8, 4, 1, 1}, random_values(32, 2));
  Tensor x = be->alloc_f32(9, 2), o = be->alloc_f32(4, 2);
  EXPECT_THROW(be->mul_mat(w->w, x, o), Error);
  int64_t E = 4, k = 2, H = 32, F = 32;
  auto wg = make_weight("gate", GgmlType::F32, {H, F, E, 1}, random_values(H * F * E, 3));
  Tensor ids = upload_i32(*be, {0, 4}, {k, 1, 1, 1}), wts = be->alloc_f32(k, 1), mx = be->alloc_f32(H, 1), mo = be->alloc_f32(H, 1);
  EXPECT_THROW(be->moe_experts({.x = &mx, .gate_exps = &wg->w, .up_exps = &wg->w, .down_exps = &wg->w, .ids = &ids,
                                .weights = &wts, .out = &mo}),
               Error);
}

INSTANTIATE_TEST_SUITE_P(IsaThreads, CpuVsRef,
                         ::testing::Combine(::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512), ::testing::Values(1, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, int>>& info) {
                           return cat(cpu::isa_name(std::get<0>(info.param)), "_t", std::get<1>(info.param));
                         });

// ---- building blocks ----------------------------------------------------------------------

class CpuKernels : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!cpu::isa_supported(GetParam())) GTEST_SKIP() << "this CPU lacks " << cpu::isa_name(GetParam());
  }
  const cpu::Kernels& k() { return cpu::kernels(GetParam()); }
};

TEST_P(CpuKernels, GemmNnEveryRemainder) {
  for (int64_t M : {1, 3, 4, 5, 9})
    for (int64_t N : {1, 7, 8, 16, 17, 31, 32, 33, 70})
      for (int64_t K : {1, 5, 64})
        for (bool accumulate : {false, true}) {
          int64_t lda = K + 3, ldb = N + 2, ldc = N + 5;
          auto A = random_values(M * lda, 1), B = random_values(K * ldb, 2), C = random_values(M * ldc, 3);
          std::vector<double> want(C.begin(), C.end());
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = 0; j < N; ++j) {
              double s = accumulate ? C[m * ldc + j] : 0.0;
              for (int64_t kk = 0; kk < K; ++kk) s += static_cast<double>(A[m * lda + kk]) * B[kk * ldb + j];
              want[m * ldc + j] = s;
            }
          k().gemm_nn(A.data(), lda, B.data(), ldb, C.data(), ldc, M, N, K, accumulate);
          expect_close(C, want, 1e-6, cat("gemm_nn M=", M, " N=", N, " K=", K, accumulate ? " +=" : ""));
        }
}

TEST_P(CpuKernels, VectorTails) {
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 100}) {
    auto a = random_values(n, 4), b = random_values(n, 5);
    double d = 0;
    for (int64_t i = 0; i < n; ++i) d += static_cast<double>(a[i]) * b[i];
    EXPECT_NEAR(k().dot(a.data(), b.data(), n), d, 1e-5) << "dot n=" << n;
    EXPECT_NEAR(k().dot_f64(a.data(), b.data(), n), d, 1e-12) << "dot_f64 n=" << n;
    auto y = b;
    y.push_back(42.0f);  // a guard past the end
    k().axpy(0.5f, a.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], b[i] + 0.5f * a[i]) << "axpy n=" << n;
    EXPECT_EQ(y[n], 42.0f) << "axpy wrote past n=" << n;
    k().scale(2.0f, y.data(), n);
    EXPECT_EQ(y[n], 42.0f) << "scale wrote past n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, CpuKernels, ::testing::Values(Isa::scalar, Isa::avx2, Isa::avx512),
                         [](const ::testing::TestParamInfo<Isa>& info) { return std::string(cpu::isa_name(info.param)); });

TEST(CpuThreadPool, EveryIndexOnceAndErrorsPropagate) {
  cpu::ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 100, 1001})
    for (int64_t grain : {1, 3, 64, 5000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
        EXPECT_LE(e - b, grain);
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain << " i=" << i;
    }
  // A nested call runs on its caller; an exception from any chunk reaches the caller once.
  std::atomic<int64_t> inner{0};
  pool.parallel_for(8, 1, [&](int64_t, int64_t) { pool.parallel_for(10, 2, [&](int64_t b, int64_t e) { inner += e - b; }); });
  EXPECT_EQ(inner.load(), 80);
  EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t b, int64_t) { if (b == 57) throw std::runtime_error("chunk 57"); }),
               std::runtime_error);
  std::atomic<int64_t> after{0};
  pool.parallel_for(100, 7, [&](int64_t b, int64_t e) { after += e - b; });
  EXPECT_EQ(after.load(), 100) << "the pool works after an exception";
}

// Back-to-back jobs of changing sizes: a worker still holding the previous job's state must not
// claim a chunk of the job being set up (it once could, running chunks twice or never finishing).
TEST(CpuThreadPool, BackToBackJobsRunEveryChunkOnce) {
  cpu::ThreadPool pool(4);
  for (int job = 0; job < 20000; ++job) {
    int64_t n = 1 + (job * 7919) % 300, grain = 1 + job % 5;
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "job " << job << " n=" << n << " i=" << i;
  }
}

}  // namespace
}  // namespace regolith::test
