// Quantized dot products for matvec/matmul: one stored weight row times an activation vector
// quantized to the format that weight type pairs with (as ggml pairs them, except that Q4_1 and
// Q5_1 take Q8_0 and sum its codes exactly instead of using Q8_1's fp16-rounded sums):
//   Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_0, MXFP4, IQ4_NL  × Q8_0  (32-value blocks)
//   Q2_K…Q6_K, IQ2_*, IQ3_*, IQ4_XS                    × Q8_K  (256-value blocks)
//   F32, F16, BF16                                     × F32   (no activation rounding)
// A caller quantizes each input vector once and reuses it for every row:
//   std::vector<uint8_t> act(quant::activation_bytes(type, n));
//   quant::quantize_activations(type, x, n, act.data());
//   quant::VecDot dot = quant::vec_dot_kernel(type);     // fetch once, outside hot loops
//   for (r...) y[r] = dot(n, weights + r * row_bytes(type, n), act.data());
// Kernels: a scalar reference, AVX2 and AVX-512 (VNNI); the best the CPU runs is chosen at run
// time. Kernels are pure functions, safe to call from any number of threads. Multithreading and
// multi-row blocking belong to the backend.
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace regolith::quant {

enum class Isa { scalar, avx2, avx512 };

// The most capable kernel set this CPU supports (AVX-512 needs F, BW, VL and VNNI).
Isa best_isa();
bool isa_supported(Isa isa);
const char* isa_name(Isa isa);

bool has_vec_dot(GgmlType weight_type);
// The activation format of `weight_type` (throws for a type without a dot kernel).
GgmlType activation_type(GgmlType weight_type);
// Bytes of n activations in that format; n must be a valid row length of weight_type.
uint64_t activation_bytes(GgmlType weight_type, int64_t n);
void quantize_activations(GgmlType weight_type, const float* x, int64_t n, void* out);

// Σ_i w[i]·a[i] over n values. n is not checked here: it must be a valid row length of the
// weight type (check_row_length), as vec_dot checks.
using VecDot = float (*)(int64_t n, const void* row, const void* activations);

// The kernel of `weight_type` for `isa`; throws if the type has none or the CPU lacks the ISA.
VecDot vec_dot_kernel(GgmlType weight_type, Isa isa);
VecDot vec_dot_kernel(GgmlType weight_type);  // best_isa()

// Checked convenience form: validates n, then calls the best kernel.
float vec_dot(GgmlType weight_type, int64_t n, const void* row, const void* activations);

}  // namespace regolith::quant
