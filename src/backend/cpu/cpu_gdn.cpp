// CPU Gated DeltaNet (model-spec §4.4): gates, the recurrent step (decode), the chunked WY/UT
// form (prefill) and the sigmoid-gated output norm. The state is computed in FP32 (a BF16 state is
// widened per head for the call and rounded back at its end); v heads are independent and split
// over threads. Per chunk the WY form is a handful of small matrix products
// (kernels' mat and gemm_nn) around two triangular forward substitutions.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"
#include "core/half.h"

namespace regolith {

using namespace cpu;

namespace {

constexpr int64_t kChunk = 64;  // as ref; any size gives the same result

// Head h's state as FP32: in place, or widened from BF16 into `wide`.
float* head_state(const GdnScanArgs& a, int64_t h, std::vector<float>& wide) {
  const int64_t n = a.dk * a.dv;
  if (a.state->dtype() != DType::BF16) return a.state->f32() + h * n;
  wide.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) wide[i] = bf16_to_f32(a.state->bf16()[h * n + i]);
  return wide.data();
}

// Rounds a widened head state back into a BF16 state.
void keep_head_state(const GdnScanArgs& a, int64_t h, const float* S) {
  if (a.state->dtype() != DType::BF16) return;
  const int64_t n = a.dk * a.dv;
  for (int64_t i = 0; i < n; ++i) a.state->bf16()[h * n + i] = f32_to_bf16(S[i]);
}

// q (l2-normed, times 1/sqrt(dk)) and k (l2-normed) of v head h at token t.
void load_qk(const Kernels& k, const GdnScanArgs& a, int64_t h, int64_t t, float* q, float* kk) {
  int64_t C = a.qkv->ne(0), dk = a.dk, nk = a.n_k_heads, kh = h % nk;
  const float* row = a.qkv->f32() + t * C;
  const float* qs = row + kh * dk;
  const float* ks = row + nk * dk + kh * dk;
  float rq = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)) / std::sqrt(double(k.sum_squares(qs, dk)) + 1e-6));
  float rk = static_cast<float>(1.0 / std::sqrt(double(k.sum_squares(ks, dk)) + 1e-6));
  for (int64_t i = 0; i < dk; ++i) q[i] = qs[i] * rq, kk[i] = ks[i] * rk;
}

const float* v_of(const GdnScanArgs& a, int64_t h, int64_t t) {
  return a.qkv->f32() + t * a.qkv->ne(0) + 2 * a.n_k_heads * a.dk + h * a.dv;
}

// One chunk of L tokens from c0 for v head h; S [dk][dv] is read and advanced.
struct ChunkScratch {
  std::vector<float> Q, K, U, Wk, Vn, KK, QK, P, KdT, tmp;
  std::vector<double> G;
  void resize(int64_t L, int64_t dk, int64_t dv) {
    Q.resize(L * dk), K.resize(L * dk), Wk.resize(L * dk), KdT.resize(dk * L);
    U.resize(L * dv), Vn.resize(L * dv), tmp.resize(L * dv);
    KK.resize(L * L), QK.resize(L * L), P.resize(L * L);
    G.resize(L);
  }
};

void gdn_chunk(const Kernels& k, const GdnScanArgs& a, int64_t h, int64_t c0, int64_t L, float* S, ChunkScratch& c) {
  int64_t dk = a.dk, dv = a.dv, nv = a.n_v_heads;
  for (int64_t t = 0; t < L; ++t) {
    load_qk(k, a, h, c0 + t, &c.Q[t * dk], &c.K[t * dk]);
    c.G[t] = (t ? c.G[t - 1] : 0.0) + a.g->f32()[(c0 + t) * nv + h];
  }
  const uint8_t* Kb = reinterpret_cast<const uint8_t*>(c.K.data());
  k.mat[0](Kb, dk * 4, L, dk, c.K.data(), dk, L, c.KK.data(), L);  // KK[t][s] = k_t·k_s
  k.mat[0](Kb, dk * 4, L, dk, c.Q.data(), dk, L, c.QK.data(), L);  // QK[t][s] = q_t·k_s
  // (I + A) U = diag(beta) V and (I + A) Wk = diag(beta ⊙ exp(G)) K, A[t][s] = beta_t (k_t·k_s)
  // exp(G_t − G_s) for s < t, by forward substitution.
  for (int64_t t = 0; t < L; ++t) {
    float beta = a.beta->f32()[(c0 + t) * nv + h];
    const float* v = v_of(a, h, c0 + t);
    float* Ut = &c.U[t * dv];
    float* Wt = &c.Wk[t * dk];
    float bg = static_cast<float>(beta * std::exp(c.G[t]));
    for (int64_t j = 0; j < dv; ++j) Ut[j] = beta * v[j];
    for (int64_t i = 0; i < dk; ++i) Wt[i] = bg * c.K[t * dk + i];
    for (int64_t s = 0; s < t; ++s) {
      float m = static_cast<float>(beta * c.KK[t * L + s] * std::exp(c.G[t] - c.G[s]));
      k.axpy(-m, &c.U[s * dv], Ut, dv);
      k.axpy(-m, &c.Wk[s * dk], Wt, dk);
    }
  }
  // Vn = U − Wk·S: the part of the new values the carried state does not already predict.
  k.gemm_nn(c.Wk.data(), dk, S, dv, c.tmp.data(), dv, L, dv, dk, false);
  for (int64_t i = 0; i < L * dv; ++i) c.Vn[i] = c.U[i] - c.tmp[i];
  // O_t = exp(G_t)·q_t·S + Σ_{s<=t} (q_t·k_s) exp(G_t − G_s) Vn_s
  k.gemm_nn(c.Q.data(), dk, S, dv, c.tmp.data(), dv, L, dv, dk, false);
  for (int64_t t = 0; t < L; ++t) {
    k.scale(static_cast<float>(std::exp(c.G[t])), &c.tmp[t * dv], dv);
    for (int64_t s = 0; s < L; ++s)
      c.P[t * L + s] = s <= t ? static_cast<float>(c.QK[t * L + s] * std::exp(c.G[t] - c.G[s])) : 0.0f;
  }
  k.gemm_nn(c.P.data(), L, c.Vn.data(), dv, c.tmp.data(), dv, L, dv, L, true);
  for (int64_t t = 0; t < L; ++t) std::copy(&c.tmp[t * dv], &c.tmp[t * dv] + dv, a.out->f32() + (c0 + t) * nv * dv + h * dv);
  // S = exp(G_last)·S + Σ_s exp(G_last − G_s) k_s ⊗ Vn_s
  double last = c.G[L - 1];
  k.scale(static_cast<float>(std::exp(last)), S, dk * dv);
  for (int64_t s = 0; s < L; ++s) {
    float d = static_cast<float>(std::exp(last - c.G[s]));
    for (int64_t i = 0; i < dk; ++i) c.KdT[i * L + s] = d * c.K[s * dk + i];
  }
  k.gemm_nn(c.KdT.data(), L, c.Vn.data(), dv, S, dv, dk, dv, L, true);
}

}  // namespace

