// The CPU backend's inner loops, one table per instruction set (scalar, AVX2+FMA+F16C, AVX-512
// F/BW/VL), chosen at run time. The op files (cpu_*.cpp) are plain C++ that call through this table;
// only kernels_<isa>.cpp are compiled with target flags, and they run only after kernels.cpp has
// checked the CPU, so the default build needs no -march.
//
// Weight rows for `mat` come straight from the GGUF mapping in one of the four direct types (F32,
// F16, BF16, Q8_0), or as FP32 rows dequantized from any other type; they are widened to FP32 in
// registers (Q8_0 as q·d, bit-equal to dequantize_row) and multiplied with FP32 activations, so
// results stay within float32 accumulation error of the float64 reference. Quantized rows that
// few tokens share bypass this table for quant's integer dot kernels (cpu_matmul.cpp).
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace regolith::cpu {

enum class Isa : uint8_t { scalar, avx2, avx512 };

enum class WType : uint8_t { F32, F16, BF16, Q8_0 };
inline constexpr int kWTypes = 4;

// out[t·ldo + r] = Σ_k W_r[k]·x[t·ldx + k] for r < n_rows, t < n_tok; W_r = w + r·row_bytes,
// K values each (Q8_0: K a multiple of 32).
using MatFn = void (*)(const uint8_t* w, uint64_t row_bytes, int64_t n_rows, int64_t K, const float* x, int64_t ldx,
                       int64_t n_tok, float* out, int64_t ldo);

struct Kernels {
  Isa isa;
  MatFn mat[kWTypes];
  // n values of a weight row, widened to FP32.
  void (*to_f32[kWTypes])(const uint8_t* row, int64_t n, float* out);
  // C[m·ldc + j] (+)= Σ_k A[m·lda + k]·B[k·ldb + j], m < M, j < N; accumulate = false overwrites C.
  void (*gemm_nn)(const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc, int64_t M, int64_t N,
                  int64_t K, bool accumulate);
  float (*dot)(const float* a, const float* b, int64_t n);
  // Products and sums in FP64 (the QSA indexer scores, which pick blocks and must not flip on
  // float rounding).
  double (*dot_f64)(const float* a, const float* b, int64_t n);
  float (*sum_squares)(const float* x, int64_t n);
  void (*axpy)(float a, const float* x, float* y, int64_t n);  // y += a·x
  void (*scale)(float a, float* x, int64_t n);                 // x *= a
  // x[i] = exp(x[i] − shift) (relative error ~1e-7; 0 below e^−87), returns Σ x[i] (softmax).
  float (*exp_sum)(float* x, int64_t n, float shift);
  // One delta-rule token for one v head, state S [dk][dv] in place: S = decay·S;
  // S += k ⊗ beta·(v − kᵀS); out = qᵀS.
  void (*gdn_step)(float* S, int64_t dk, int64_t dv, const float* q, const float* k, const float* v, float decay,
                   float beta, float* out);
};

bool isa_supported(Isa isa);
Isa best_isa();
const char* isa_name(Isa isa);
// The table of `isa`; throws if this CPU cannot run it.
const Kernels& kernels(Isa isa);

// The direct kernel type of a GGUF type, or false (the caller dequantizes rows first).
bool direct_wtype(GgmlType type, WType& out);

const Kernels& scalar_kernels();
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();

}  // namespace regolith::cpu
