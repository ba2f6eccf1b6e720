// The CUDA backend against the reference backend on the sizes its kernels special-case: matvec
// (1..8 tokens) versus tiled GEMM (more), every weight type (each read through its device
// decoder), the products on int8 activations (the int8 tile, and the decode kernel's int8 units:
// against the reference's on activations rounded as quant rounds them) and on FP32 ones (the
// split-TF32 tile and the decode kernels, the backend with exact_products), rows ending in a
// partial 32-value chunk, QSA selection over several scan
// chunks with many exactly tied scores (the chosen blocks must be identical), GDN with value heads
// that do not fill a warp, causal conv's prefill runs against its decode kernel, MoE over many
// tokens. Skips without a device.
#include <cmath>
#include <cstdio>
#include <tuple>

#include "op_bounds.h"
#include "op_test_util.h"
#include "quant/rows.h"

namespace regolith::test {
namespace {

class CudaVsRef : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    cuda = backend_or_skip_reason("cuda", reason);
    if (!cuda) GTEST_SKIP() << reason;
    ref = make_backend("ref");
    cuda_exact = make_backend(BackendOptions{.name = "cuda", .exact_products = true});
  }
  std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
  void expect_products(const OwnedWeight& w, const std::vector<float>& x, int64_t T, const std::vector<float>& got,
                       const std::vector<float>& got_exact, const std::string& what);
  void check_moe_ffn_decode(int64_t E, int64_t F, GgmlType shared_down_type);
  std::unique_ptr<Backend> cuda, ref;
  std::unique_ptr<Backend> cuda_exact;  // products of quantized weights on FP32 activations
};

// The weight types whose prefill products run on the int8 tile (cuda_gemm_int8.cuh).
bool on_int8_tile(GgmlType type) {
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::Q4_K,
                     GgmlType::Q5_K})
    if (t == type) return true;
  return false;
}

// Whether the default backend's product of T tokens with weights of `type` reads activations
// rounded as quant rounds them: on the int8 tile (prefill) or the decode kernel's int8 units.
bool on_int8_activations(GgmlType type, int64_t T) {
  return T > 8 ? on_int8_tile(type) : type == GgmlType::Q8_0 || type == GgmlType::Q4_K;
}

// x's rows of K rounded to the activation format quant pairs with weight_type (Q8_0 or Q8_K),
// as the int8 tile and the int8 units read them.
std::vector<float> rounded_activations(GgmlType weight_type, const std::vector<float>& x, int64_t K) {
  const GgmlType format = quant::activation_type(weight_type);
  std::vector<uint8_t> q(row_bytes(format, K));
  std::vector<float> out(x.size());
  for (size_t r = 0; r < x.size(); r += K) {
    quant::quantize_activations(weight_type, x.data() + r, K, q.data());
    dequantize_row(format, q.data(), K, out.data() + r);
  }
  return out;
}

// Prints the worst error relative to max(1, max|ref|) (the figure expect_close bounds), then checks it.
void report_close(const std::vector<float>& got, const std::vector<double>& want, double tol, const std::string& what) {
  double scale = 1, worst = 0;
  for (double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  std::printf("[cuda-vs-ref] %-28s max rel err %.3e (tol %.1e)\n", what.c_str(), worst / scale, tol);
  expect_close(got, want, tol, what);
}

// FP32 accumulation over K terms against FP64: error grows like sqrt(K) float roundings.
double matmul_tolerance(int64_t K) { return 4e-7 * std::sqrt(static_cast<double>(K)); }

std::vector<float> run_mul_mat(Backend& be, const OwnedWeight& w, const std::vector<float>& x, int64_t T) {
  Tensor out = be.alloc_f32(w.w.ne[1], T);
  be.mul_mat(w.w, upload(be, x, {w.w.ne[0], T, 1, 1}), out);
  return be.read_f32(out);
}

// w·x [T tokens] from the default backend (got) and from cuda_exact (got_exact) against the
// reference's: got_exact's on x, got's on the activations the default backend reads (rounded where
// on_int8_activations), both within FP32 accumulation.
void CudaVsRef::expect_products(const OwnedWeight& w, const std::vector<float>& x, int64_t T,
                                const std::vector<float>& got, const std::vector<float>& got_exact,
                                const std::string& what) {
  const int64_t K = w.w.ne[0];
  const bool int8 = on_int8_activations(w.w.type, T);
  const auto want = widen(run_mul_mat(*ref, w, x, T));
  report_close(got_exact, want, matmul_tolerance(K), what + " exact");
  if (!int8) return report_close(got, want, matmul_tolerance(K), what);
  report_close(got, widen(run_mul_mat(*ref, w, rounded_activations(w.w.type, x, K), T)), matmul_tolerance(K),
               what + " int8");
}

TEST_F(CudaVsRef, MulMatEveryTypeMatvecAndGemm) {
  int64_t K = 512, N = 67;
  std::vector<GgmlType> types{GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,   GgmlType::Q8_0, GgmlType::Q4_0,
                              GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,   GgmlType::Q2_0, GgmlType::IQ4_NL,
                              GgmlType::IQ4_XS, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                              GgmlType::Q6_K, GgmlType::MXFP4, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
                              GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S};
  for (GgmlType type : types) {
    if (!can_quantize(type)) continue;
    auto w = make_weight("w", type, {K, N, 1, 1}, random_values(K * N, 3, 0.2f));
    for (int64_t T : {1, 2, 3, 5, 8, 9, 70}) {
      auto x = random_values(K * T, 100 + T);
      expect_products(*w, x, T, run_mul_mat(*cuda, *w, x, T), run_mul_mat(*cuda_exact, *w, x, T),
                      std::string(type_name(type)) + " T=" + std::to_string(T));
    }
  }
}

// A one-token product of at least CudaBackend::kEarlyReadRows rows (the LM head's case), read by
// read_later: inside a step graph its first rows go to the host beside its last launch and
// read_later copies the rest. What the read returns must equal the product as read_f32 reads it,
// for a fresh input each round (a stale or misplaced part differs): alone, when a second product
// takes the early copy from the first (the first is then read whole), and with the graph reused.
TEST_F(CudaVsRef, LargeProductReadLaterInTwoParts) {
  const int64_t K = 64, N = 70000;
  auto w = make_weight("w", GgmlType::Q8_0, {K, N, 1, 1}, random_values(K * N, 31, 0.2f));
  for (int round = 0; round < 4; ++round) {
    const std::string what = "round " + std::to_string(round);
    Tensor x = upload(*cuda, random_values(K, 40 + round), {K, 1, 1, 1});
    Tensor first = cuda->alloc_f32(N, 1), second = cuda->alloc_f32(N, 1);
    cuda->mul_mat(w->w, x, first);
    if (round == 2) {
      Tensor y = upload(*cuda, random_values(K, 50), {K, 1, 1, 1});
      cuda->mul_mat(w->w, y, second);
      std::unique_ptr<PendingRead> read_second = cuda->read_later(second);
      const std::span<const float> got = read_second->wait();
      EXPECT_EQ(std::vector<float>(got.begin(), got.end()), cuda->read_f32(second)) << what << " second product";
    }
    std::unique_ptr<PendingRead> read = cuda->read_later(first);
    const std::span<const float> got = read->wait();
    EXPECT_EQ(std::vector<float>(got.begin(), got.end()), cuda->read_f32(first)) << what;
  }
}

TEST_F(CudaVsRef, MulMatPartialChunk) {
  for (int64_t K : {7, 100, 1000}) {
    int64_t N = 33;
    for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
      auto w = make_weight("w", type, {K, N, 1, 1}, random_values(K * N, 5, 0.3f));
      for (int64_t T : {1, 4, 65}) {
        auto x = random_values(K * T, 7 + T);
        Tensor oc = cuda->alloc_f32(N, T), orf = ref->alloc_f32(N, T);
        cuda->mul_mat(w->w, upload(*cuda, x, {K, T, 1, 1}), oc);
        ref->mul_mat(w->w, upload(*ref, x, {K, T, 1, 1}), orf);
        report_close(cuda->read_f32(oc), widen(ref->read_f32(orf)), matmul_tolerance(K),
                     std::string(type_name(type)) + " K=" + std::to_string(K) + " T=" + std::to_string(T));
      }
    }
  }
}

// Pooled keys written directly: 300 blocks, a third of them zero (score exactly 0 after the relu)
// and pairs of equal rows (equal positive scores). A few tokens (decode's quad of threads a block:
// d = 16 read as vectors, d = 40 a value at a time) and 150 (prefill's tiles of 64 tokens × 64
// blocks; d = 40 is not a multiple of the tiles' 32-value slices). Then 2,600 blocks, so that the
// selection kernel's warps each place the picks of a run of 96 blocks or fewer and the ties at the
// threshold fall in many runs; then 17,600, more than the selection kernel holds in shared memory
// (it reads them from global memory in each round). Then rows of other shapes, for the selection
// kernel's rounds of buckets: scores over 40 binades (rows scaled by powers of two), three score
// values only (the count reaches k inside a group of 867 equal keys: rounds down to one key value),
// and every score equal.
enum class PooledShape { ZerosAndPairs, Binades, ThreeRows, OneRow };

