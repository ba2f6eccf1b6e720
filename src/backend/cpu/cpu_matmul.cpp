// Matrix products with weight rows: the mul_mat op and the row-split helpers the other op files
// use (HC read, MoE experts). Rows are split over threads. Quantized rows met by few tokens
// (decode) go through quant's dot kernels against activations quantized once per call (Q8_0 or
// Q8_K, as llama.cpp does); float rows, and quantized rows met by more tokens, go through the
// kernel table's FP32 rows × tokens tiles (kernels_impl.h), quantized rows dequantized a few at a
// time first.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_util.h"
#include "quant/dot.h"
#include "quant/rows.h"

namespace regolith {
namespace cpu {

namespace {

// Rows dequantized at once for types without a direct kernel, and for the direct types once this
// many tokens share them: the kernels widen a row in registers for every block of tokens, so with
// many tokens one widening into an FP32 buffer and the FP32 tiles are cheaper.
constexpr int64_t kDequantRows = 16;
constexpr int64_t kWidenOnceTokens = 8;

// Up to this many tokens, quantized rows meet quantized activations in quant's dot kernels. Each
// token decodes the row again (from L1), so that cost grows with the tokens, while the FP32 path
// pays mostly for dequantize_row, once per call. Crossovers measured on a 2560×10240 matrix (one
// thread, AVX-512 VNNI): about 16 tokens for Q4_0, IQ4_NL and Q4_K, beyond 32 for Q6_K and
// IQ2_XXS. Q8_0 takes the integer dot for one token only (1.6 against 1.9 ms): its FP32 kernel
// widens rows in registers and shares them between tokens, which is faster from two tokens on.
constexpr int64_t kVecDotMaxTokens = 16;

// quant's dot kernels matching the kernel set k: its AVX-512 kernels also need VNNI, so an
// AVX-512 CPU without it runs the AVX2 ones.
quant::Isa dot_isa(const Kernels& k) {
  switch (k.isa) {
    case Isa::avx512: return quant::isa_supported(quant::Isa::avx512) ? quant::Isa::avx512 : quant::Isa::avx2;
    case Isa::avx2: return quant::Isa::avx2;
    case Isa::scalar: break;
  }
  return quant::Isa::scalar;
}

bool is_float(GgmlType type) { return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16; }

void vec_dot_rows(const Kernels& k, const WeightRows& w, int64_t r0, int64_t r1, const MatInput& in, float* out,
                  int64_t ldo) {
  const uint8_t* q = quant::activation_type(w.type) == GgmlType::Q8_K ? in.q8_k : in.q8_0;
  if (!q) fail("mat_rows: the input of ", type_name(w.type), " rows was not quantized for them");
  const quant::VecDot dot = quant::vec_dot_kernel(w.type, dot_isa(k));
  const uint64_t stride = quant::activation_bytes(w.type, w.K);
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + static_cast<uint64_t>(r) * w.row_bytes;
    for (int64_t t = 0; t < in.T; ++t) out[t * ldo + r - r0] = dot(w.K, row, q + t * stride);
  }
}

}  // namespace

bool uses_vec_dot(GgmlType type, int64_t T) {
  if (is_float(type) || !quant::has_vec_dot(type)) return false;
  return T <= (type == GgmlType::Q8_0 ? 1 : kVecDotMaxTokens);
}

MatInput MatInput::tokens(int64_t t0, int64_t n) const {
  MatInput v{.x = x + t0 * ldx, .ldx = ldx, .K = K, .T = n};
  if (q8_0) v.q8_0 = q8_0 + t0 * row_bytes(GgmlType::Q8_0, K);
  if (q8_k) v.q8_k = q8_k + t0 * row_bytes(GgmlType::Q8_K, K);
  return v;
}

MatInput mat_input(ThreadPool& pool, std::initializer_list<GgmlType> types, int64_t group_T, const float* x, int64_t ldx,
                   int64_t K, int64_t T, QuantizedTokens& buf) {
  MatInput in{.x = x, .ldx = ldx, .K = K, .T = T};
  for (GgmlType type : types) {
    if (!uses_vec_dot(type, group_T)) continue;
    GgmlType format = quant::activation_type(type);
    std::vector<uint8_t>& bytes = format == GgmlType::Q8_K ? buf.q8_k : buf.q8_0;
    const uint8_t*& q = format == GgmlType::Q8_K ? in.q8_k : in.q8_0;
    if (q) continue;  // another of `types` reads the same format
    uint64_t stride = row_bytes(format, K);
    bytes.resize(static_cast<size_t>(T * stride));
    pool.parallel_for(T, grain_for(T, 4 * K, pool.size()), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) quant::quantize_activations(type, x + t * ldx, K, bytes.data() + t * stride);
    });
    q = bytes.data();
  }
  return in;
}