void CpuBackend::gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias,
                           Tensor& g, Tensor& beta) {
  check_gdn_gates(alpha, beta_raw, ssm_a, dt_bias, g, beta);
  int64_t nv = alpha.ne(0), T = alpha.ne(1);
  std::vector<float> abuf, dbuf;
  const float *A = weight_f32(k_, ssm_a, abuf), *dt = weight_f32(k_, dt_bias, dbuf);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nv; ++h) {
      double z = static_cast<double>(alpha.f32()[t * nv + h]) + dt[h];
      g.f32()[t * nv + h] = static_cast<float>(A[h] * (z > 20 ? z : std::log1p(std::exp(z))));  // PyTorch's softplus
      beta.f32()[t * nv + h] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(beta_raw.f32()[t * nv + h]))));
    }
}

void CpuBackend::gdn_recurrent(const GdnScanArgs& a) {
  check_gdn_scan(a, "gdn_recurrent");
  int64_t T = a.qkv->ne(1), dk = a.dk, dv = a.dv, nv = a.n_v_heads;
  pool_.parallel_for(nv, grain_for(nv, 4 * dk * dv * T, pool_.size()), [&](int64_t h0, int64_t h1) {
    std::vector<float> q(dk), kk(dk), wide;
    for (int64_t h = h0; h < h1; ++h) {
      float* S = head_state(a, h, wide);
      for (int64_t t = 0; t < T; ++t) {
        load_qk(k_, a, h, t, q.data(), kk.data());
        float decay = static_cast<float>(std::exp(static_cast<double>(a.g->f32()[t * nv + h])));
        k_.gdn_step(S, dk, dv, q.data(), kk.data(), v_of(a, h, t), decay, a.beta->f32()[t * nv + h],
                    a.out->f32() + t * nv * dv + h * dv);
      }
      keep_head_state(a, h, S);
    }
  });
}

void CpuBackend::gdn_chunked(const GdnScanArgs& a) {
  check_gdn_scan(a, "gdn_chunked");
  int64_t T = a.qkv->ne(1), dk = a.dk, dv = a.dv, nv = a.n_v_heads;
  int64_t head_cost = T * (6 * dk * dv + 2 * std::min(kChunk, T) * (dk + dv));
  pool_.parallel_for(nv, grain_for(nv, head_cost, pool_.size()), [&](int64_t h0, int64_t h1) {
    ChunkScratch c;
    c.resize(std::min(kChunk, T), dk, dv);
    std::vector<float> wide;
    for (int64_t h = h0; h < h1; ++h) {
      float* S = head_state(a, h, wide);
      for (int64_t c0 = 0; c0 < T; c0 += kChunk) gdn_chunk(k_, a, h, c0, std::min(kChunk, T - c0), S, c);
      keep_head_state(a, h, S);
    }
  });
}

void CpuBackend::gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) {
  check_gated_rms_norm(x, z, w, out);
  int64_t dv = w.n_elements();
  std::vector<float> wbuf;
  const float* wv = weight_f32(k_, w, wbuf);
  int64_t n_groups = x.n_elements() / dv;
  pool_.parallel_for(n_groups, grain_for(n_groups, dv * 8, pool_.size()), [&](int64_t g0, int64_t g1) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      const float *xp = x.f32() + gi * dv, *zp = z.f32() + gi * dv;
      float* op = out.f32() + gi * dv;
      float r = static_cast<float>(1.0 / std::sqrt(static_cast<double>(k_.sum_squares(xp, dv)) / dv + eps));
      for (int64_t j = 0; j < dv; ++j) op[j] = wv[j] * (xp[j] * r) * sigmoidf(zp[j]);
    }
  });
}

}  // namespace regolith
