// The warp-level tensor-core building blocks of the FA1 and FA2 rungs, written from the PTX ISA:
// mma.sync (m16n8k16; two m16n8k8 on sm_75), ldmatrix, cp.async (sm_80) and the tile loops
// built on them. Fragment layouts of mma.m16n8k16 (.row.col), g = lane / 4, t = lane % 4:
//   A (16x16): a0 (row g, cols 2t, 2t+1), a1 (row g+8, same), a2 (row g, cols 2t+8, +9), a3 (row g+8, same)
//   B (16x8):  b0 (rows 2t, 2t+1, col g), b1 (rows 2t+8, 2t+9, col g)
//   C (16x8):  c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::device {

// D = A * B + D, m16n8k16, fp32 accumulators. fp16 on sm_75 runs as two m16n8k8 (same layout,
// the k halves split: a0/a1 with b0, a2/a3 with b1); bf16 needs sm_80.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                  std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(b0));
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[2]), "r"(a[3]), "r"(b1));
#else
  (void)c, (void)a, (void)b0, (void)b1;
  __trap();
#endif
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                         std::uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  (void)c, (void)a, (void)b0, (void)b1;
  __trap();
#endif
}

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// Four 8x8 matrices of 16-bit elements; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], std::uint32_t address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#else
  (void)r, (void)address;
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], std::uint32_t address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#else
  (void)r, (void)address;
#endif
}

// 16 bytes to shared memory from four registers (any architecture).
__device__ __forceinline__ void st_shared_v4(std::uint32_t address, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// 16 bytes global -> shared without registers (sm_80); valid == false writes 16 zero bytes.
__device__ __forceinline__ void cp_async_16(std::uint32_t shared_dst, const void* global_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_dst), "l"(global_src),
               "r"(source_bytes));
#else
  (void)shared_dst, (void)global_src, (void)valid;
#endif
}
// 4 bytes global -> shared (through L1); valid == false writes 4 zero bytes.
__device__ __forceinline__ void cp_async_4(std::uint32_t shared_dst, const void* global_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int source_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_dst), "l"(global_src), "r"(source_bytes));
#else
  (void)shared_dst, (void)global_src, (void)valid;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#endif
}

// Copies rows [0, kRows) x cols [0, kHeadDim) of one head into a padded shared tile with
// cp.async; rows at or past `rows_valid` and columns at or past `head_dim` are zero-filled.
template <typename T, int kHeadDim, int kRows, int kThreads, int kRowStride>
__device__ __forceinline__ void load_tile_async(T* shared, const T* global, std::int64_t row_stride, int rows_valid,
                                                int head_dim) {
  constexpr int kChunksPerRow = kHeadDim / kChunkElements;
  static_assert((kRows * kChunksPerRow) % kThreads == 0, "tile chunks must divide among the threads");
  if constexpr (kThreads % kChunksPerRow != 0) {
    // Head dims whose rows do not divide among the threads (96, 160, 192, 224): chunk by chunk.
#pragma unroll
    for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
      const int chunk = i * kThreads + static_cast<int>(threadIdx.x);
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * kChunkElements;
      const bool valid = row < rows_valid && col < head_dim;
      cp_async_16(shared_address(shared + row * kRowStride + col), valid ? global + row * row_stride + col : global, valid);
    }
    return;
  }
  constexpr int kRowsPerPass = kThreads % kChunksPerRow == 0 ? kThreads / kChunksPerRow : 1;
  // One pointer walked down the rows (not one 64-bit offset per pass held across the key loop).
  const int row0 = static_cast<int>(threadIdx.x) / kChunksPerRow;
  const int col = (static_cast<int>(threadIdx.x) % kChunksPerRow) * kChunkElements;
  const T* source = global + row0 * row_stride + col;
  const std::int64_t step = kRowsPerPass * row_stride;
  const std::uint32_t destination = shared_address(shared + row0 * kRowStride + col);
  const bool col_valid = col < head_dim;
#pragma unroll
  for (int pass = 0; pass < kRows / kRowsPerPass; ++pass) {
    const bool valid = col_valid && row0 + pass * kRowsPerPass < rows_valid;
    cp_async_16(destination + pass * kRowsPerPass * kRowStride * static_cast<int>(sizeof(T)), valid ? source : global,
                valid);
    source += step;
  }
}

// acc[m][n] += A_m B_n over kSteps k16 steps, for kM row tiles (m16) and kN column tiles (n8) of
// one warp. load_a(fragment, k, m) and load_b(fragment, k, n_pair) fetch one A tile and two B tiles
// (one ldmatrix x4 each); the fragments of step k + 1 are fetched while the MMAs of step k run
// (register double buffering), so shared-memory latency hides behind tensor-core work.
template <typename T, int kSteps, int kM, int kN, typename LoadA, typename LoadB>
__device__ __forceinline__ void warp_mma_pipelined(float (&acc)[kM][kN][4], const LoadA& load_a, const LoadB& load_b) {
  static_assert(kN % 2 == 0, "B fragments come in pairs of n8 tiles");
  std::uint32_t a[2][kM][4], b[2][kN / 2][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) load_a(a[0][m], 0, m);
#pragma unroll
  for (int n = 0; n < kN / 2; ++n) load_b(b[0][n], 0, n);
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    const int current = k % 2;
    if (k + 1 < kSteps) {
#pragma unroll
      for (int m = 0; m < kM; ++m) load_a(a[current ^ 1][m], k + 1, m);
#pragma unroll
      for (int n = 0; n < kN / 2; ++n) load_b(b[current ^ 1][n], k + 1, n);
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int n = 0; n < kN / 2; ++n) {
        mma_16816<T>(acc[m][2 * n], a[current][m], b[current][n][0], b[current][n][1]);
        mma_16816<T>(acc[m][2 * n + 1], a[current][m], b[current][n][2], b[current][n][3]);
      }
    }
  }
}

}  // namespace flashlab::kernels::device