void row_to_f32(const Kernels& k, const WeightRows& w, int64_t r, float* out) {
  const uint8_t* row = w.data + static_cast<uint64_t>(r) * w.row_bytes;
  WType wt;
  if (direct_wtype(w.type, wt))
    k.to_f32[static_cast<int>(wt)](row, w.K, out);
  else
    dequantize_row(w.type, row, w.K, out);
}

void mat_rows(const Kernels& k, const WeightRows& w, int64_t r0, int64_t r1, const MatInput& in, float* out, int64_t ldo) {
  if (r1 <= r0 || in.T <= 0) return;
  if (in.K != w.K) fail("mat_rows: rows of ", w.K, " values met tokens of ", in.K);
  if (uses_vec_dot(w.type, in.T)) return vec_dot_rows(k, w, r0, r1, in, out, ldo);
  WType wt;
  if (direct_wtype(w.type, wt) && (wt == WType::F32 || in.T < kWidenOnceTokens)) {
    k.mat[static_cast<int>(wt)](w.data + static_cast<uint64_t>(r0) * w.row_bytes, w.row_bytes, r1 - r0, w.K, in.x,
                                in.ldx, in.T, out, ldo);
    return;
  }
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(kDequantRows * w.K));
  for (int64_t r = r0; r < r1; r += kDequantRows) {
    int64_t n = std::min(kDequantRows, r1 - r);
    for (int64_t i = 0; i < n; ++i) row_to_f32(k, w, r + i, buf.data() + i * w.K);
    k.mat[static_cast<int>(WType::F32)](reinterpret_cast<const uint8_t*>(buf.data()), w.K * 4, n, w.K, in.x, in.ldx,
                                        in.T, out + (r - r0), ldo);
  }
}

void mat_parallel(ThreadPool& pool, const Kernels& k, const WeightRows& w, int64_t N, const MatInput& in, float* out,
                  int64_t ldo) {
  // Chunks of whole 16-row groups keep every kernel tile full.
  int64_t grain = grain_for(N, w.K * in.T, pool.size());
  if (grain < N) grain = std::min(N, (grain + 15) / 16 * 16);
  pool.parallel_for(N, grain, [&](int64_t r0, int64_t r1) { mat_rows(k, w, r0, r1, in, out + r0, ldo); });
}

const float* weight_f32(const Kernels& k, const Weight& w, std::vector<float>& buf) {
  if (w.type == GgmlType::F32) return reinterpret_cast<const float*>(w.data);
  buf.resize(static_cast<size_t>(w.n_elements()));
  WeightRows rows = rows_of(w);
  for (int64_t r = 0; r < w.n_rows(); ++r) row_to_f32(k, rows, r, buf.data() + r * w.ne[0]);
  return buf.data();
}

}  // namespace cpu

void CpuBackend::mul_mat(const Weight& w, const Tensor& x, Tensor& out) {
  check_mul_mat(w, x, out);
  int64_t K = w.ne[0], N = w.ne[1], T = x.ne(1);
  cpu::QuantizedTokens xq;
  cpu::MatInput in = cpu::mat_input(pool_, {w.type}, T, x.f32(), K, K, T, xq);
  cpu::mat_parallel(pool_, k_, cpu::rows_of(w), N, in, out.f32(), N);
}

}  // namespace regolith
