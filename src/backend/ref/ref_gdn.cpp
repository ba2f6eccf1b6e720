// Reference Gated DeltaNet (model-spec §4.4): gates, the token-by-token delta rule and the chunked
// WY/UT form of the same recurrence, and the sigmoid-gated output norm. The state is FP32 (or BF16)
// between calls; inside a call every head is computed in FP64.
#include <cmath>

#include "backend/ref/ref_backend.h"
#include "backend/ref/ref_util.h"
#include "core/half.h"

namespace regolith {

using namespace ref;

namespace {

constexpr int64_t kChunk = 64;  // transformers' chunk size; any size gives the same result

// One v head's inputs, FP64: q (l2-normed, scaled), k (l2-normed), v, g, beta per token.
struct HeadInputs {
  int64_t T, dk, dv;
  std::vector<double> q, k, v, g, beta;  // [T][dk], [T][dk], [T][dv], [T], [T]
};

void l2_normalize(double* x, int64_t n, double scale) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  double r = scale / std::sqrt(ss + 1e-6);
  for (int64_t i = 0; i < n; ++i) x[i] *= r;
}

HeadInputs head_inputs(const GdnScanArgs& a, int64_t h) {
  int64_t T = a.qkv->ne(1), C = a.qkv->ne(0), dk = a.dk, dv = a.dv, nk = a.n_k_heads, nv = a.n_v_heads;
  int64_t kh = h % nk;
  HeadInputs in{T, dk, dv, std::vector<double>(T * dk), std::vector<double>(T * dk), std::vector<double>(T * dv),
                std::vector<double>(T), std::vector<double>(T)};
  for (int64_t t = 0; t < T; ++t) {
    const float* row = a.qkv->f32() + t * C;
    for (int64_t i = 0; i < dk; ++i) {
      in.q[t * dk + i] = row[kh * dk + i];
      in.k[t * dk + i] = row[nk * dk + kh * dk + i];
    }
    for (int64_t j = 0; j < dv; ++j) in.v[t * dv + j] = row[2 * nk * dk + h * dv + j];
    l2_normalize(&in.q[t * dk], dk, 1.0 / std::sqrt(static_cast<double>(dk)));
    l2_normalize(&in.k[t * dk], dk, 1.0);
    in.g[t] = a.g->f32()[t * nv + h];
    in.beta[t] = a.beta->f32()[t * nv + h];
  }
  return in;
}

std::vector<double> load_state(const GdnScanArgs& a, int64_t h) {
  const int64_t n = a.dk * a.dv;
  if (a.state->dtype() == DType::BF16) {
    std::vector<double> S(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) S[i] = bf16_to_f32(a.state->bf16()[h * n + i]);
    return S;
  }
  const float* s = a.state->f32() + h * n;
  return std::vector<double>(s, s + n);
}

// Rounded to FP32, and then to BF16 for a BF16 state.
void store_state(const GdnScanArgs& a, int64_t h, const std::vector<double>& S) {
  const int64_t n = a.dk * a.dv;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(S[i]);
    if (a.state->dtype() == DType::BF16)
      a.state->bf16()[h * n + i] = f32_to_bf16(v);
    else
      a.state->f32()[h * n + i] = v;
  }
}

}  // namespace

void RefBackend::gdn_gates(const Tensor& alpha, const Tensor& beta_raw, const Weight& ssm_a, const Weight& dt_bias,
                           Tensor& g, Tensor& beta) {
  check_gdn_gates(alpha, beta_raw, ssm_a, dt_bias, g, beta);
  int64_t nv = alpha.ne(0), T = alpha.ne(1);
  std::vector<float> A = weight_values(ssm_a), dt = weight_values(dt_bias);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nv; ++h) {
      g.f32()[t * nv + h] = static_cast<float>(A[h] * softplus(static_cast<double>(alpha.f32()[t * nv + h]) + dt[h]));
      beta.f32()[t * nv + h] = static_cast<float>(sigmoid(beta_raw.f32()[t * nv + h]));
    }
}

void RefBackend::gdn_recurrent(const GdnScanArgs& a) {
  check_gdn_scan(a, "gdn_recurrent");
  int64_t T = a.qkv->ne(1), dk = a.dk, dv = a.dv, nv = a.n_v_heads;
  for (int64_t h = 0; h < nv; ++h) {
    HeadInputs in = head_inputs(a, h);
    std::vector<double> S = load_state(a, h), kv(dv);  // S[i][j]
    for (int64_t t = 0; t < T; ++t) {
      const double *q = &in.q[t * dk], *k = &in.k[t * dk], *v = &in.v[t * dv];
      double decay = std::exp(in.g[t]);
      for (double& s : S) s *= decay;
      for (int64_t j = 0; j < dv; ++j) {
        double m = 0;
        for (int64_t i = 0; i < dk; ++i) m += S[i * dv + j] * k[i];
        kv[j] = in.beta[t] * (v[j] - m);  // delta
      }
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[i] * kv[j];
      for (int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[i * dv + j] * q[i];
        a.out->f32()[t * nv * dv + h * dv + j] = static_cast<float>(o);
      }
    }
    store_state(a, h, S);
  }
}

