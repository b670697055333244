// Hopper (sm_90) synchronisation: the mbarriers that TMA copies complete, named barriers between
// warpgroups, register reallocation between warpgroup roles, and a bounded wait for debugging.
// mbarrier and fence instructions go through CCCL's cuda::ptx; the rest is written here from the
// PTX ISA (bar.sync / bar.arrive, setmaxnreg).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace flashlab::kernels::sm90 {

// An mbarrier: 8 bytes of shared memory counting arrivals and (for TMA) transaction bytes; a
// phase completes when both reach zero, and waiters name the phase by its parity.
using Mbarrier = std::uint64_t;

// The block's dynamic shared memory from its first kAlign-byte boundary (swizzled TMA boxes and
// wgmma operands want 1024). Pointer arithmetic on the __shared__ array itself, not a round trip
// through an integer, keeps the address space visible to the compiler: accesses through the
// result become shared-memory instructions (st.shared: 32-bit addresses) instead of generic ones.
template <int kAlign>
__device__ __forceinline__ unsigned char* aligned_shared_base(unsigned char* shared_raw) {
  const auto address = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_raw));
  return shared_raw + (kAlign - address % kAlign) % kAlign;
}

// One thread initialises; mbarrier_init_fence() then makes the barriers visible to the async
// proxy (the copy engine) before the block synchronises.
__device__ __forceinline__ void mbarrier_init(Mbarrier* barrier, std::uint32_t arrivals) {
  cuda::ptx::mbarrier_init(barrier, arrivals);
}
__device__ __forceinline__ void mbarrier_init_fence() {
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}

__device__ __forceinline__ void mbarrier_arrive(Mbarrier* barrier) { (void)cuda::ptx::mbarrier_arrive(barrier); }

// Arrives and announces `bytes` that TMA copies will deliver to this barrier's current phase.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(Mbarrier* barrier, std::uint32_t bytes) {
  (void)cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                             barrier, bytes);
}

// Waits until the phase of parity `parity` has completed. With FLASHLAB_TRAP_HANGS defined, a
// wait that spins for about 2^30 tries (seconds) traps: a phase bug then fails the launch (an
// illegal-instruction error at the next synchronisation) instead of hanging the GPU. No printf:
// a call inside a kernel makes ptxas serialise its wgmma.
__device__ __forceinline__ void mbarrier_wait(Mbarrier* barrier, std::uint32_t parity) {
#ifdef FLASHLAB_TRAP_HANGS
#ifndef FLASHLAB_TRAP_HANGS_TRIES
#define FLASHLAB_TRAP_HANGS_TRIES (1u << 30)
#endif
  for (std::uint32_t tries = 0; !cuda::ptx::mbarrier_try_wait_parity(barrier, parity); ++tries) {
    if (tries == FLASHLAB_TRAP_HANGS_TRIES) __trap();
  }
#else
  while (!cuda::ptx::mbarrier_try_wait_parity(barrier, parity)) {
  }
#endif
}

// Position in a ring of kStages buffers, each guarded by a "full" and an "empty" barrier:
// consumers wait for full with `phase`, producers for empty with `phase ^ 1` (so the first pass
// over a fresh ring does not wait).
template <int kStages>
struct RingPosition {
  int stage = 0;
  std::uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
};

// Named barriers (ids 1..15; 0 is __syncthreads): `threads` (a multiple of 32) counts every thread
// that syncs or arrives. bar.arrive does not wait, so one warpgroup can hand a turn to another.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register reallocation between warpgroups (setmaxnreg, sm_90a): every warp of a warpgroup runs the
// same one. It takes effect only when the kernel's launch bounds cap the registers at entry.
template <int kRegisters>
__device__ __forceinline__ void registers_increase_to() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256 in steps of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_decrease_to() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg takes 24..256 in steps of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// Ordinary shared-memory stores, made visible to the async proxy (TMA stores, wgmma reads).
__device__ __forceinline__ void fence_shared_to_async_proxy() { cuda::ptx::fence_proxy_async(cuda::ptx::space_shared); }

}  // namespace flashlab::kernels::sm90