TEST_F(CudaVsRef, QsaSelectionIdenticalWithTies) {
  const int64_t nh = 3, ratio = 4;
  std::vector<int64_t> many;
  for (int64_t t = 0; t < 150; ++t) many.push_back(t * 8 + t % 5);
  auto check = [&](const std::vector<int64_t>& pos, int64_t d, int64_t nb, const std::vector<int64_t>& tops,
                   PooledShape shape = PooledShape::ZerosAndPairs) {
    auto pooled_v = random_values(d * nb, 70);
    for (int64_t b = 0; b < nb; ++b) {
      float* row = pooled_v.data() + b * d;
      switch (shape) {
        case PooledShape::ZerosAndPairs:
          if (b % 3 == 1) std::fill(row, row + d, 0.0f);
          if (b % 7 == 5) std::copy(row - d, row, row);
          break;
        case PooledShape::Binades:
          for (int64_t i = 0; i < d; ++i) row[i] = std::ldexp(row[i], -static_cast<int>(b % 40));
          break;
        case PooledShape::ThreeRows:
          if (b >= 3) std::copy(row - 3 * d, row - 2 * d, row);
          break;
        case PooledShape::OneRow:
          if (b >= 1) std::copy(row - d, row, row);
          break;
      }
    }
    const int64_t T = static_cast<int64_t>(pos.size());
    for (int64_t top : tops) {
      int64_t max_sel = top * ratio + ratio - 1;
      auto iq = random_values(d * nh * T, 71 + top);
      std::vector<int32_t> got[2];
      std::vector<int32_t> got_n[2];
      int i = 0;
      for (Backend* be : {cuda.get(), ref.get()}) {
        Tensor pooled = upload(*be, pooled_v, {d, nb, 1, 1}), tiq = upload(*be, iq, {d, nh, T, 1});
        Tensor sel = be->alloc(DType::I32, {max_sel, T, 1, 1}), n_sel = be->alloc(DType::I32, {T, 1, 1, 1});
        be->qsa_select({.iq = &tiq, .pooled = &pooled, .positions = pos, .ratio = ratio, .top_blocks = top, .sel = &sel,
                        .n_sel = &n_sel});
        got[i] = be->read_i32(sel);
        got_n[i] = be->read_i32(n_sel);
        ++i;
      }
      EXPECT_EQ(got_n[0], got_n[1]) << "T " << T << " top " << top;
      EXPECT_EQ(got[0], got[1]) << "T " << T << " top " << top;
    }
  };
  const std::vector<int64_t> tops = {1, 5, 37, 200, 400};
  check({0, 3, 9, 150, 700, 1023, 1199, 1201, 1202}, 16, 300, tops);
  check(many, 40, 300, tops);
  check({2051, 4100, 7003, 10398, 10399, 10402}, 16, 2600, {1, 37, 512, 1500, 2599});
  check({30000, 66000, 70003}, 16, 17600, {1, 512, 17000});
  check({10398, 10402}, 16, 2600, {1, 37, 512, 1500}, PooledShape::Binades);
  check({10398, 10402}, 16, 2600, {1, 37, 512, 1000, 1500}, PooledShape::ThreeRows);
  check({10398, 10402}, 16, 2600, {1, 512}, PooledShape::OneRow);
}

TEST_F(CudaVsRef, GdnPartialWarpAndLongScan) {
  int64_t nk = 2, nv = 4, dk = 128, dv = 40, C = 2 * nk * dk + nv * dv;
  for (int64_t T : {1, 33}) {
    auto qkv = random_values(C * T, 80 + T);
    std::vector<float> g(nv * T), beta(nv * T);
    std::mt19937 rng(static_cast<uint32_t>(T));
    std::uniform_real_distribution<float> u(0, 1);
    for (auto& v : g) v = -u(rng);
    for (auto& v : beta) v = u(rng);
    auto s0 = random_values(dv * dk * nv, 81, 0.3f);
    std::vector<float> out[2], state[2];
    int i = 0;
    for (Backend* be : {cuda.get(), ref.get()}) {
      Tensor tq = upload(*be, qkv, {C, T, 1, 1}), tg = upload(*be, g, {nv, T, 1, 1}), tb = upload(*be, beta, {nv, T, 1, 1});
      Tensor st = upload(*be, s0, {dv, dk, nv, 1}), o = be->alloc_f32(dv * nv, T);
      be->gdn_scan({.qkv = &tq, .g = &tg, .beta = &tb, .state = &st, .out = &o, .n_k_heads = nk, .n_v_heads = nv,
                    .dk = dk, .dv = dv});
      out[i] = be->read_f32(o);
      state[i] = be->read_f32(st);
      ++i;
    }
    report_close(out[0], widen(out[1]), 2e-6, "gdn out T=" + std::to_string(T));
    report_close(state[0], widen(state[1]), 2e-6, "gdn state T=" + std::to_string(T));
  }
}

// gdn_core for one token as one kernel (gates in every block, the gated norm by each head's last
// block), twice in a row (the completion counters must be back at zero), and for several tokens
// (the ops one by one), against the reference's gates, scan and norm; dv = 40 leaves a partial
// warp and two column blocks a head.
TEST_F(CudaVsRef, GdnCoreOneKernel) {
  int64_t nk = 2, nv = 4, dk = 128, dv = 40, C = 2 * nk * dk + nv * dv;
  auto ssm_a = make_weight("ssm_a", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 90, 2.0f));
  auto dt = make_weight("dt_bias", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 91));
  auto norm = make_weight("norm", GgmlType::F32, {dv, 1, 1, 1}, random_values(dv, 92));
  for (int64_t T : {1, 5}) {
    auto s0 = random_values(dv * dk * nv, 93, 0.3f);
    std::vector<float> got[2][5];
    int i = 0;
    for (Backend* be : {cuda.get(), ref.get()}) {
      Tensor st = upload(*be, s0, {dv, dk, nv, 1});
      for (int step = 0; step < 2; ++step) {
        const uint32_t seed = static_cast<uint32_t>(100 + 10 * step + T);
        Tensor tq = upload(*be, random_values(C * T, seed), {C, T, 1, 1});
        Tensor ta = upload(*be, random_values(nv * T, seed + 1), {nv, T, 1, 1});
        Tensor tb = upload(*be, random_values(nv * T, seed + 2, 3.0f), {nv, T, 1, 1});
        Tensor tz = upload(*be, random_values(dv * nv * T, seed + 3), {dv * nv, T, 1, 1});
        Tensor g = be->alloc_f32(nv, T), beta = be->alloc_f32(nv, T), core = be->alloc_f32(dv * nv, T),
               out = be->alloc_f32(dv * nv, T);
        be->gdn_core({.qkv = &tq, .alpha = &ta, .beta_raw = &tb, .ssm_a = &ssm_a->w, .dt_bias = &dt->w, .z = &tz,
                      .norm = &norm->w, .eps = 1e-6f, .state = &st, .n_k_heads = nk, .n_v_heads = nv, .dk = dk,
                      .dv = dv, .g = &g, .beta = &beta, .core = &core, .out = &out});
        int o = 0;
        for (const Tensor* t : {&g, &beta, &core, &out}) got[i][o++] = be->read_f32(*t);
      }
      got[i][4] = be->read_f32(st);
      ++i;
    }
    const char* names[] = {"g", "beta", "core", "out", "state"};
    for (int o = 0; o < 5; ++o)
      report_close(got[0][o], widen(got[1][o]), 2e-6, std::string("gdn_core ") + names[o] + " T=" + std::to_string(T));
  }
}

// gdn_core's one-token output in Q8_0 for the product right after it (the output projection):
// that product reads the codes gdn_core wrote, and must equal the reference's product on the
// output rounded to Q8_0. A host write or an op between the two drops the codes, so the product
// then reads the new values.
TEST_F(CudaVsRef, GdnCoreQ8OutputForTheNextProduct) {
  int64_t nk = 2, nv = 4, dk = 128, dv = 128, C = 2 * nk * dk + nv * dv, K = nv * dv, N = 70;
  auto ssm_a = make_weight("ssm_a", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 94, 2.0f));
  auto dt = make_weight("dt_bias", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 95));
  auto norm = make_weight("norm", GgmlType::F32, {dv, 1, 1, 1}, random_values(dv, 96));
  auto w = make_weight("out", GgmlType::Q8_0, {K, N, 1, 1}, random_values(K * N, 97, 0.2f));
  Tensor st = upload(*cuda, random_values(dv * dk * nv, 98, 0.3f), {dv, dk, nv, 1});
  const auto other = random_values(K, 99), another = random_values(K, 100);
  for (const char* between : {"nothing", "a host write", "a copy"}) {
    Tensor tq = upload(*cuda, random_values(C, 101), {C, 1, 1, 1}), ta = upload(*cuda, random_values(nv, 102), {nv, 1, 1, 1});
    Tensor tb = upload(*cuda, random_values(nv, 103), {nv, 1, 1, 1}), tz = upload(*cuda, random_values(K, 104), {K, 1, 1, 1});
    Tensor g = cuda->alloc_f32(nv, 1), beta = cuda->alloc_f32(nv, 1), core = cuda->alloc_f32(K, 1);
    Tensor out = cuda->alloc_output(DType::F32, {K, 1, 1, 1}), y = cuda->alloc_f32(N, 1);
    Tensor source = upload(*cuda, another, {K, 1, 1, 1});
    cuda->gdn_core({.qkv = &tq, .alpha = &ta, .beta_raw = &tb, .ssm_a = &ssm_a->w, .dt_bias = &dt->w, .z = &tz,
                    .norm = &norm->w, .eps = 1e-6f, .state = &st, .n_k_heads = nk, .n_v_heads = nv, .dk = dk,
                    .dv = dv, .g = &g, .beta = &beta, .core = &core, .out = &out});
    if (std::string(between) == "a host write") cuda->write(out, other.data(), other.size() * sizeof(float));
    if (std::string(between) == "a copy") cuda->copy(source, 0, out, 0, K);
    cuda->mul_mat(w->w, out, y);
    const auto x = cuda->read_f32(out);
    Tensor want = ref->alloc_f32(N, 1);
    ref->mul_mat(w->w, upload(*ref, rounded_activations(GgmlType::Q8_0, x, K), {K, 1, 1, 1}), want);
    report_close(cuda->read_f32(y), widen(ref->read_f32(want)), matmul_tolerance(K),
                 std::string("q8 output, then ") + between);
  }
}

