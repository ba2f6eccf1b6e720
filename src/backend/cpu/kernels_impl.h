// The kernel bodies of kernels.h, written once as templates over an instruction-set policy P:
//   V, W                 vector type and its float lanes
//   RB×TB, RB1           mat tile (weight rows × tokens), and rows per tile when one token
//   zero/set1/load/store/fma/mul/add/sub/reduce, load_n/store_n (the first n < W lanes)
//   load_f16/load_bf16 (+ _n), load_q8 (W int8 → float), f16_scalar, exp
// Included only by kernels_<isa>.cpp, each compiled with its target flags. Everything here has
// internal linkage and calls nothing from the standard library, so no instruction of one set can
// leak into a function another translation unit links against.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels.h"

namespace regolith::cpu {
namespace {

inline int64_t min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return h;
}

// ---- weight rows, widened to FP32 in registers ---------------------------------------------

template <class P, WType WT>
struct WRow;

template <class P>
struct WRow<P, WType::F32> {
  static typename P::V at(const uint8_t* row, int64_t k) { return P::load(reinterpret_cast<const float*>(row) + k); }
  static typename P::V at_n(const uint8_t* row, int64_t k, int n) {
    return P::load_n(reinterpret_cast<const float*>(row) + k, n);
  }
};

template <class P>
struct WRow<P, WType::F16> {
  static typename P::V at(const uint8_t* row, int64_t k) { return P::load_f16(reinterpret_cast<const uint16_t*>(row) + k); }
  static typename P::V at_n(const uint8_t* row, int64_t k, int n) {
    return P::load_f16_n(reinterpret_cast<const uint16_t*>(row) + k, n);
  }
};

template <class P>
struct WRow<P, WType::BF16> {
  static typename P::V at(const uint8_t* row, int64_t k) { return P::load_bf16(reinterpret_cast<const uint16_t*>(row) + k); }
  static typename P::V at_n(const uint8_t* row, int64_t k, int n) {
    return P::load_bf16_n(reinterpret_cast<const uint16_t*>(row) + k, n);
  }
};

// Q8_0 blocks {f16 d; int8 q[32]} (34 bytes): value = q·d in FP32, as dequantize_row computes it.
// Rows are whole blocks and W divides 32, so there is never a partial vector.
template <class P>
struct WRow<P, WType::Q8_0> {
  static typename P::V at(const uint8_t* row, int64_t k) {
    const uint8_t* b = row + (k >> 5) * 34;
    return P::mul(P::load_q8(reinterpret_cast<const int8_t*>(b + 2 + (k & 31))), P::set1(P::f16_scalar(load_u16(b))));
  }
  static typename P::V at_n(const uint8_t* row, int64_t k, int) { return at(row, k); }
};

// ---- weight rows × tokens -------------------------------------------------------------------

// Q8_0 block by block: each row's scale is widened once per block, then every sub-vector of 32
// quants becomes q·d (bit-equal to dequantize_row) and meets the TB tokens. (One token takes
// quant's integer dot instead: cpu_matmul.cpp.)
template <class P, int RB, int TB>
void mat_tile_q8_0(const uint8_t* w, uint64_t row_bytes, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo) {
  using V = typename P::V;
  V acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = P::zero();
  for (int64_t b = 0; b < K / 32; ++b) {
    V d[RB];
    for (int r = 0; r < RB; ++r) d[r] = P::set1(P::f16_scalar(load_u16(w + r * row_bytes + b * 34)));
    for (int s = 0; s < 32; s += P::W) {
      V xv[TB];
      for (int t = 0; t < TB; ++t) xv[t] = P::load(x + t * ldx + b * 32 + s);
      for (int r = 0; r < RB; ++r) {
        V wv = P::mul(P::load_q8(reinterpret_cast<const int8_t*>(w + r * row_bytes + b * 34 + 2 + s)), d[r]);
        for (int t = 0; t < TB; ++t) acc[r][t] = P::fma(wv, xv[t], acc[r][t]);
      }
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) out[t * ldo + r] = P::reduce(acc[r][t]);
}

template <class P, WType WT, int RB, int TB>
void mat_tile(const uint8_t* w, uint64_t row_bytes, int64_t K, const float* x, int64_t ldx, float* out, int64_t ldo) {
  if constexpr (WT == WType::Q8_0) return mat_tile_q8_0<P, RB, TB>(w, row_bytes, K, x, ldx, out, ldo);
  using V = typename P::V;
  V acc[RB][TB];
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) acc[r][t] = P::zero();
  int64_t k = 0;
  for (; k + P::W <= K; k += P::W) {
    V xv[TB];
    for (int t = 0; t < TB; ++t) xv[t] = P::load(x + t * ldx + k);
    for (int r = 0; r < RB; ++r) {
      V wv = WRow<P, WT>::at(w + r * row_bytes, k);
      for (int t = 0; t < TB; ++t) acc[r][t] = P::fma(wv, xv[t], acc[r][t]);
    }
  }
  if (k < K) {
    int n = static_cast<int>(K - k);
    V xv[TB];
    for (int t = 0; t < TB; ++t) xv[t] = P::load_n(x + t * ldx + k, n);
    for (int r = 0; r < RB; ++r) {
      V wv = WRow<P, WT>::at_n(w + r * row_bytes, k, n);
      for (int t = 0; t < TB; ++t) acc[r][t] = P::fma(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int t = 0; t < TB; ++t) out[t * ldo + r] = P::reduce(acc[r][t]);
}

template <class P, WType WT, int RB, int TB = P::TB>
void mat_tile_n(int tb, const uint8_t* w, uint64_t row_bytes, int64_t K, const float* x, int64_t ldx, float* out,
                int64_t ldo) {
  if constexpr (TB > 1) {
    if (tb < TB) return mat_tile_n<P, WT, RB, TB - 1>(tb, w, row_bytes, K, x, ldx, out, ldo);
  }
  mat_tile<P, WT, RB, TB>(w, row_bytes, K, x, ldx, out, ldo);
}

// Tokens in chunks that stay in cache while every row block passes over them.
constexpr int64_t kTokenChunk = 64;

template <class P, WType WT>
void mat(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, int64_t K, const float* x, int64_t ldx, int64_t n_tok,
         float* out, int64_t ldo) {
  if (n_tok == 1) {
    int64_t r = 0;
    for (; r + P::RB1 <= n_rows; r += P::RB1) mat_tile<P, WT, P::RB1, 1>(w + r * row_bytes, row_bytes, K, x, ldx, out + r, ldo);
    for (; r < n_rows; ++r) mat_tile<P, WT, 1, 1>(w + r * row_bytes, row_bytes, K, x, ldx, out + r, ldo);
    return;
  }
  for (int64_t t0 = 0; t0 < n_tok; t0 += kTokenChunk) {
    int64_t t1 = min_i64(n_tok, t0 + kTokenChunk);
    for (int64_t r = 0; r < n_rows; r += P::RB) {
      int64_t rb = min_i64(P::RB, n_rows - r);
      for (int64_t t = t0; t < t1; t += P::TB) {
        int tb = static_cast<int>(min_i64(P::TB, t1 - t));
        const float* xt = x + t * ldx;
        float* ot = out + t * ldo + r;
        if (rb == P::RB)
          mat_tile_n<P, WT, P::RB>(tb, w + r * row_bytes, row_bytes, K, xt, ldx, ot, ldo);
        else
          for (int64_t i = 0; i < rb; ++i) mat_tile_n<P, WT, 1>(tb, w + (r + i) * row_bytes, row_bytes, K, xt, ldx, ot + i, ldo);
      }
    }
  }
}

template <class P, WType WT>
void to_f32(const uint8_t* row, int64_t n, float* out) {
  int64_t k = 0;
  for (; k + P::W <= n; k += P::W) P::store(out + k, WRow<P, WT>::at(row, k));
  if (k < n) P::store_n(out + k, WRow<P, WT>::at_n(row, k, static_cast<int>(n - k)), static_cast<int>(n - k));
}

// ---- C = A·B with B row-major: outer products, C rows vectorized ------------------------------

template <class P, int MR, int NV>
void gemm_nn_tile(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t K, int last_n,
                  bool accumulate) {
  using V = typename P::V;
  V c[MR][NV];
  auto lanes = [&](int v) { return v == NV - 1 ? last_n : P::W; };
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v)
      c[m][v] = !accumulate ? P::zero()
                : lanes(v) == P::W ? P::load(C + m * ldc + v * P::W)
                                   : P::load_n(C + m * ldc + v * P::W, lanes(v));
  for (int64_t k = 0; k < K; ++k) {
    V b[NV];
    for (int v = 0; v < NV; ++v)
      b[v] = lanes(v) == P::W ? P::load(B + k * ldb + v * P::W) : P::load_n(B + k * ldb + v * P::W, lanes(v));
    for (int m = 0; m < MR; ++m) {
      V a = P::set1(A[m * lda + k]);
      for (int v = 0; v < NV; ++v) c[m][v] = P::fma(a, b[v], c[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) {
      if (lanes(v) == P::W)
        P::store(C + m * ldc + v * P::W, c[m][v]);
      else
        P::store_n(C + m * ldc + v * P::W, c[m][v], lanes(v));
    }
}

template <class P>
void gemm_nn(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t M, int64_t N,
             int64_t K, bool accumulate) {
  constexpr int MR = 4, NV = 2;
  for (int64_t j = 0; j < N; j += NV * P::W) {
    int64_t cols = min_i64(NV * P::W, N - j);
    int64_t m = 0;
    if (cols == NV * P::W) {
      for (; m + MR <= M; m += MR)
        gemm_nn_tile<P, MR, NV>(A + m * lda, lda, B + j, ldb, C + m * ldc + j, ldc, K, P::W, accumulate);
      for (; m < M; ++m) gemm_nn_tile<P, 1, NV>(A + m * lda, lda, B + j, ldb, C + m * ldc + j, ldc, K, P::W, accumulate);
      continue;
    }
    for (int64_t j1 = j; j1 < j + cols; j1 += P::W) {
      int n = static_cast<int>(min_i64(P::W, j + cols - j1));
      for (m = 0; m + MR <= M; m += MR)
        gemm_nn_tile<P, MR, 1>(A + m * lda, lda, B + j1, ldb, C + m * ldc + j1, ldc, K, n, accumulate);
      for (; m < M; ++m) gemm_nn_tile<P, 1, 1>(A + m * lda, lda, B + j1, ldb, C + m * ldc + j1, ldc, K, n, accumulate);
    }
  }
}

// ---- vectors --------------------------------------------------------------------------------

template <class P>
float dot(const float* a, const float* b, int64_t n) {
  using V = typename P::V;
  V s0 = P::zero(), s1 = P::zero(), s2 = P::zero(), s3 = P::zero();
  int64_t i = 0;
  for (; i + 4 * P::W <= n; i += 4 * P::W) {
    s0 = P::fma(P::load(a + i), P::load(b + i), s0);
    s1 = P::fma(P::load(a + i + P::W), P::load(b + i + P::W), s1);
    s2 = P::fma(P::load(a + i + 2 * P::W), P::load(b + i + 2 * P::W), s2);
    s3 = P::fma(P::load(a + i + 3 * P::W), P::load(b + i + 3 * P::W), s3);
  }
  for (; i + P::W <= n; i += P::W) s0 = P::fma(P::load(a + i), P::load(b + i), s0);
  if (i < n) {
    int r = static_cast<int>(n - i);
    s1 = P::fma(P::load_n(a + i, r), P::load_n(b + i, r), s1);
  }
  return P::reduce(P::add(P::add(s0, s1), P::add(s2, s3)));
}

template <class P>
float sum_squares(const float* x, int64_t n) {
  return dot<P>(x, x, n);
}

template <class P>
void axpy(float a, const float* x, float* y, int64_t n) {
  typename P::V av = P::set1(a);
  int64_t i = 0;
  for (; i + P::W <= n; i += P::W) P::store(y + i, P::fma(av, P::load(x + i), P::load(y + i)));
  if (i < n) {
    int r = static_cast<int>(n - i);
    P::store_n(y + i, P::fma(av, P::load_n(x + i, r), P::load_n(y + i, r)), r);
  }
}

template <class P>
void scale(float a, float* x, int64_t n) {
  typename P::V av = P::set1(a);
  int64_t i = 0;
  for (; i + P::W <= n; i += P::W) P::store(x + i, P::mul(av, P::load(x + i)));
  if (i < n) {
    int r = static_cast<int>(n - i);
    P::store_n(x + i, P::mul(av, P::load_n(x + i, r)), r);
  }
}

template <class P>
float exp_sum(float* x, int64_t n, float shift) {
  typename P::V sv = P::set1(shift), acc = P::zero();
  int64_t i = 0;
  for (; i + P::W <= n; i += P::W) {
    typename P::V e = P::exp(P::sub(P::load(x + i), sv));
    P::store(x + i, e);
    acc = P::add(acc, e);
  }
  if (i < n) {
    int r = static_cast<int>(n - i);
    typename P::V e = P::exp(P::sub(P::load_n(x + i, r), sv));
    P::store_n(x + i, e, r);
    acc = P::add(acc, P::load_n(x + i, r));  // only the valid lanes
  }
  return P::reduce(acc);
}

// ---- the delta rule, one token of one head ----------------------------------------------------

// Columns of S in groups of up to 4 vectors: both passes over a group's dk rows run while they
// are in L1, and kᵀS / the delta / qᵀS of the group stay in registers.
template <class P>
void gdn_step(float* S, int64_t dk, int64_t dv, const float* q, const float* k, const float* v, float decay, float beta,
              float* out) {
  using V = typename P::V;
  constexpr int kVecs = 4;
  const V vdecay = P::set1(decay), vbeta = P::set1(beta);
  for (int64_t j0 = 0; j0 < dv; j0 += kVecs * P::W) {
    int64_t cols = min_i64(kVecs * P::W, dv - j0);
    int nvec = static_cast<int>((cols + P::W - 1) / P::W);
    int last = static_cast<int>(cols - (nvec - 1) * P::W);
    auto ld = [&](const float* p, int u) { return u == nvec - 1 && last < P::W ? P::load_n(p, last) : P::load(p); };
    auto st = [&](float* p, V x, int u) {
      if (u == nvec - 1 && last < P::W)
        P::store_n(p, x, last);
      else
        P::store(p, x);
    };
    V kv[kVecs], acc[kVecs];
    for (int u = 0; u < kVecs; ++u) kv[u] = P::zero();
    for (int64_t i = 0; i < dk; ++i) {
      V ki = P::set1(k[i]);
      float* row = S + i * dv + j0;
      for (int u = 0; u < nvec; ++u) {
        V s = P::mul(ld(row + u * P::W, u), vdecay);
        st(row + u * P::W, s, u);
        kv[u] = P::fma(s, ki, kv[u]);
      }
    }
    for (int u = 0; u < nvec; ++u) {
      kv[u] = P::mul(vbeta, P::sub(ld(v + j0 + u * P::W, u), kv[u]));  // the delta
      acc[u] = P::zero();
    }
    for (int64_t i = 0; i < dk; ++i) {
      V ki = P::set1(k[i]), qi = P::set1(q[i]);
      float* row = S + i * dv + j0;
      for (int u = 0; u < nvec; ++u) {
        V s = P::fma(ki, kv[u], ld(row + u * P::W, u));
        st(row + u * P::W, s, u);
        acc[u] = P::fma(s, qi, acc[u]);
      }
    }
    for (int u = 0; u < nvec; ++u) st(out + j0 + u * P::W, acc[u], u);
  }
}

// The table of one policy; dot_f64 comes from the instruction-set file.
template <class P>
constexpr Kernels make_kernels(Isa isa, double (*dot_f64)(const float*, const float*, int64_t)) {
  return Kernels{
      .isa = isa,
      .mat = {mat<P, WType::F32>, mat<P, WType::F16>, mat<P, WType::BF16>, mat<P, WType::Q8_0>},
      .to_f32 = {to_f32<P, WType::F32>, to_f32<P, WType::F16>, to_f32<P, WType::BF16>, to_f32<P, WType::Q8_0>},
      .gemm_nn = gemm_nn<P>,
      .dot = dot<P>,
      .dot_f64 = dot_f64,
      .sum_squares = sum_squares<P>,
      .axpy = axpy<P>,
      .scale = scale<P>,
      .exp_sum = exp_sum<P>,
      .gdn_step = gdn_step<P>,
  };
}

}  // namespace
}  // namespace regolith::cpu
