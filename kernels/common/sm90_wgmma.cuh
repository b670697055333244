// Hopper (sm_90a) warpgroup matrix multiply (wgmma.mma_async): one warpgroup (4 consecutive warps,
// the first a multiple of 4) computes a 64 x N fp32 tile D += A B^T for K = 16 per instruction,
// asynchronously. A comes from shared memory (a matrix descriptor) or registers; B from shared
// memory. Written from the PTX ISA; CCCL has no wrapper for these.
//
// Register layouts (each warp w of the warpgroup owns rows 16w .. 16w + 15; g = lane / 4,
// t = lane % 4), the same as mma.sync m16n8k16 per warp:
//   D (64 x N): d[4i + 0], d[4i + 1] = row g,     columns 8i + 2t, 8i + 2t + 1 (i = 0 .. N/8 - 1)
//               d[4i + 2], d[4i + 3] = row g + 8, the same columns
//   A (64 x 16, registers): a[0] = row g, columns 2t, 2t+1; a[1] = row g+8, same; a[2] = row g,
//               columns 2t+8, 2t+9; a[3] = row g+8, same (two 16-bit values per register)
// so the D of n8 tiles 2k and 2k + 1, rounded and packed, is the A of k16 step k.
//
// Shared-memory operands here use the 128-byte swizzle of TMA boxes (sm90_tma.cuh): 64-element
// column panels, rows of 128 bytes, 8-row groups of 1024 bytes.
//   K-major (the K index contiguous: Q and K for S = Q K^T, A and B of a GEMM): stride byte
//     offset 1024 (between 8-row groups), leading byte offset unused; the K step of 16 elements
//     inside a panel is +32 bytes on the start address, the next panel + rows * 128.
//   MN-major (the N index contiguous: V, whose rows are keys, for O = P V; imm-trans-b = 1): the
//     8-row groups run along K (stride byte offset 1024), the 64-column panels along N (leading
//     byte offset = the panel's size); the K step of 16 keys is + 2048 bytes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/common/conversions.cuh"

namespace flashlab::kernels::sm90 {

// A matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address >> 4 in bits 0-13,
// leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle mode in 62-63
// (1: 128-byte).
__device__ __forceinline__ std::uint64_t matrix_descriptor(std::uint32_t shared_address, std::uint32_t leading_bytes,
                                                           std::uint32_t stride_bytes) {
  return static_cast<std::uint64_t>((shared_address & 0x3FFFF) >> 4) |
         static_cast<std::uint64_t>((leading_bytes & 0x3FFFF) >> 4) << 16 |
         static_cast<std::uint64_t>((stride_bytes & 0x3FFFF) >> 4) << 32 | std::uint64_t{1} << 62;
}
__device__ __forceinline__ std::uint64_t k_major_descriptor(std::uint32_t shared_address) {
  return matrix_descriptor(shared_address, 16, 1024);
}
__device__ __forceinline__ std::uint64_t mn_major_descriptor(std::uint32_t shared_address, std::uint32_t panel_bytes) {
  return matrix_descriptor(shared_address, panel_bytes, 1024);
}

// Orders this warpgroup's earlier register writes (accumulators, A fragments) before the wgmma
// that follow; required before the first wgmma and after any other access to their registers.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
// Closes the group of wgmma issued since the last commit.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Tells the compiler that these registers are read and written here: placed after wgmma_wait, it
// keeps accumulator reads from moving above the wait, and A fragments alive (unchanged) until the
// wgmma that read them is known to be done.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&registers)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(registers[i])::"memory");
}
template <int kCount>
__device__ __forceinline__ void fence_registers(std::uint32_t (&registers)[kCount][4]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(registers[i][j])::"memory");
}

// The fp32 accumulators of a 64 x N tile rounded to T and packed as the register A operand of
// the next wgmma: the D of n8 tiles 2k and 2k + 1 is the A of k16 step k (the layouts above).
template <typename T, int N>
__device__ __forceinline__ void pack_a_operand(const float (&d)[N / 2], std::uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int k = 0; k < N / 16; ++k) {
#pragma unroll
    for (int j = 0; j < 4; ++j) a[k][j] = device::pack2<T>(d[8 * k + 2 * j], d[8 * k + 2 * j + 1]);
  }
}

// Wgmma<T, N>::ss<kTransposeB>(d, a_descriptor, b_descriptor, accumulate) and
// Wgmma<T, N>::rs<kTransposeB>(d, a_registers, b_descriptor, accumulate): one m64nNk16 with
// accumulate = 0 overwriting D, 1 adding to it.
template <typename T, int N>
struct Wgmma;
#include "kernels/common/sm90_wgmma_instructions.inc"

}  // namespace flashlab::kernels::sm90