// gdn_core over several tokens (gates, scan, then the gated_rms_norm op) also writes its output
// in Q8_0, for the product right after it: with a Q8_0 weight that product (the decode kernel's
// int8 units for 5 tokens, the int8 tile for 70) reads those codes, and must equal the reference's
// product on the output rounded to Q8_0. A Q4_K weight reads Q8_K, which the product rounds
// itself; a host write between the two drops the codes, so the product then reads the new values.
TEST_F(CudaVsRef, GdnCorePrefillQ8OutputForTheNextProduct) {
  int64_t nk = 2, nv = 4, dk = 128, dv = 128, C = 2 * nk * dk + nv * dv, K = nv * dv, N = 70;
  auto ssm_a = make_weight("ssm_a", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 105, 2.0f));
  auto dt = make_weight("dt_bias", GgmlType::F32, {nv, 1, 1, 1}, random_values(nv, 106));
  auto norm = make_weight("norm", GgmlType::F32, {dv, 1, 1, 1}, random_values(dv, 107));
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_K}) {
    auto w = make_weight("out", type, {K, N, 1, 1}, random_values(K * N, 108, 0.2f));
    for (int64_t T : {5, 70})
      for (const char* between : {"nothing", "a host write"}) {
        const auto other = random_values(K * T, 109 + T);
        Tensor st = upload(*cuda, random_values(dv * dk * nv, 110, 0.3f), {dv, dk, nv, 1});
        Tensor tq = upload(*cuda, random_values(C * T, 111 + T), {C, T, 1, 1});
        Tensor ta = upload(*cuda, random_values(nv * T, 112 + T), {nv, T, 1, 1});
        Tensor tb = upload(*cuda, random_values(nv * T, 113 + T), {nv, T, 1, 1});
        Tensor tz = upload(*cuda, random_values(K * T, 114 + T), {K, T, 1, 1});
        Tensor g = cuda->alloc_f32(nv, T), beta = cuda->alloc_f32(nv, T), core = cuda->alloc_f32(K, T);
        Tensor out = cuda->alloc_output(DType::F32, {K, T, 1, 1}), y = cuda->alloc_f32(N, T);
        cuda->gdn_core({.qkv = &tq, .alpha = &ta, .beta_raw = &tb, .ssm_a = &ssm_a->w, .dt_bias = &dt->w, .z = &tz,
                        .norm = &norm->w, .eps = 1e-6f, .state = &st, .n_k_heads = nk, .n_v_heads = nv, .dk = dk,
                        .dv = dv, .g = &g, .beta = &beta, .core = &core, .out = &out});
        if (std::string(between) == "a host write") cuda->write(out, other.data(), other.size() * sizeof(float));
        cuda->mul_mat(w->w, out, y);
        const auto x = cuda->read_f32(out);
        Tensor want = ref->alloc_f32(N, T);
        ref->mul_mat(w->w, upload(*ref, rounded_activations(type, x, K), {K, T, 1, 1}), want);
        report_close(cuda->read_f32(y), widen(ref->read_f32(want)), matmul_tolerance(K),
                     std::string(type_name(type)) + " T=" + std::to_string(T) + " q8 output, then " + between);
      }
  }
}

// causal_conv over hundreds of tokens (the prefill kernel: runs of 16 tokens a thread, at
// dilation d the run's tokens d apart, the last runs partial) against the same sequence fed 8
// tokens at a time (the decode kernel: the same FP64 sums in the same order), outputs and history
// bit for bit, and against the reference. K = 2 is fewer taps than the prefill kernel takes, 4 as
// many, and 6 (more) runs on the decode kernel; every case starts from a random history, and at
// K = 4, dilation 4 the 10 tokens are fewer than the history's 12 rows.
TEST_F(CudaVsRef, CausalConvPrefillRuns) {
  const int64_t C = 300;
  struct Case {
    int64_t K, dil, T;
  };
  for (auto [K, dil, T] : {Case{4, 1, 300}, Case{4, 3, 300}, Case{2, 1, 77}, Case{6, 3, 300}, Case{4, 4, 10}}) {
    const int64_t L = (K - 1) * dil;
    const std::string what = "causal_conv K=" + std::to_string(K) + " dil=" + std::to_string(dil) + " T=" + std::to_string(T);
    auto w = make_weight("conv", GgmlType::F32, {K, C, 1, 1}, random_values(K * C, 120 + K));
    const auto hist = random_values(C * L, 121), x = random_values(C * T, 122 + T);
    Tensor whole_hist = upload(*cuda, hist, {C, L, 1, 1}), whole = cuda->alloc_f32(C, T);
    cuda->causal_conv(upload(*cuda, x, {C, T, 1, 1}), whole_hist, w->w, dil, whole);
    Tensor steps_hist = upload(*cuda, hist, {C, L, 1, 1});
    std::vector<float> steps;
    for (int64_t t0 = 0; t0 < T; t0 += 8) {
      const int64_t n = std::min<int64_t>(8, T - t0);
      Tensor o = cuda->alloc_f32(C, n);
      cuda->causal_conv(upload(*cuda, std::vector<float>(x.begin() + t0 * C, x.begin() + (t0 + n) * C), {C, n, 1, 1}),
                        steps_hist, w->w, dil, o);
      const auto v = cuda->read_f32(o);
      steps.insert(steps.end(), v.begin(), v.end());
    }
    const auto got = cuda->read_f32(whole), got_hist = cuda->read_f32(whole_hist);
    EXPECT_EQ(got, steps) << what;
    EXPECT_EQ(got_hist, cuda->read_f32(steps_hist)) << what << " history";
    Tensor ref_hist = upload(*ref, hist, {C, L, 1, 1}), want = ref->alloc_f32(C, T);
    ref->causal_conv(upload(*ref, x, {C, T, 1, 1}), ref_hist, w->w, dil, want);
    report_close(got, widen(ref->read_f32(want)), 1e-6, what);
    EXPECT_EQ(got_hist, ref->read_f32(ref_hist)) << what << " history";
  }
}

// Routing and routed experts on one backend: the ids, weights and output.
struct MoeRun {
  std::vector<int32_t> ids;
  std::vector<float> weights, out;
};

MoeRun run_moe(Backend& be, const OwnedWeight& wg, const OwnedWeight& wu, const OwnedWeight& wd,
               const std::vector<float>& logits, const std::vector<float>& x, int64_t k, int64_t T) {
  const int64_t E = wg.w.ne[2], H = wg.w.ne[0];
  Tensor ids = be.alloc(DType::I32, {k, T, 1, 1}), w = be.alloc_f32(k, T), y = be.alloc_f32(H, T);
  be.moe_route(upload(be, logits, {E, T, 1, 1}), k, ids, w);
  Tensor tx = upload(be, x, {H, T, 1, 1});
  be.moe_experts({.x = &tx, .gate_exps = &wg.w, .up_exps = &wu.w, .down_exps = &wd.w, .ids = &ids, .weights = &w,
                  .out = &y});
  return {be.read_i32(ids), be.read_f32(w), be.read_f32(y)};
}

TEST_F(CudaVsRef, MoeManyTokensKQuants) {
  int64_t E = 5, k = 2, H = 256, F = 256, T = 11;
  auto wg = make_weight("gate", GgmlType::Q4_K, {H, F, E, 1}, random_values(H * F * E, 90, 0.1f));
  auto wu = make_weight("up", GgmlType::Q6_K, {H, F, E, 1}, random_values(H * F * E, 91, 0.1f));
  auto wd = make_weight("down", GgmlType::Q8_0, {F, H, E, 1}, random_values(F * H * E, 92, 0.1f));
  auto logits = random_values(E * T, 93, 2.0f);
  logits[E + 2] = logits[E + 4] = 9.0f;  // a tie at the top of row 1
  auto x = random_values(H * T, 94);
  MoeRun c = run_moe(*cuda_exact, *wg, *wu, *wd, logits, x, k, T), r = run_moe(*ref, *wg, *wu, *wd, logits, x, k, T);
  EXPECT_EQ(c.ids, r.ids);
  report_close(c.weights, widen(r.weights), 1e-6, "moe_route weights");
  report_close(c.out, widen(r.out), matmul_tolerance(H + F), "moe_experts");
  MoeRun i8 = run_moe(*cuda, *wg, *wu, *wd, logits, x, k, T);  // Q4_K gate and Q8_0 down on the int8 tile
  expect_within(i8.out, moe_experts_expected(x, i8.ids, i8.weights, *wg, *wu, *wd, k), "moe_experts int8");
}

// Routing holds each warp's logits in registers, 2, 16 or 64 per lane by the number of experts:
// every size, with ties at the top (lower id first) between and within lanes, and -0 tying +0.
TEST_F(CudaVsRef, MoeRouteEveryRegisterSize) {
  const int64_t k = 10, T = 4;
  for (int64_t E : {48, 300, 600}) {
    auto logits = random_values(E * T, 95 + E, 2.0f);
    logits[37] = logits[E - 1] = logits[5] = 9.0f;        // token 0: three-way tie at the top
    logits[E + 40] = logits[E + 8] = 7.5f;                // token 1: lanes 8 of two rounds
    for (int64_t e = 0; e < E; e += 3) logits[2 * E + e] = 1.0f;  // token 2: many equal logits
    for (int64_t e = 0; e < E; ++e) logits[3 * E + e] = -1.0f - 0.001f * static_cast<float>(e);
    logits[3 * E + 20] = logits[3 * E + 33] = 0.0f, logits[3 * E + 3] = -0.0f;  // token 3: 3, 20, 33 first
    Tensor ci = cuda->alloc(DType::I32, {k, T, 1, 1}), cw = cuda->alloc_f32(k, T);
    Tensor ri = ref->alloc(DType::I32, {k, T, 1, 1}), rw = ref->alloc_f32(k, T);
    cuda->moe_route(upload(*cuda, logits, {E, T, 1, 1}), k, ci, cw);
    ref->moe_route(upload(*ref, logits, {E, T, 1, 1}), k, ri, rw);
    EXPECT_EQ(cuda->read_i32(ci), ref->read_i32(ri)) << "E=" << E;
    report_close(cuda->read_f32(cw), widen(ref->read_f32(rw)), 1e-6, "moe_route weights E=" + std::to_string(E));
  }
}