void RefBackend::gdn_chunked(const GdnScanArgs& a) {
  check_gdn_scan(a, "gdn_chunked");
  int64_t T = a.qkv->ne(1), dk = a.dk, dv = a.dv, nv = a.n_v_heads;
  for (int64_t h = 0; h < nv; ++h) {
    HeadInputs in = head_inputs(a, h);
    std::vector<double> S = load_state(a, h);
    for (int64_t c0 = 0; c0 < T; c0 += kChunk) {
      int64_t L = std::min(kChunk, T - c0);
      auto q = [&](int64_t t) { return &in.q[(c0 + t) * dk]; };
      auto k = [&](int64_t t) { return &in.k[(c0 + t) * dk]; };
      auto v = [&](int64_t t) { return &in.v[(c0 + t) * dv]; };
      auto kdot = [&](const double* x, const double* y) {
        double s = 0;
        for (int64_t i = 0; i < dk; ++i) s += x[i] * y[i];
        return s;
      };
      std::vector<double> G(L), beta(L);
      for (int64_t t = 0; t < L; ++t) {
        G[t] = (t ? G[t - 1] : 0.0) + in.g[c0 + t];
        beta[t] = in.beta[c0 + t];
      }
      // A[t][s] = beta_t (k_t·k_s) exp(G_t − G_s), s < t; solve (I + A) U = diag(beta) V and
      // (I + A) Wk = diag(beta ⊙ exp(G)) K by forward substitution.
      std::vector<double> A(L * L, 0.0), U(L * dv), Wk(L * dk);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t s = 0; s < t; ++s) A[t * L + s] = beta[t] * kdot(k(t), k(s)) * std::exp(G[t] - G[s]);
      for (int64_t t = 0; t < L; ++t) {
        for (int64_t j = 0; j < dv; ++j) U[t * dv + j] = beta[t] * v(t)[j];
        for (int64_t i = 0; i < dk; ++i) Wk[t * dk + i] = beta[t] * std::exp(G[t]) * k(t)[i];
        for (int64_t s = 0; s < t; ++s) {
          double m = A[t * L + s];
          for (int64_t j = 0; j < dv; ++j) U[t * dv + j] -= m * U[s * dv + j];
          for (int64_t i = 0; i < dk; ++i) Wk[t * dk + i] -= m * Wk[s * dk + i];
        }
      }
      // Vn = U − Wk·S: the part of the new values the carried state does not already predict.
      std::vector<double> Vn(L * dv);
      for (int64_t t = 0; t < L; ++t)
        for (int64_t j = 0; j < dv; ++j) {
          double m = 0;
          for (int64_t i = 0; i < dk; ++i) m += Wk[t * dk + i] * S[i * dv + j];
          Vn[t * dv + j] = U[t * dv + j] - m;
        }
      // O_t = exp(G_t)·q_t·S + Σ_{s<=t} (q_t·k_s) exp(G_t − G_s) Vn_s
      for (int64_t t = 0; t < L; ++t) {
        std::vector<double> o(dv, 0.0);
        double e = std::exp(G[t]);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) o[j] += e * q(t)[i] * S[i * dv + j];
        for (int64_t s = 0; s <= t; ++s) {
          double m = kdot(q(t), k(s)) * std::exp(G[t] - G[s]);
          for (int64_t j = 0; j < dv; ++j) o[j] += m * Vn[s * dv + j];
        }
        for (int64_t j = 0; j < dv; ++j) a.out->f32()[(c0 + t) * nv * dv + h * dv + j] = static_cast<float>(o[j]);
      }
      // S = exp(G_last)·S + Σ_s exp(G_last − G_s) k_s ⊗ Vn_s
      double last = G[L - 1];
      for (double& s : S) s *= std::exp(last);
      for (int64_t s = 0; s < L; ++s) {
        double d = std::exp(last - G[s]);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += d * k(s)[i] * Vn[s * dv + j];
      }
    }
    store_state(a, h, S);
  }
}

void RefBackend::gated_rms_norm(const Tensor& x, const Tensor& z, const Weight& w, float eps, Tensor& out) {
  check_gated_rms_norm(x, z, w, out);
  int64_t dv = w.n_elements();
  std::vector<float> wv = weight_values(w);
  std::vector<float> n(dv);
  for (int64_t gi = 0; gi < x.n_elements() / dv; ++gi) {
    rms_norm_row(x.f32() + gi * dv, nullptr, dv, eps, n.data());
    for (int64_t j = 0; j < dv; ++j)
      out.f32()[gi * dv + j] = static_cast<float>(wv[j] * static_cast<double>(n[j]) * sigmoid(z.f32()[gi * dv + j]));
  }
}

}  // namespace regolith
