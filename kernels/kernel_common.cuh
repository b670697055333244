// Device building blocks shared by the kernel generations: the warp-level tensor-core MMA
// (mma.sync), ldmatrix, cp.async, packing to 16-bit types and the mask rule. Written from the PTX
// ISA: fragment layouts are those of mma.m16n8k16 (.row.col), g = lane / 4, t = lane % 4:
//   A (16x16): a0 (row g, cols 2t, 2t+1), a1 (row g+8, same), a2 (row g, cols 2t+8, +9), a3 (row g+8, same)
//   B (16x8):  b0 (rows 2t, 2t+1, col g), b1 (rows 2t+8, 2t+9, col g)
//   C (16x8):  c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashlab::kernels::device {

// Two floats rounded to the 16-bit type T and packed in one 32-bit register (low half first).
template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float low, float high);
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float low, float high) {
  __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<std::uint32_t*>(&pair);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float low, float high) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<std::uint32_t*>(&pair);
}

// The two 16-bit values of a packed register, as floats (low half first).
template <typename T>
__device__ __forceinline__ float2 unpack2(std::uint32_t pair);
template <>
__device__ __forceinline__ float2 unpack2<__half>(std::uint32_t pair) {
  return __half22float2(*reinterpret_cast<const __half2*>(&pair));
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(std::uint32_t pair) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
}

template <typename T>
__device__ __forceinline__ float to_float(T value);
template <>
__device__ __forceinline__ float to_float<__half>(__half value) { return __half2float(value); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 value) { return __bfloat162float(value); }

template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ __half from_float<__half>(float value) { return __float2half_rn(value); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }

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

// The inverse of ldmatrix_x4 (sm_90): four 8x8 matrices of 16-bit elements written to shared
// memory; lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of each (the mma C-fragment
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

// 16 bytes to shared memory from four registers.
__device__ __forceinline__ void st_shared_v4(std::uint32_t address, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(address), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// Bulk asynchronous reductions (sm_90): `bytes` (a multiple of 16) of fp32 in shared memory added
// element by element to global memory by the copy engine, tracked in bulk groups of this thread.
// The shared source must be made visible to the async proxy first (fence_proxy_async_shared).
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
// Waits until every committed bulk group of this thread has read its shared source.
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#endif
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

// Copies rows [row0, row0 + kRows) x cols [0, kHeadDim) of one head into a padded shared tile;
// rows at or past `rows_valid` and columns at or past `head_dim` are zero-filled.
template <typename T, int kHeadDim, int kRows, int kThreads, int kRowStride>
__device__ __forceinline__ void load_tile_async(T* shared, const T* global, std::int64_t row_stride, int rows_valid,
                                                int head_dim) {
  constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert((kRows * kChunksPerRow) % kThreads == 0, "tile chunks must divide among the threads");
  if constexpr (kThreads % kChunksPerRow != 0) {
    // Head dims whose rows do not divide among the threads (96, 160, 192, 224): chunk by chunk.
#pragma unroll
    for (int i = 0; i < kRows * kChunksPerRow / kThreads; ++i) {
      const int chunk = i * kThreads + static_cast<int>(threadIdx.x);
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
      const bool valid = row < rows_valid && col < head_dim;
      cp_async_16(shared_address(shared + row * kRowStride + col), valid ? global + row * row_stride + col : global, valid);
    }
    return;
  }
  constexpr int kRowsPerPass = kThreads % kChunksPerRow == 0 ? kThreads / kChunksPerRow : 1;
  // One pointer walked down the rows (not one 64-bit offset per pass held across the key loop).
  const int row0 = static_cast<int>(threadIdx.x) / kChunksPerRow, col = (static_cast<int>(threadIdx.x) % kChunksPerRow) * 8;
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

// op over the kCount values as a balanced tree (depth log2 kCount instead of a chain of kCount).
template <int kCount, typename Op>
__device__ __forceinline__ float tree_reduce(const float (&values)[kCount], const Op& op) {
  static_assert((kCount & (kCount - 1)) == 0, "a power of two of values");
  if constexpr (kCount == 1) {
    return values[0];
  } else {
    float halves[kCount / 2];
#pragma unroll
    for (int i = 0; i < kCount / 2; ++i) halves[i] = op(values[i], values[i + kCount / 2]);
    return tree_reduce(halves, op);
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

// The causal / sliding-window rule of HeadProblem::key_visible_ignoring_sparsity, on the device:
// key col is visible from query row iff col < seqlen_k and
//   row + offset - left <= col <= row + offset + right   (a bound of -1 is absent),
// offset = seqlen_k - seqlen_q for the bottom-right alignment, 0 for top-left; causal sets right
// to min(right, 0).
struct MaskRule {
  int offset;
  int left;   // -1: unbounded
  int right;  // -1: unbounded
  int seqlen_k;

  __device__ __forceinline__ bool visible(int row, int col) const {
    const int diagonal = row + offset;
    return col < seqlen_k && (right < 0 || col <= diagonal + right) && (left < 0 || col >= diagonal - left);
  }
  // Keys [first, last) that rows [row_begin, row_last] can see at all.
  __device__ __forceinline__ int first_key(int row_begin) const {
    return left < 0 ? 0 : max(0, row_begin + offset - left);
  }
  __device__ __forceinline__ int last_key(int row_last) const {
    return right < 0 ? seqlen_k : min(seqlen_k, max(0, row_last + offset + right + 1));
  }
  // Whether every (row, col) of rows [row_begin, row_last] x keys [col_begin, col_end) is visible.
  __device__ __forceinline__ bool block_full(int row_begin, int row_last, int col_begin, int col_end) const {
    return col_end <= seqlen_k && (right < 0 || col_end - 1 <= row_begin + offset + right) &&
           (left < 0 || col_begin >= row_last + offset - left);
  }
};

}  // namespace flashlab::kernels::device