TEST_F(CudaVsRef, WideNormsAndHcRead) {
  int64_t S = 4, H = 640, W = S * H, r = 16, T = 12;
  auto R = random_values(W * T, 60, 2.0f);
  auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 61));
  auto down = make_weight("down", GgmlType::BF16, {W, r, 1, 1}, random_values(W * r, 62, 0.05f));
  auto up = make_weight("up", GgmlType::F16, {r, W, 1, 1}, random_values(r * W, 63, 0.5f));
  auto inject = make_weight("inject", GgmlType::F32, {W, S, 1, 1}, random_values(W * S, 64, 0.05f));
  std::vector<float> x[2], iw[2];
  int i = 0;
  for (Backend* be : {cuda.get(), ref.get()}) {
    Tensor tR = upload(*be, R, {W, T, 1, 1}), tx = be->alloc_f32(H, T), tiw = be->alloc_f32(S, T);
    be->hc_read({.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w, .inject = &inject->w, .n_streams = S,
                 .eps = 1e-6f, .x = &tx, .inject_w = &tiw});
    x[i] = be->read_f32(tx);
    iw[i] = be->read_f32(tiw);
    ++i;
  }
  report_close(x[0], widen(x[1]), matmul_tolerance(W), "hc_read x");
  report_close(iw[0], widen(iw[1]), matmul_tolerance(W), "hc_read inject");
}

// hc_write_read over many tokens on Q8_0 products runs the prefill tiles (the write in the norm
// kernel, the mix in the up product's epilogue): the written R equals the reference's, and x and the
// inject weights are within the activation-rounding bounds. Token counts below, across and past a
// 64-token tile; the final mixer's form (no inject) too; streams of 96 values leave the norm's
// last warp partly idle.
TEST_F(CudaVsRef, HcWriteReadManyTokensOnInt8Products) {
  const int64_t S = 4, r = 64;
  for (int64_t H : {640, 96}) {
    const int64_t W = S * H;
    auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 230));
    auto down = make_weight("down", GgmlType::Q8_0, {W, r, 1, 1}, random_values(W * r, 231, 0.3f));
    auto up = make_weight("up", GgmlType::Q8_0, {r, W, 1, 1}, random_values(r * W, 232, 0.3f));
    auto inject = make_weight("inject", GgmlType::Q8_0, {W, S, 1, 1}, random_values(W * S, 233, 0.3f));
    for (int64_t T : {9, 64, 150})
      for (bool with_inject : {true, false}) {
        const auto R = random_values(W * T, 234 + T, 2.0f), y = random_values(H * T, 235 + T);
        const auto w = random_values(S * T, 236, 1.5f);
        std::vector<float> written(W * T);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < W; ++i)
            written[t * W + i] =
                static_cast<float>(R[t * W + i] + static_cast<double>(w[t * S + i / H]) * y[t * H + i % H]);
        Tensor tR = upload(*cuda, R, {W, T, 1, 1}), x = cuda->alloc_f32(H, T), iw = cuda->alloc_f32(S, T);
        cuda->hc_write_read(tR, upload(*cuda, y, {H, T, 1, 1}), upload(*cuda, w, {S, T, 1, 1}),
                            {.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w,
                             .inject = with_inject ? &inject->w : nullptr, .n_streams = S, .eps = 1e-6f, .x = &x,
                             .inject_w = with_inject ? &iw : nullptr});
        const HcReadExpected want =
            hc_read_expected(written, *norm, *down, *up, with_inject ? inject.get() : nullptr, S, 1e-6);
        const std::string what =
            " H=" + std::to_string(H) + " T=" + std::to_string(T) + (with_inject ? "" : " without inject");
        EXPECT_EQ(cuda->read_f32(tR), written) << "R after the write" << what;
        expect_within(cuda->read_f32(x), want.x, "hc_write_read x" + what);
        if (with_inject) expect_within(cuda->read_f32(iw), want.inject_w, "hc_write_read inject" + what);
      }
  }
}

// hc_read over several tokens on int8 products: with Q8_0 down and inject rows the norm kernel
// writes n's Q8_0 codes for them (no quantization kernel); with Q4_K down rows they read Q8_K
// codes quantized apart. Both within the activation-rounding bounds of op_bounds.h.
TEST_F(CudaVsRef, HcReadManyTokensOnInt8Products) {
  const int64_t S = 4, H = 640, W = S * H, r = 64, T = 12;
  for (GgmlType down_type : {GgmlType::Q8_0, GgmlType::Q4_K}) {
    auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 220));
    auto down = make_weight("down", down_type, {W, r, 1, 1}, random_values(W * r, 221, 0.3f));
    auto up = make_weight("up", GgmlType::Q8_0, {r, W, 1, 1}, random_values(r * W, 222, 0.3f));
    auto inject = make_weight("inject", GgmlType::Q8_0, {W, S, 1, 1}, random_values(W * S, 223, 0.3f));
    const auto R = random_values(W * T, 224, 2.0f);
    Tensor tR = upload(*cuda, R, {W, T, 1, 1}), x = cuda->alloc_f32(H, T), iw = cuda->alloc_f32(S, T);
    cuda->hc_read({.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w, .inject = &inject->w, .n_streams = S,
                   .eps = 1e-6f, .x = &x, .inject_w = &iw});
    const HcReadExpected want = hc_read_expected(R, *norm, *down, *up, inject.get(), S, 1e-6);
    const std::string what = " down " + std::string(type_name(down_type));
    expect_within(cuda->read_f32(x), want.x, "hc_read x" + what);
    expect_within(cuda->read_f32(iw), want.inject_w, "hc_read inject" + what);
  }
}

// The decode matvec (cuda_gemv.cuh) over long rows: every thread of the block takes several units.
// Q8_0 and Q4_K rows on int8 activations (the default) and on FP32 ones (exact products).
TEST_F(CudaVsRef, MulMatDecodeLongRows) {
  int64_t K = 2560, N = 37;
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K}) {
    auto w = make_weight("w", type, {K, N, 1, 1}, random_values(K * N, 5, 0.2f));
    for (int64_t T : {1, 2, 3, 6, 8}) {
      auto x = random_values(K * T, 200 + T);
      expect_products(*w, x, T, run_mul_mat(*cuda, *w, x, T), run_mul_mat(*cuda_exact, *w, x, T),
                      "long rows " + std::string(type_name(type)) + " T=" + std::to_string(T));
    }
  }
}

// Products sharing an input: one launch per type with a unit loader (at most 8 matrices), the
// rest one by one, every output in its own place; the int8 products (decode and prefill) on x
// quantized once per activation format, and with exact products on FP32 activations.
TEST_F(CudaVsRef, MulMatSharedInput) {
  int64_t K = 512;
  std::vector<std::unique_ptr<OwnedWeight>> ws;
  int seed = 300;
  for (auto [type, n] : std::vector<std::pair<GgmlType, int64_t>>{{GgmlType::Q8_0, 70}, {GgmlType::Q4_K, 33},
                                                                   {GgmlType::Q8_0, 5}, {GgmlType::F32, 9},
                                                                   {GgmlType::Q5_K, 17}, {GgmlType::Q8_0, 130}}) {
    ws.push_back(make_weight("w" + std::to_string(seed), type, {K, n, 1, 1}, random_values(K * n, seed, 0.2f)));
    ++seed;
  }
  std::vector<const Weight*> wp;
  for (auto& w : ws) wp.push_back(&w->w);
  for (int64_t T : {1, 3, 9}) {
    auto x = random_values(K * T, 400 + T);
    std::vector<Tensor> out[2];  // cuda, cuda_exact
    for (int b = 0; b < 2; ++b) {
      Backend& be = b == 0 ? *cuda : *cuda_exact;
      std::vector<Tensor*> op;
      for (auto& w : ws) out[b].push_back(be.alloc_f32(w->w.ne[1], T));
      for (auto& o : out[b]) op.push_back(&o);
      be.mul_mat_shared_input(wp, upload(be, x, {K, T, 1, 1}), op);
    }
    for (size_t i = 0; i < ws.size(); ++i)
      expect_products(*ws[i], x, T, cuda->read_f32(out[0][i]), cuda_exact->read_f32(out[1][i]),
                      "shared input " + std::to_string(i) + " " + std::string(type_name(ws[i]->w.type)) +
                          " T=" + std::to_string(T));
  }
}

// One qsa_attend call's inputs (q and gate [hd, nh, T], caches [hd, nkv, cap], selections
// [max_sel, T]) and its output on a backend.
struct QsaCase {
  const std::vector<float>&q, &gate, &kc, &vc;
  const std::vector<int32_t>&sel, &n_sel;
  int64_t hd, nh, nkv, cap, max_sel, T;
  float scale;
  int64_t dense_n0 = 0, dense_rows = 0;
};

// With without_sel (every row dense) sel and n_sel are not passed.
std::vector<float> run_qsa_attend(Backend& be, const QsaCase& c, bool without_sel = false) {
  Tensor tq = upload(be, c.q, {c.hd, c.nh, c.T, 1}), tg = upload(be, c.gate, {c.hd, c.nh, c.T, 1});
  Tensor tk = upload(be, c.kc, {c.hd, c.nkv, c.cap, 1}), tv = upload(be, c.vc, {c.hd, c.nkv, c.cap, 1});
  Tensor ts = be.alloc(DType::I32, {c.max_sel, c.T, 1, 1}), tn = be.alloc(DType::I32, {c.T, 1, 1, 1});
  be.write(ts, c.sel.data(), c.sel.size() * 4);
  be.write(tn, c.n_sel.data(), c.n_sel.size() * 4);
  Tensor o = be.alloc_f32(c.hd * c.nh, c.T);
  be.qsa_attend({.q = &tq, .gate = &tg, .k_cache = &tk, .v_cache = &tv, .sel = without_sel ? nullptr : &ts,
                 .n_sel = without_sel ? nullptr : &tn, .scale = c.scale, .out = &o, .dense_n0 = c.dense_n0,
                 .dense_rows = c.dense_rows});
  return be.read_f32(o);
}

