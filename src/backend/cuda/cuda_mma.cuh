// Tensor-core and asynchronous-copy primitives shared by the tiles (cuda_gemm.cuh,
// cuda_gemm_int8.cuh) and the prefill attention (cuda_qsa.cu): PTX mma.sync on TF32 and int8
// fragments (fragment layouts as the PTX ISA gives them), the TF32 split that makes FP32-accurate
// products from TF32 ones, and cp.async.
#pragma once

#include <cstdint>

namespace regolith::cuda {

// v = hi + lo: hi is v rounded to TF32, lo the rest. hi·hi + hi·lo + lo·hi is within 3·2^-22·|a||b|
// of a·b (cuda_gemm.cuh).
struct SplitTf32 {
  uint32_t hi, lo;
};

// Rounded as cvt.rna.tf32.f32 rounds (to nearest, ties away from zero), but in two integer
// instructions: half a TF32 unit added to the bits, then the 13 low bits cleared (a carry moves into
// the exponent as it should). sm_90 has no such conversion: the compiler's sequence for cvt.rna
// also checks for infinities, 7 instructions where this takes 2, and the prefill attention splits
// every K, V and P value it multiplies. An infinite v keeps an infinite hi and gets a NaN lo, so
// its products come out NaN.
__device__ __forceinline__ uint32_t round_tf32(float v) { return (__float_as_uint(v) + 0x1000u) & 0xFFFFE000u; }
// lo = v − hi is exact and, hi being rounded to nearest, has at most 12 significant bits; it is
// passed as FP32 bits, of which the tensor cores read the 11 leading ones (they ignore the 13 low
// bits of an operand). The bit they drop is under 2^-23·|v|, below the 2^-22·|v| that rounding lo
// was allowed, and the split takes 3 instructions instead of 5.
__device__ __forceinline__ SplitTf32 split_tf32(float v) {
  const uint32_t hi = round_tf32(v);
  return {hi, __float_as_uint(v - __uint_as_float(hi))};
}

// d += a·b for one m16n8k8 tile of TF32 values.
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// d += a·b in FP32-class precision from split operands: the small terms first.
__device__ __forceinline__ void mma_split_tf32(float (&d)[4], const SplitTf32 (&a)[4], const SplitTf32 (&b)[2]) {
  mma_tf32(d, a[0].lo, a[1].lo, a[2].lo, a[3].lo, b[0].hi, b[1].hi);
  mma_tf32(d, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].lo, b[1].lo);
  mma_tf32(d, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].hi, b[1].hi);
}

// d = c + a·b for one m16n8k32 tile of int8 codes, with c left as it was: a constant c (the same
// registers for every tile) costs no moves into the accumulators.
__device__ __forceinline__ void mma_s8(int (&d)[4], const int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src));
}
// 16 bytes from src when `copy`, else 16 zero bytes (src is not read, but must be a valid address):
// one instruction either way, so a loop of such copies has no branches to wait on its conditions.
__device__ __forceinline__ void cp_async_16_or_zero(void* dst, const void* src, bool copy) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(copy ? 16 : 0));
}
__device__ __forceinline__ void cp_async_8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src));
}
__device__ __forceinline__ void cp_async_4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

}  // namespace regolith::cuda
