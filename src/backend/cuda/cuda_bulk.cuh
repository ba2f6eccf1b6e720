// Bulk copies from global to shared memory by the copy engine of an SM (sm_90's cp.async.bulk),
// completed on an mbarrier: one thread asks for a whole row, however long, and the warps that use
// it wait on the barrier instead of each lane holding its loads in registers. Compiled only for
// sm_90 and later; callers choose them on such devices only (elsewhere these are no-ops).
#pragma once

#include <cstdint>

namespace regolith::cuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Before any thread uses the barrier: one arrival (the thread that asks for the bytes) completes a
// phase once the bytes it expects have landed. Then a __syncthreads().
__device__ __forceinline__ void mbarrier_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// The calling thread's arrival, expecting `bytes` more to land on the barrier.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
#endif
}

// bytes (a multiple of 16; src and dst 16-byte aligned) from global src to shared dst, counted on bar.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(bar))
               : "memory");
#endif
}

// Until the barrier's phase `parity` (0 for its first) has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace regolith::cuda