// Decode and prefill attention with every row dense and no selection (the model's calls while the
// cache is short), against the reference reading the same causal selections. Head width 256:
// decode splits on the tensor cores (1 and 3 tokens), the token-a-block tiles (100 tokens) and the
// dense tiles (200 tokens); 96: the chunk kernel (each token count). One token's new position
// first, last and inside its split's chunk (the tensor-core kernel requests it after its wait,
// the chunk's other rows before).
TEST_F(CudaVsRef, QsaAttendWithoutSelection) {
  const int64_t nh = 24, nkv = 2;
  for (auto [T, n0, hd] : {std::tuple<int64_t, int64_t, int64_t>{1, 0, 256}, {1, 31, 256}, {1, 128, 256}, {1, 130, 256},
                           {3, 57, 256}, {100, 20, 256}, {200, 9, 256}, {1, 130, 96}, {3, 57, 96}, {100, 20, 96}}) {
    const int64_t cap = n0 + T + 2, max_sel = n0 + T;
    auto q = random_values(hd * nh * T, 540), gate = random_values(hd * nh * T, 541);
    auto kc = random_values(hd * nkv * cap, 542), vc = random_values(hd * nkv * cap, 543);
    std::vector<int32_t> sel(max_sel * T, -1), n_sel(T);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t p = 0; p <= n0 + t; ++p) sel[t * max_sel + n_sel[t]++] = static_cast<int32_t>(p);
    const QsaCase c{q, gate, kc, vc, sel, n_sel, hd, nh, nkv, cap, max_sel, T, 0.0625f, n0, T};
    report_close(run_qsa_attend(*cuda, c, true), widen(run_qsa_attend(*ref, c)), 2e-6,
                 "qsa_attend without sel hd=" + std::to_string(hd) + " T=" + std::to_string(T) +
                     " n0=" + std::to_string(n0));
  }
}

// Decode attention over long selections, split over blocks and merged, with tokens of different
// counts and 12 query heads per kv head: on the tensor cores (head widths 256 and 64: a split per
// 32 positions) and by the chunk kernel (96: no tensor-core instance); then 20 per kv head, more
// than either takes (16), which runs the kernel with a block per query head. Selections of up to
// 250 positions at head width 256 make 8 splits, whose maxima and sums (8·12 values a kv head) take
// as many bytes as the Q8_0 scales the combine kernel writes: the partials must outlive the call.
TEST_F(CudaVsRef, QsaAttendDecodeChunks) {
  int64_t nkv = 2, cap = 900;
  for (auto [hd, nh, max_sel] : {std::tuple<int64_t, int64_t, int64_t>{256, 24, 700}, {256, 24, 250}, {64, 24, 700},
                                 {96, 24, 700}, {64, 40, 700}}) {
    for (int64_t T : {1, 3}) {
      auto q = random_values(hd * nh * T, 500), gate = random_values(hd * nh * T, 501);
      auto kc = random_values(hd * nkv * cap, 502), vc = random_values(hd * nkv * cap, 503);
      std::vector<int32_t> sel(max_sel * T, -1), n_sel(T);
      for (int64_t t = 0; t < T; ++t) {
        n_sel[t] = static_cast<int32_t>(max_sel - max_sel / 6 * t);  // e.g. 700, 584, 468: whole and partial chunks
        for (int64_t j = 0; j < n_sel[t]; ++j) sel[t * max_sel + j] = static_cast<int32_t>((j * 7 + t) % cap);
      }
      const QsaCase c{q, gate, kc, vc, sel, n_sel, hd, nh, nkv, cap, max_sel, T, 0.125f};
      report_close(run_qsa_attend(*cuda, c), widen(run_qsa_attend(*ref, c)), 2e-6,
                   "qsa_attend decode hd=" + std::to_string(hd) + " G=" + std::to_string(nh / nkv) +
                       " T=" + std::to_string(T) + " positions " + std::to_string(max_sel));
    }
  }
}

// qsa_attend's one-token output in Q8_0 for the product right after it (the output projection):
// that product reads the codes the combine kernel wrote, and must equal the reference's product on
// the output rounded to Q8_0.
TEST_F(CudaVsRef, QsaAttendQ8OutputForTheNextProduct) {
  const int64_t hd = 256, nh = 4, nkv = 2, cap = 400, max_sel = 300, K = hd * nh, N = 70;
  auto q = random_values(hd * nh, 520), gate = random_values(hd * nh, 521);
  auto kc = random_values(hd * nkv * cap, 522), vc = random_values(hd * nkv * cap, 523);
  std::vector<int32_t> sel(max_sel), n_sel{static_cast<int32_t>(max_sel)};
  for (int64_t j = 0; j < max_sel; ++j) sel[j] = static_cast<int32_t>((j * 7) % cap);
  auto w = make_weight("out", GgmlType::Q8_0, {K, N, 1, 1}, random_values(K * N, 524, 0.2f));
  Tensor tq = upload(*cuda, q, {hd, nh, 1, 1}), tg = upload(*cuda, gate, {hd, nh, 1, 1});
  Tensor tk = upload(*cuda, kc, {hd, nkv, cap, 1}), tv = upload(*cuda, vc, {hd, nkv, cap, 1});
  Tensor ts = cuda->alloc(DType::I32, {max_sel, 1, 1, 1}), tn = cuda->alloc(DType::I32, {1, 1, 1, 1});
  cuda->write(ts, sel.data(), sel.size() * 4);
  cuda->write(tn, n_sel.data(), n_sel.size() * 4);
  Tensor o = cuda->alloc_output(DType::F32, {K, 1, 1, 1}), y = cuda->alloc_f32(N, 1);
  cuda->qsa_attend({.q = &tq, .gate = &tg, .k_cache = &tk, .v_cache = &tv, .sel = &ts, .n_sel = &tn, .scale = 0.0625f,
                    .out = &o});
  cuda->mul_mat(w->w, o, y);
  Tensor want = ref->alloc_f32(N, 1);
  ref->mul_mat(w->w, upload(*ref, rounded_activations(GgmlType::Q8_0, cuda->read_f32(o), K), {K, 1, 1, 1}), want);
  report_close(cuda->read_f32(y), widen(ref->read_f32(want)), matmul_tolerance(K), "qsa_attend q8 output, then the product");
}

// The decode kernels (cuda_gemv.cuh): fused gate+up+SwiGLU and down+sum for 1..8 tokens, with
// gate/up sharing a type, rows of 640 (whole units, not whole 256-blocks) for down. On FP32
// activations (exact products) against the reference; with Q4_K and Q8_0 gate/up rows on int8
// activations (the default) within the bound of their rounding.
TEST_F(CudaVsRef, MoeDecodeFusedKernels) {
  int64_t E = 6, k = 3, H = 512, F = 160;
  for (GgmlType gate_up : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::BF16}) {
    for (int64_t T : {1, 2, 5}) {
      auto wg = make_weight("gate", gate_up, {H, F, E, 1}, random_values(H * F * E, 190, 0.1f));
      auto wu = make_weight("up", gate_up, {H, F, E, 1}, random_values(H * F * E, 191, 0.1f));
      auto wd = make_weight("down", GgmlType::Q8_0, {F, H, E, 1}, random_values(F * H * E, 192, 0.1f));
      auto logits = random_values(E * T, 193, 2.0f);
      auto x = random_values(H * T, 194);
      MoeRun c = run_moe(*cuda_exact, *wg, *wu, *wd, logits, x, k, T), r = run_moe(*ref, *wg, *wu, *wd, logits, x, k, T);
      const std::string what = "moe decode " + std::string(type_name(gate_up)) + " T=" + std::to_string(T);
      report_close(c.out, widen(r.out), matmul_tolerance(H + F), what);
      MoeRun i8 = run_moe(*cuda, *wg, *wu, *wd, logits, x, k, T);
      expect_within(i8.out, moe_experts_expected(x, i8.ids, i8.weights, *wg, *wu, *wd, k), what + " int8");
    }
  }
}

// moe_ffn for a few tokens: the shared expert rides in the fused decode kernels as one more slot,
// in types of its own (Q8_0 gate/up and BF16 down beside Q4_K / Q8_0 routed experts), against
// the reference's op-by-op composition. The router is one kernel when it shares the shared-expert
// gate's type (F32), else a product (BF16); the gate/up kernel routes from its logits up to 512
// experts (6: two logits a lane, 100: sixteen), moe_route beyond (520). With a Q8_0 shared down
// the down kernel reads h's Q8_0 codes, and for one token of up to 64 experts picks its experts
// itself from the logits. Exact products against the reference; the default (int8 gate/up
// activations, quantized by the router kernel or beside it) within the bound of their rounding,
// for the routing it chose.
TEST_F(CudaVsRef, MoeFfnSharedExpertInTheDecodeKernels) {
  for (int64_t E : {6, 100, 520}) check_moe_ffn_decode(E, E > 6 ? 32 : 160, GgmlType::BF16);  // many experts: narrow ones
  check_moe_ffn_decode(6, 160, GgmlType::Q8_0);
}

