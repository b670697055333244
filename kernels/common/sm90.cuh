// The Hopper (sm_90) instructions the FA2 backward uses where they exist: stmatrix, the 16-byte
// vector reduction to global memory, and the bulk asynchronous reduction (cp.reduce.async.bulk)
// with its proxy fence and group waits. Written from the PTX ISA; below sm_90 each compiles to
// nothing and its callers take their sm_80 path.
#pragma once

#include <cstdint>

namespace flashlab::kernels::device {

// The inverse of ldmatrix_x4: four 8x8 matrices of 16-bit elements written to shared memory;
// lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each (the mma C-fragment
// layout, packed), lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void stmatrix_x4(std::uint32_t address, std::uint32_t r0, std::uint32_t r1, std::uint32_t r2,
                                            std::uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(address), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
#else
  (void)address, (void)r0, (void)r1, (void)r2, (void)r3;
#endif
}

// stmatrix_x4 with each 8x8 matrix transposed: lane l's two elements of matrix i (its row l / 4,
// columns 2 (l % 4) and 2 (l % 4) + 1) land in rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4;
// lanes 8i..8i+7 give the row addresses of the stored (transposed) matrix i.
__device__ __forceinline__ void stmatrix_x4_trans(std::uint32_t address, std::uint32_t r0, std::uint32_t r1,
                                                  std::uint32_t r2, std::uint32_t r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(address), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
#else
  (void)address, (void)r0, (void)r1, (void)r2, (void)r3;
#endif
}

// Four floats added to 16 contiguous bytes of global memory, one vector reduction (no value
// returned).
__device__ __forceinline__ void red_add_v4_f32(float* address, float4 value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(value.x), "f"(value.y), "f"(value.z),
               "f"(value.w)
               : "memory");
#else
  (void)address, (void)value;
#endif
}

// Bulk asynchronous reductions: `bytes` (a multiple of 16) of fp32 in shared memory added element
// by element to global memory by the copy engine, tracked in bulk groups of this thread. The
// shared source must be made visible to the async proxy first (fence_proxy_async_shared).
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void bulk_reduce_add_f32(float* global_dst, std::uint32_t shared_src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global_dst),
               "r"(shared_src), "r"(bytes)
               : "memory");
#else
  (void)global_dst, (void)shared_src, (void)bytes;
#endif
}
__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#endif
}
// Orders this thread's generic-proxy accesses of global memory before its later async-proxy ones
// (a bulk reduction after an acquire that found its turn).
__device__ __forceinline__ void fence_proxy_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#endif
}
// Waits until every committed bulk group of this thread is complete: its writes are performed.
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
#endif
}
// Waits until every committed bulk group of this thread has read its shared source.
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
}

// Programmatic dependent launch (PTX griddepcontrol, through the CUDA runtime's device builtins).
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// kernel before it on the stream still runs: allow_dependent_launch() lets the next such kernel's
// blocks be scheduled once every block of this one has called it (or exited), and
// wait_for_previous_grid() returns once the kernel before has completed and its writes are
// visible. Without the attribute both are no-ops.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

}  // namespace flashlab::kernels::device