void CudaVsRef::check_moe_ffn_decode(int64_t E, int64_t F, GgmlType shared_down_type) {
  int64_t k = 3, H = 512;
  auto wg = make_weight("gate", GgmlType::Q4_K, {H, F, E, 1}, random_values(H * F * E, 201, 0.1f));
  auto wu = make_weight("up", GgmlType::Q4_K, {H, F, E, 1}, random_values(H * F * E, 202, 0.1f));
  auto wd = make_weight("down", GgmlType::Q8_0, {F, H, E, 1}, random_values(F * H * E, 203, 0.1f));
  auto sg = make_weight("shared_gate", GgmlType::Q8_0, {H, F, 1, 1}, random_values(H * F, 204, 0.1f));
  auto su = make_weight("shared_up", GgmlType::Q8_0, {H, F, 1, 1}, random_values(H * F, 205, 0.1f));
  auto sd = make_weight("shared_down", shared_down_type, {F, H, 1, 1}, random_values(F * H, 206, 0.1f));
  auto s_inp = make_weight("shared_gate_inp", GgmlType::F32, {H, 1, 1, 1}, random_values(H, 207, 0.1f));
  for (GgmlType router_type : {GgmlType::F32, GgmlType::BF16}) {
    auto router = make_weight("router", router_type, {H, E, 1, 1}, random_values(H * E, 200, 0.2f));
    for (int64_t T : {1, 2, 3, 5}) {  // each instance of the router kernel: 1, 2, 3 of up to 4, 5 of up to 8
      auto x = random_values(H * T, 208);
      std::vector<float> out[3], logits[3];
      int i = 0;
      for (Backend* be : {cuda_exact.get(), ref.get(), cuda.get()}) {
        Tensor tx = upload(*be, x, {H, T, 1, 1}), tl = be->alloc_f32(E, T), ty = be->alloc_f32(H, T);
        be->moe_ffn({.x = &tx, .router = &router->w, .gate_exps = &wg->w, .up_exps = &wu->w, .down_exps = &wd->w,
                     .shared_gate = &sg->w, .shared_up = &su->w, .shared_down = &sd->w, .shared_gate_inp = &s_inp->w,
                     .k = k, .logits = &tl, .out = &ty});
        out[i] = be->read_f32(ty);
        logits[i] = be->read_f32(tl);
        ++i;
      }
      std::string what = "moe_ffn E=" + std::to_string(E) + " router " + std::string(type_name(router_type)) +
                         " shared down " + std::string(type_name(shared_down_type)) + " T=" + std::to_string(T);
      report_close(logits[0], widen(logits[1]), matmul_tolerance(H), what + " logits");
      report_close(out[0], widen(out[1]), matmul_tolerance(H + F), what);
      Tensor ids = ref->alloc(DType::I32, {k, T, 1, 1}), w = ref->alloc_f32(k, T);
      ref->moe_route(upload(*ref, logits[2], {E, T, 1, 1}), k, ids, w);
      Bounded want = moe_experts_expected(x, ref->read_i32(ids), ref->read_f32(w), *wg, *wu, *wd, k);
      const Bounded shared = shared_expert_expected(x, *sg, *su, *sd, *s_inp);
      for (size_t d = 0; d < want.want.size(); ++d) want.want[d] += shared.want[d], want.bound[d] += shared.bound[d];
      expect_within(out[2], want, what + " int8");
    }
  }
}

// hc_read for one to four tokens with four streams: the two decode kernels (down and inject rows
// sharing a type, read once for all tokens; each instance: 1, 2, 3 of up to 4), with and without
// inject. More tokens take the generic form, whose products on Q8_0 weights round their
// activations to Q8_0 (not this test's FP32 tolerance). One token on Q8_0 up rows reads lo in
// Q8_0 (int8 products), so it is held to the activation-rounding bounds of op_bounds.h instead.
TEST_F(CudaVsRef, HcReadDecodePath) {
  int64_t S = 4, H = 640, W = S * H, r = 64;
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::BF16, GgmlType::F32}) {
    auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 161));
    auto down = make_weight("down", type, {W, r, 1, 1}, random_values(W * r, 162, 0.05f));
    auto up = make_weight("up", type, {r, W, 1, 1}, random_values(r * W, 163, 0.5f));
    auto inject = make_weight("inject", type, {W, S, 1, 1}, random_values(W * S, 164, 0.05f));
    for (int64_t T : {1, 2, 3}) {
      auto R = random_values(W * T, 160 + T, 2.0f);
      for (bool with_inject : {true, false}) {
        std::vector<float> x[2], iw[2];
        int i = 0;
        for (Backend* be : {cuda.get(), ref.get()}) {
          Tensor tR = upload(*be, R, {W, T, 1, 1}), tx = be->alloc_f32(H, T), tiw = be->alloc_f32(S, T);
          be->hc_read({.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w,
                       .inject = with_inject ? &inject->w : nullptr, .n_streams = S, .eps = 1e-6f, .x = &tx,
                       .inject_w = with_inject ? &tiw : nullptr});
          x[i] = be->read_f32(tx);
          if (with_inject) iw[i] = be->read_f32(tiw);
          ++i;
        }
        std::string what = "hc_read decode " + std::string(type_name(type)) + " T=" + std::to_string(T) +
                           (with_inject ? "" : " no inject");
        if (type == GgmlType::Q8_0 && T == 1) {
          const HcReadExpected want = hc_read_expected(R, *norm, *down, *up, with_inject ? inject.get() : nullptr, S, 1e-6);
          expect_within(x[0], want.x, what + " x");
          if (with_inject) expect_within(iw[0], want.inject_w, what + " inject");
          continue;
        }
        report_close(x[0], widen(x[1]), matmul_tolerance(W), what + " x");
        if (with_inject) report_close(iw[0], widen(iw[1]), matmul_tolerance(W), what + " inject");
      }
    }
  }
}

// hc_write_read for one to four tokens: the write rides in the two decode kernels (R read as R +
// w·y, stored by the second), against the reference's hc_write then hc_read; the written R too. A
// low rank of 64 and the model's 320 (up rows of 20 units, 324 rows of [down; inject]). One token
// reads lo in Q8_0 (as HcReadDecodePath): within the activation-rounding bounds.
TEST_F(CudaVsRef, HcWriteReadDecodePath) {
  const int64_t S = 4, H = 640, W = S * H;
  auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 173));
  auto inject = make_weight("inject", GgmlType::Q8_0, {W, S, 1, 1}, random_values(W * S, 176, 0.05f));
  for (int64_t r : {64, 320}) {
    auto down = make_weight("down", GgmlType::Q8_0, {W, r, 1, 1}, random_values(W * r, 174, 0.05f));
    auto up = make_weight("up", GgmlType::Q8_0, {r, W, 1, 1}, random_values(r * W, 175, 0.5f));
    for (int64_t T : {1, 2, 4}) {
      auto R = random_values(W * T, 170 + T, 2.0f), y = random_values(H * T, 171 + T), w = random_values(S * T, 172, 1.5f);
      std::vector<float> x[2], iw[2], written[2];
      int i = 0;
      for (Backend* be : {cuda.get(), ref.get()}) {
        Tensor tR = upload(*be, R, {W, T, 1, 1}), ty = upload(*be, y, {H, T, 1, 1}), tw = upload(*be, w, {S, T, 1, 1});
        Tensor tx = be->alloc_f32(H, T), tiw = be->alloc_f32(S, T);
        be->hc_write_read(tR, ty, tw,
                          {.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w, .inject = &inject->w,
                           .n_streams = S, .eps = 1e-6f, .x = &tx, .inject_w = &tiw});
        x[i] = be->read_f32(tx);
        iw[i] = be->read_f32(tiw);
        written[i] = be->read_f32(tR);
        ++i;
      }
      const std::string what = " r=" + std::to_string(r) + " T=" + std::to_string(T);
      EXPECT_EQ(written[0], written[1]) << "R after the write" << what;
      if (T == 1) {
        const HcReadExpected want = hc_read_expected(written[1], *norm, *down, *up, inject.get(), S, 1e-6);
        expect_within(x[0], want.x, "hc_write_read decode x" + what);
        expect_within(iw[0], want.inject_w, "hc_write_read decode inject" + what);
        continue;
      }
      report_close(x[0], widen(x[1]), matmul_tolerance(W), "hc_write_read decode x" + what);
      report_close(iw[0], widen(iw[1]), matmul_tolerance(W), "hc_write_read decode inject" + what);
    }
  }
}

// hc_read's one-token output in Q8_0 for the product right after it (the GDN and QSA input
// projections): that product reads the codes the up/mix kernel wrote beside x, and must equal the
// reference's product on x rounded to Q8_0. A host write between the two drops the codes, so the
// product then reads the new values.
TEST_F(CudaVsRef, HcReadQ8OutputForTheNextProduct) {
  int64_t S = 4, H = 640, W = S * H, r = 64, N = 70;
  auto norm = make_weight("norm", GgmlType::F32, {W, 1, 1, 1}, random_values(W, 190));
  auto down = make_weight("down", GgmlType::Q8_0, {W, r, 1, 1}, random_values(W * r, 191, 0.05f));
  auto up = make_weight("up", GgmlType::Q8_0, {r, W, 1, 1}, random_values(r * W, 192, 0.5f));
  auto w = make_weight("proj", GgmlType::Q8_0, {H, N, 1, 1}, random_values(H * N, 193, 0.2f));
  for (int64_t T : {1, 2, 3}) {  // each instance of the up/mix kernel: 1, 2, and 3 of up to 4
    const auto other = random_values(H * T, 194);
    for (const char* between : {"nothing", "a host write"}) {
      Tensor tR = upload(*cuda, random_values(W * T, 195, 2.0f), {W, T, 1, 1});
      Tensor x = cuda->alloc_output(DType::F32, {H, T, 1, 1}), y = cuda->alloc_f32(N, T);
      cuda->hc_read({.R = &tR, .norm = &norm->w, .down = &down->w, .up = &up->w, .n_streams = S, .eps = 1e-6f, .x = &x});
      if (std::string(between) == "a host write") cuda->write(x, other.data(), other.size() * sizeof(float));
      cuda->mul_mat(w->w, x, y);
      const auto xs = cuda->read_f32(x);
      Tensor want = ref->alloc_f32(N, T);
      ref->mul_mat(w->w, upload(*ref, rounded_activations(GgmlType::Q8_0, xs, H), {H, T, 1, 1}), want);
      report_close(cuda->read_f32(y), widen(ref->read_f32(want)), matmul_tolerance(H),
                   std::string("hc_read q8 output, then ") + between + " T=" + std::to_string(T));
    }
  }
}

// qsa_prepare in one kernel against the reference's split, norms, rotations and cache copies:
// every output and the three caches (rows before n0 untouched), one token and several, at positions
// that follow one another (the kernel gets the first) and three apart (it reads the list).
TEST_F(CudaVsRef, QsaPrepareOneKernel) {
  int64_t hd = 64, nh = 3, nkv = 2, di = 32, n_idx = 2, n_rot = 16, cap = 12, n0 = 5;
  auto q_norm = make_weight("q_norm", GgmlType::F32, {hd, 1, 1, 1}, random_values(hd, 180));
  auto k_norm = make_weight("k_norm", GgmlType::F32, {hd, 1, 1, 1}, random_values(hd, 181));
  auto iq_norm = make_weight("iq_norm", GgmlType::F32, {di, 1, 1, 1}, random_values(di, 182));
  const std::pair<int64_t, int64_t> cases[] = {{1, 1}, {4, 1}, {4, 3}};  // tokens, position step
  for (auto [T, step] : cases) {
    std::vector<int64_t> pos;
    for (int64_t t = 0; t < T; ++t) pos.push_back(n0 + step * t);
    auto qg = random_values(2 * hd * nh * T, 183), k = random_values(hd * nkv * T, 184, 3.0f);
    auto v = random_values(hd * nkv * T, 185), iq = random_values(di * n_idx * T, 186), ik = random_values(di * T, 187);
    std::vector<float> got[2][7];
    int i = 0;
    for (Backend* be : {cuda.get(), ref.get()}) {
      Tensor tqg = upload(*be, qg, {2 * hd, nh, T, 1}), tk = upload(*be, k, {hd * nkv, T, 1, 1});
      Tensor tv = upload(*be, v, {hd * nkv, T, 1, 1}), tiq = upload(*be, iq, {di * n_idx, T, 1, 1});
      Tensor tik = upload(*be, ik, {di, T, 1, 1});
      Tensor q = be->alloc_f32(hd, nh, T), gate = be->alloc_f32(hd, nh, T), ko = be->alloc_f32(hd, nkv, T),
             iqo = be->alloc_f32(di, n_idx, T);
      Tensor kc = be->alloc(DType::F32, {hd, nkv, cap, 1}), vc = be->alloc(DType::F32, {hd, nkv, cap, 1}),
             ikc = be->alloc(DType::F32, {di, cap, 1, 1});
      be->qsa_prepare({.qg = &tqg, .k = &tk, .v = &tv, .iq = &tiq, .ik = &tik, .q_norm = &q_norm->w,
                       .k_norm = &k_norm->w, .iq_norm = &iq_norm->w, .positions = pos, .n_rot = n_rot, .theta = 1e4f,
                       .eps = 1e-6f, .q_out = &q, .gate_out = &gate, .k_out = &ko, .iq_out = &iqo, .k_cache = &kc,
                       .v_cache = &vc, .ik_cache = &ikc, .n0 = n0});
      int o = 0;
      for (const Tensor* t : {&q, &gate, &ko, &iqo, &kc, &vc, &ikc}) got[i][o++] = be->read_f32(*t);
      ++i;
    }
    const char* names[] = {"q", "gate", "k", "iq", "k cache", "v cache", "ik cache"};
    for (int o = 0; o < 7; ++o)
      report_close(got[0][o], widen(got[1][o]), 1e-6, std::string("qsa_prepare ") + names[o] + " T=" + std::to_string(T) + " step " + std::to_string(step));
    EXPECT_EQ(got[0][5], got[1][5]) << "v cache T=" << T << " step " << step;
    EXPECT_EQ(got[0][6], got[1][6]) << "ik cache T=" << T << " step " << step;
  }
}

// The prefill products run on tensor cores with each operand split into two TF32 parts (v = hi +
// lo, hi = v rounded to 11 significant bits, lo = the rest as the tensor cores read it: its 11
// leading bits of at most 12) and the sum hi·hi + hi·lo + lo·hi (cuda_gemm.cuh). Per product the
// dropped terms are below
//   |w − hi_w − lo_w|·|hi_x| + |hi_w|·|x − hi_x − lo_x| + |w − hi_w|·|x − hi_x|
//   <= 2^-22·(1 + 2^-11)·|w||x|·2 + 2^-22·|w||x|  <  3.001·2^-22·|w||x|,
// so each output may differ from the float64 product by 3.001·2^-22·Σ_k |w_k||x_k| plus FP32
// accumulation (the matvec tolerance above). Weights in several types, K spanning many chunks (so
// few tiles split K over several blocks, cuda_matmul.cu) and one ending in a partial chunk (one
// split), token counts around the 64-column tile, rows that leave a partial tile, and activations
// with a few large channels.
TEST_F(CudaVsRef, MulMatTensorCoreWithinSplitTf32Bound) {
  struct Case {
    GgmlType type;
    int64_t K;
  };
  const int64_t N = 150;
  for (Case c : {Case{GgmlType::F32, 2560}, Case{GgmlType::F16, 2560}, Case{GgmlType::BF16, 2560},
                 Case{GgmlType::Q8_0, 2560}, Case{GgmlType::Q4_K, 2560}, Case{GgmlType::Q6_K, 2560},
                 Case{GgmlType::IQ4_XS, 2560}, Case{GgmlType::F32, 100}}) {
    if (!can_quantize(c.type)) continue;
    auto w = make_weight("w", c.type, {c.K, N, 1, 1}, random_values(c.K * N, 11, 0.05f));
    const auto wv = w->values();
    for (int64_t T : {9, 64, 65, 200}) {
      auto x = random_values(c.K * T, 12 + T);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 3; k < c.K; k += 97) x[t * c.K + k] *= 300.0f;  // a few large channels
      Tensor out = cuda_exact->alloc_f32(N, T);
      cuda_exact->mul_mat(w->w, upload(*cuda_exact, x, {c.K, T, 1, 1}), out);
      const auto got = cuda_exact->read_f32(out);
      std::vector<double> want(N * T), mass(N * T);  // W·x and Σ|w||x| in float64
      double scale = 1;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0, m = 0;
          for (int64_t k = 0; k < c.K; ++k) {
            const double p = static_cast<double>(wv[n * c.K + k]) * x[t * c.K + k];
            s += p;
            m += std::fabs(p);
          }
          want[t * N + n] = s, mass[t * N + n] = m;
          scale = std::max(scale, std::fabs(s));
        }
      const double split_tf32 = 3.001 * std::ldexp(1.0, -22), accumulation = matmul_tolerance(c.K) * scale;
      double worst = 0, worst_of_bound = 0;
      int64_t over = 0;
      for (int64_t i = 0; i < N * T; ++i) {
        const double err = std::fabs(got[i] - want[i]), bound = split_tf32 * mass[i] + accumulation;
        worst = std::max(worst, err);
        worst_of_bound = std::max(worst_of_bound, err / bound);
        if (!(err <= bound)) ++over;  // NaN counts
      }
      const std::string what = std::string(type_name(c.type)) + " K=" + std::to_string(c.K) + " T=" + std::to_string(T);
      std::printf("[cuda-vs-ref] mul_mat_tc %-20s max rel err %.3e (worst err/bound %.3f)\n", what.c_str(),
                  worst / scale, worst_of_bound);
      EXPECT_EQ(over, 0) << what << ": " << over << " outputs beyond the split-TF32 bound";
    }
  }
}

// Prefill MoE with the pairs grouped on the device: one expert with several 64-pair tiles, experts
// with one pair or none, three weight types.
TEST_F(CudaVsRef, MoeGroupedOnDeviceManyExperts) {
  const int64_t E = 40, k = 4, H = 256, F = 256, T = 150;
  auto wg = make_weight("gate", GgmlType::Q8_0, {H, F, E, 1}, random_values(H * F * E, 95, 0.1f));
  auto wu = make_weight("up", GgmlType::F16, {H, F, E, 1}, random_values(H * F * E, 96, 0.1f));
  auto wd = make_weight("down", GgmlType::Q4_K, {F, H, E, 1}, random_values(F * H * E, 97, 0.1f));
  auto logits = random_values(E * T, 98, 2.0f);
  for (int64_t t = 0; t < T; ++t) {
    logits[t * E] += 6.0f;                                        // expert 0 in (nearly) every token
    for (int64_t e = 30; e < E; ++e) logits[t * E + e] -= 20.0f;  // experts 30.. never chosen
  }
  logits[7 * E + 31] = 40.0f;  // ... except expert 31, once
  auto x = random_values(H * T, 99);
  MoeRun c = run_moe(*cuda_exact, *wg, *wu, *wd, logits, x, k, T), r = run_moe(*ref, *wg, *wu, *wd, logits, x, k, T);
  EXPECT_EQ(c.ids, r.ids);
  report_close(c.out, widen(r.out), matmul_tolerance(H + F), "moe_experts grouped E=40");
  MoeRun i8 = run_moe(*cuda, *wg, *wu, *wd, logits, x, k, T);  // Q8_0 gate and Q4_K down on the int8 tile
  EXPECT_EQ(i8.ids, r.ids);
  expect_within(i8.out, moe_experts_expected(x, i8.ids, i8.weights, *wg, *wu, *wd, k), "moe_experts grouped int8");
}

// Prefill MoE with gate and up of one int8 type and down on Q8_0 activations: gate, up, SwiGLU and
// h's quantization run as one kernel (32 gate and 32 up rows a tile; F = 320 is not a multiple of
// the 64 rows of other tiles), against the float64 product within the activations' rounding.
TEST_F(CudaVsRef, MoeGroupedGateUpFused) {
  struct Case {
    GgmlType gate_up, down;
    int64_t H, F;
  };
  for (const Case& cs : {Case{GgmlType::Q4_K, GgmlType::Q8_0, 512, 320}, Case{GgmlType::Q8_0, GgmlType::Q4_0, 256, 96}}) {
    const int64_t E = 8, k = 3, T = 150, H = cs.H, F = cs.F;
    auto wg = make_weight("gate", cs.gate_up, {H, F, E, 1}, random_values(H * F * E, 100, 0.1f));
    auto wu = make_weight("up", cs.gate_up, {H, F, E, 1}, random_values(H * F * E, 101, 0.1f));
    auto wd = make_weight("down", cs.down, {F, H, E, 1}, random_values(F * H * E, 102, 0.1f));
    auto logits = random_values(E * T, 103, 2.0f);
    for (int64_t t = 0; t < T; ++t) logits[t * E + 1] += 6.0f;  // expert 1 in (nearly) every token: several tiles
    auto x = random_values(H * T, 104);
    MoeRun r = run_moe(*ref, *wg, *wu, *wd, logits, x, k, T), i8 = run_moe(*cuda, *wg, *wu, *wd, logits, x, k, T);
    EXPECT_EQ(i8.ids, r.ids);
    expect_within(i8.out, moe_experts_expected(x, i8.ids, i8.weights, *wg, *wu, *wd, k),
                  cat("moe_experts fused gate/up ", type_name(cs.gate_up), ", down ", type_name(cs.down)));
  }
}

// Prefill attention (64 tokens or more) on the tensor cores: a block per (token, kv head), the
// group's heads as the rows of split-TF32 tiles (12 and 16 heads, and 5: padded rows), selections
// of 70 lengths from 1 to 300 (whole and partial 32-position chunks), every head width the kernel
// is instantiated for (256, 192, 128, 64).
TEST_F(CudaVsRef, QsaAttendPrefillTensorCores) {
  const int64_t nkv = 2, cap = 700, max_sel = 300, T = 70;
  for (int64_t hd : {256, 192, 128, 64}) {
    for (int64_t nh : {24, 32, 10}) {
      auto q = random_values(hd * nh * T, 510), gate = random_values(hd * nh * T, 511);
      auto kc = random_values(hd * nkv * cap, 512), vc = random_values(hd * nkv * cap, 513);
      std::vector<int32_t> sel(max_sel * T, -1), n_sel(T);
      for (int64_t t = 0; t < T; ++t) {
        n_sel[t] = static_cast<int32_t>(1 + (t * 37) % max_sel);
        for (int64_t j = 0; j < n_sel[t]; ++j) sel[t * max_sel + j] = static_cast<int32_t>((j * 7 + 3 * t) % cap);
      }
      const QsaCase c{q, gate, kc, vc, sel, n_sel, hd, nh, nkv, cap, max_sel, T, 1.0f / std::sqrt(static_cast<float>(hd))};
      report_close(run_qsa_attend(*cuda, c), widen(run_qsa_attend(*ref, c)), 2e-6,
                   "qsa_attend prefill hd=" + std::to_string(hd) + " G=" + std::to_string(nh / nkv));
    }
  }
}

// Dense prefill attention (rows that select their whole causal prefix, dense_rows set): tiles of
// packed (token, head) rows over causal chunks, against the reference reading sel. Token counts
// from the kernel's minimum (192) up, with a partial last tile; from position 0 and deeper into the
// cache; 12 and 16 heads per kv head and 5 (a tile's last rows are padding); head widths 256, 128
// and 64; and a call whose last 100 rows select sparsely (every third position left out), which the
// token-a-block kernel takes in the same call.
TEST_F(CudaVsRef, QsaAttendPrefillDense) {
  struct Shape {
    int64_t T, n0, nh, dense;
  };
  const int64_t nkv = 2;
  for (int64_t hd : {256, 128, 64}) {
    for (Shape s : {Shape{203, 0, 24, 203}, Shape{197, 37, 24, 197}, Shape{250, 5, 32, 250}, Shape{211, 300, 10, 211},
                    Shape{300, 10, 24, 200}}) {
      const int64_t cap = s.n0 + s.T + 3, max_sel = s.n0 + s.T;
      auto q = random_values(hd * s.nh * s.T, 530), gate = random_values(hd * s.nh * s.T, 531);
      auto kc = random_values(hd * nkv * cap, 532), vc = random_values(hd * nkv * cap, 533);
      std::vector<int32_t> sel(max_sel * s.T, -1), n_sel(s.T);
      for (int64_t t = 0; t < s.T; ++t)
        for (int64_t p = 0; p <= s.n0 + t; ++p)
          if (t < s.dense || p % 3 != 1) sel[t * max_sel + n_sel[t]++] = static_cast<int32_t>(p);
      const QsaCase c{q, gate, kc, vc, sel, n_sel, hd, s.nh, nkv, cap, max_sel, s.T,
                      1.0f / std::sqrt(static_cast<float>(hd)), s.n0, s.dense};
      report_close(run_qsa_attend(*cuda, c), widen(run_qsa_attend(*ref, c)), 2e-6,
                   "qsa_attend dense hd=" + std::to_string(hd) + " G=" + std::to_string(s.nh / nkv) +
                       " T=" + std::to_string(s.T) + " n0=" + std::to_string(s.n0) + " dense rows " +
                       std::to_string(s.dense));
    }
  }
}

// The int8 tile against the float64 product of the dequantized weights with the activations
// rounded as quant rounds them (Q8_0 or Q8_K): equal up to FP32 accumulation, so a code or scale
// off anywhere shows. K of 20 stages (few tiles split K over blocks) and a short K (for 32-value
// blocks 11 chunks: a partial last stage),
// token counts around the 64-column tile, rows that leave a partial tile, a few large channels.
TEST_F(CudaVsRef, MulMatInt8TileOnRoundedActivations) {
  const int64_t N = 150;
  for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                        GgmlType::Q4_K, GgmlType::Q5_K}) {
    const bool block256 = traits(type).block_size == 256;
    for (int64_t K : {int64_t{2560}, block256 ? int64_t{768} : int64_t{352}}) {
      auto w = make_weight("w", type, {K, N, 1, 1}, random_values(K * N, 21, 0.05f));
      const auto wv = w->values();
      for (int64_t T : {9, 64, 65, 200}) {
        auto x = random_values(K * T, 22 + T);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t k = 3; k < K; k += 97) x[t * K + k] *= 300.0f;
        const auto xr = rounded_activations(type, x, K);
        Tensor out = cuda->alloc_f32(N, T);
        cuda->mul_mat(w->w, upload(*cuda, x, {K, T, 1, 1}), out);
        std::vector<double> want(N * T);
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = 0; n < N; ++n) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k) s += static_cast<double>(wv[n * K + k]) * xr[t * K + k];
            want[t * N + n] = s;
          }
        report_close(cuda->read_f32(out), want, matmul_tolerance(K),
                     "int8 " + std::string(type_name(type)) + " K=" + std::to_string(K) + " T=" + std::to_string(T));
      }
    }
  }
}

// The chunked scan over many chunks (more than one round of the chunk kernels at T = 2100), with
// fast and slow decay, odd head widths and the model's 128 × 128 heads, against the reference. dk =
// 128 takes the tensor-core state pass (dv = 40 masks its last column block), dk = 5 the FMA one.
TEST_F(CudaVsRef, GdnChunkedLongScans) {
  struct Case {
    int64_t nk, nv, dk, dv, T;
    float decay;  // g = −decay·u, u uniform in (0, 1)
  };
  for (Case c : {Case{2, 4, 128, 40, 300, 1.0f}, Case{2, 4, 128, 40, 1000, 1.0f}, Case{2, 4, 128, 40, 2100, 0.02f},
                 Case{1, 3, 5, 19, 130, 0.5f}, Case{2, 2, 128, 128, 200, 0.05f}, Case{2, 4, 128, 128, 700, 0.5f}}) {
    const int64_t C = 2 * c.nk * c.dk + c.nv * c.dv;
    auto qkv = random_values(C * c.T, 200 + c.T);
    std::vector<float> g(c.nv * c.T), beta(c.nv * c.T);
    std::mt19937 rng(static_cast<uint32_t>(c.T));
    std::uniform_real_distribution<float> u(0, 1);
    for (auto& v : g) v = -c.decay * u(rng);
    for (auto& v : beta) v = u(rng);
    auto s0 = random_values(c.dv * c.dk * c.nv, 201, 0.3f);
    std::vector<float> out[2], state[2];
    int i = 0;
    for (Backend* be : {cuda.get(), ref.get()}) {
      Tensor tq = upload(*be, qkv, {C, c.T, 1, 1}), tg = upload(*be, g, {c.nv, c.T, 1, 1}),
             tb = upload(*be, beta, {c.nv, c.T, 1, 1});
      Tensor st = upload(*be, s0, {c.dv, c.dk, c.nv, 1}), o = be->alloc_f32(c.dv * c.nv, c.T);
      be->gdn_chunked({.qkv = &tq, .g = &tg, .beta = &tb, .state = &st, .out = &o, .n_k_heads = c.nk,
                       .n_v_heads = c.nv, .dk = c.dk, .dv = c.dv});
      out[i] = be->read_f32(o);
      state[i] = be->read_f32(st);
      ++i;
    }
    const std::string what = "dk=" + std::to_string(c.dk) + " dv=" + std::to_string(c.dv) + " T=" + std::to_string(c.T);
    report_close(out[0], widen(out[1]), 2e-6, "gdn_chunked out " + what);
    report_close(state[0], widen(state[1]), 2e-6, "gdn_chunked state " + what);
  }
}

}  // namespace
}  // namespace regolith::test
