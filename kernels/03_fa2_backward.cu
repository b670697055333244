// Generation 2 backward: FlashAttention-2 Algorithm 2 (Dao 2023) on tensor cores (mma.sync
// m16n8k16, ldmatrix, cp.async double buffering), sm_80 and newer, bf16 and fp16.
//
// Three kernels, in order on one stream:
//   1. preprocess: D_i = rowsum(dO_i * O_i) (Algorithm 2 line 4), LSE rescaled to base 2, and the
//      fp32 dQ accumulator zeroed.
//   2. main: one thread block per (key block j, KV head, batch). K_j and V_j stay in shared memory
//      (line 6); dK_j and dV_j accumulate in registers (line 7) over every query block i of every
//      query head of the KV head's group (GQA/MQA sum over the group here, in registers). Per query
//      block (lines 8-20): S = Q_i K_j^T is recomputed, P = exp2(S * scale * log2(e) - LSE *
//      log2(e)), dV_j += P^T dO_i, dP = dO_i V_j^T, dS = P o (dP - D_i), dK_j += dS^T Q_i and
//      dQ_i += dS K_j, the latter added to an fp32 accumulator in HBM with atomics. Blocks that the
//      causal or window mask hides entirely are skipped (never loaded), only blocks that straddle
//      the mask boundary or the sequence ends are masked element by element.
//   3. convert: dQ = scale * accumulator, rounded to the dtype (line 21's dQ written out).
//
// Each of the five GEMMs has its own warp grid (see BackwardTiling), with 32-row warp tiles so
// every fragment loaded from shared memory feeds several mma instructions; P and dS pass through
// shared memory between the grids. (An earlier layout gave each warp 16 keys and kept P^T and dS^T
// in registers as A operands; it read Q and dO twice per warp and ran about 5% slower at d = 128.)
//
// Tiles: 128 keys x 64 queries (d = 32, 96, 128), 128 x 128 (d = 64), 64 x 64 (d = 192, 256),
// 8 warps, one thread block per SM (the dK/dV accumulators take 64 to 128 registers per thread).
//
// Deterministic mode: the key blocks that touch query block i add their dQ contributions in
// increasing key-block order, serialised by a per-(batch, head, query block) counter in HBM (a
// ticket lock): the same additions in the same order every run, so dQ is bitwise repeatable. dK
// and dV never need it (each is owned by one thread block).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/attention_api.hpp"

namespace flashlab::kernels {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxSupportedHeadDim = 256;

// Everything the three kernels read, resolved on the host. Strides are in elements.
struct BackwardParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  std::int64_t q_batch, q_row, q_head;
  std::int64_t k_batch, k_row, k_head;
  std::int64_t v_batch, v_row, v_head;
  std::int64_t o_batch, o_row, o_head;
  std::int64_t do_batch, do_row, do_head;
  std::int64_t dq_batch, dq_row, dq_head;
  std::int64_t dk_batch, dk_row, dk_head;
  std::int64_t dv_batch, dv_row, dv_head;
  std::int64_t lse_batch, lse_row, lse_head;
  const int* cu_seqlens_q;  // null unless varlen
  const int* cu_seqlens_k;
  int batch, heads_q, heads_kv, group;
  int seqlen_q, seqlen_k;  // the longest sequence for varlen problems
  int head_dim;
  int total_rows_q;  // rows of the workspace arrays: batch * seqlen_q, or the packed total
  float scale;
  float scale_log2;  // scale * log2(e)
  bool causal_or_right;  // keys right of diagonal + window_right are hidden
  int window_right;      // effective right bound (0 for causal)
  bool has_left;
  int window_left;
  bool bottom_right;
  bool deterministic;
  int query_blocks;  // ceil(seqlen_q / kBlockM): stride of the deterministic counters
  // Workspace.
  float* lse_log2;    // [heads_q][total_rows_q]: LSE * log2(e), +inf for rows without keys
  float* delta;       // [heads_q][total_rows_q]: D = rowsum(dO * O)
  float* dq_accum;    // [heads_q][total_rows_q][head_dim]
  int* dq_counters;   // [batch][heads_q][query_blocks] (deterministic mode)
};

// Sequence b's extent: length and the offsets of its first row in the tensors and the workspace.
struct SequenceView {
  int seqlen_q, seqlen_k;
  std::int64_t workspace_row_q;  // first row of the sequence in the workspace arrays
  std::int64_t position_q, position_k;  // first position (packed row for varlen)
  std::int64_t batch_q, batch_k;        // batch index multiplying batch strides (0 for varlen)
};

[[maybe_unused]] __device__ __forceinline__ SequenceView sequence_view(const BackwardParams& p, int b) {
  SequenceView s;
  if (p.cu_seqlens_q != nullptr) {
    const int q0 = p.cu_seqlens_q[b], k0 = p.cu_seqlens_k[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - q0;
    s.seqlen_k = p.cu_seqlens_k[b + 1] - k0;
    s.workspace_row_q = q0;
    s.position_q = q0;
    s.position_k = k0;
    s.batch_q = s.batch_k = 0;
  } else {
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    s.workspace_row_q = static_cast<std::int64_t>(b) * p.seqlen_q;
    s.position_q = s.position_k = 0;
    s.batch_q = s.batch_k = b;
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Element conversions.
template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&h);
}
template <> __device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&h);
}

// ---------------------------------------------------------------------------------------------
// Kernel 1: preprocess (Algorithm 2 line 4). One group of 8 lanes per (row, head); each lane reads
// 16-byte chunks of dO and O.
template <typename Element>
__global__ void __launch_bounds__(256) backward_preprocess_kernel(BackwardParams p) {
  constexpr int kLanesPerRow = 8;
  const int group_index = (blockIdx.x * blockDim.x + threadIdx.x) / kLanesPerRow;
  const int lane = threadIdx.x % kLanesPerRow;
  const int row = group_index / p.heads_q;  // workspace row
  const int head = group_index % p.heads_q;
  const bool active = row < p.total_rows_q;
  float sum = 0.0f;
  if (active) {
    // Workspace row -> tensor address: packed rows for varlen, (batch, position) otherwise.
    std::int64_t batch = 0, position = row;
    if (p.cu_seqlens_q == nullptr) batch = row / p.seqlen_q, position = row % p.seqlen_q;
    const auto* o = static_cast<const Element*>(p.o) + batch * p.o_batch + position * p.o_row + head * p.o_head;
    const auto* d_o = static_cast<const Element*>(p.d_o) + batch * p.do_batch + position * p.do_row + head * p.do_head;
    for (int col = lane * 8; col < p.head_dim; col += kLanesPerRow * 8) {
      const uint4 o_chunk = *reinterpret_cast<const uint4*>(o + col);
      const uint4 do_chunk = *reinterpret_cast<const uint4*>(d_o + col);
      const Element* oe = reinterpret_cast<const Element*>(&o_chunk);
      const Element* de = reinterpret_cast<const Element*>(&do_chunk);
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += to_float(oe[e]) * to_float(de[e]);
    }
    float* accum = p.dq_accum + (static_cast<std::int64_t>(head) * p.total_rows_q + row) * p.head_dim;
    for (int col = lane * 4; col < p.head_dim; col += kLanesPerRow * 4) {
      *reinterpret_cast<float4*>(accum + col) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (active && lane == 0) {
    std::int64_t batch = 0, position = row;
    if (p.cu_seqlens_q == nullptr) batch = row / p.seqlen_q, position = row % p.seqlen_q;
    const float lse = p.lse[batch * p.lse_batch + position * p.lse_row + head * p.lse_head];
    const std::int64_t index = static_cast<std::int64_t>(head) * p.total_rows_q + row;
    p.delta[index] = sum;
    // A row that sees no key has LSE = -inf; +inf here makes every P of that row exactly 0.
    p.lse_log2[index] = (lse == -INFINITY) ? INFINITY : lse * kLog2e;
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 3: dQ = scale * accumulator, rounded to the dtype (4 columns per thread).
template <typename Element>
__global__ void __launch_bounds__(256) backward_convert_dq_kernel(BackwardParams p) {
  const std::int64_t quad = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int quads_per_row = p.head_dim / 4;
  const std::int64_t total = static_cast<std::int64_t>(p.total_rows_q) * p.heads_q * quads_per_row;
  if (quad >= total) return;
  const int col = static_cast<int>(quad % quads_per_row) * 4;
  const std::int64_t row_head = quad / quads_per_row;
  const int head = static_cast<int>(row_head % p.heads_q);
  const int row = static_cast<int>(row_head / p.heads_q);
  const float4 value =
      *reinterpret_cast<const float4*>(p.dq_accum + (static_cast<std::int64_t>(head) * p.total_rows_q + row) * p.head_dim + col);
  std::int64_t batch = 0, position = row;
  if (p.cu_seqlens_q == nullptr) batch = row / p.seqlen_q, position = row % p.seqlen_q;
  auto* dq = static_cast<Element*>(p.dq) + batch * p.dq_batch + position * p.dq_row + head * p.dq_head + col;
  uint2 packed;
  packed.x = pack2<Element>(value.x * p.scale, value.y * p.scale);
  packed.y = pack2<Element>(value.z * p.scale, value.w * p.scale);
  *reinterpret_cast<uint2*>(dq) = packed;
}

// ---------------------------------------------------------------------------------------------
// Tensor-core and copy primitives (sm_80+).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
__device__ __forceinline__ std::uint32_t smem_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared, zero-filled when !valid (then nothing is read).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(smem)));
}

// D = A B + D for one m16n8k16 tile, fp32 accumulators.
template <typename Element>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                  std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void add_to_dq(float* address, float4 value) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(address), value);
#else
  atomicAdd(address, value.x);
  atomicAdd(address + 1, value.y);
  atomicAdd(address + 2, value.z);
  atomicAdd(address + 3, value.w);
#endif
}
#endif  // __CUDA_ARCH__ >= 800

// ---------------------------------------------------------------------------------------------
// Kernel 2: the main loop. kHeadDim is head_dim rounded up to a multiple of 32 (the extra columns
// are zero-filled in shared memory and never stored); kBlockN keys per thread block (K_j, V_j),
// kBlockM query rows per inner iteration (Q_i, dO_i), 8 warps. Each GEMM has its own warp grid
// (warps along rows x warps along columns), chosen so that each warp's tile reuses every
// fragment it loads from shared memory several times:
//   S = Q_i K_j^T and dP = dO_i V_j^T (kBlockM x kBlockN): 2 x 4 warps of 32 x 32;
//   dV_j += P^T dO_i and dK_j += dS^T Q_i (kBlockN x kHeadDim): 4 x 2 warps of 32 x kHeadDim/2,
//     the accumulators stay in registers for the whole loop;
//   dQ_i += dS K_j (kBlockM x kHeadDim): 2 x 4 warps of 32 x kHeadDim/4 (4 x 2 of 16 x kHeadDim/2
//     when kHeadDim/4 is not a multiple of 16).
// P and dS go through shared memory (rounded to the dtype, as the tensor cores read them).
template <int kHeadDim_, int kBlockN_, int kBlockM_>
struct BackwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStride = kHeadDim + 8;  // padded rows: ldmatrix without bank conflicts
  static constexpr int kPStride = kBlockN + 8;
  // S and dP.
  static constexpr int kSWarpsM = kBlockM / 32, kSWarpsN = kWarps / kSWarpsM;
  static constexpr int kSRows = 32, kSCols = kBlockN / kSWarpsN;
  // dV and dK.
  static constexpr int kKvWarpsN = kBlockN / 32, kKvWarpsD = kWarps / kKvWarpsN;
  static constexpr int kKvRows = 32, kKvCols = kHeadDim / kKvWarpsD;
  // dQ.
  static constexpr int kQRows = (kHeadDim / (kWarps / (kBlockM / 32))) % 16 == 0 ? 32 : 16;
  static constexpr int kQWarpsM = kBlockM / kQRows, kQWarpsD = kWarps / kQWarpsM;
  static constexpr int kQCols = kHeadDim / kQWarpsD;
  static_assert(kSRows % 16 == 0 && kKvRows % 16 == 0 && kQRows % 16 == 0, "row tiles of 16");
  static_assert(kSWarpsM * kSWarpsN == kWarps && kSCols % 16 == 0, "S warp grid");
  static_assert(kKvWarpsN * kKvWarpsD == kWarps && kKvCols % 16 == 0, "dK/dV warp grid");
  static_assert(kQWarpsM * kQWarpsD == kWarps && kQCols % 16 == 0, "dQ warp grid");
  // Shared memory, in elements of the dtype then floats.
  static constexpr int kKvElements = kBlockN * kStride;  // each of K and V
  static constexpr int kQElements = kBlockM * kStride;   // each of Q and dO, per stage
  static constexpr int kPElements = kBlockM * kPStride;  // each of P and dS
  static constexpr std::size_t kSmemBytes =
      (2 * kKvElements + 4 * kQElements + 2 * kPElements) * 2 + 4 * kBlockM * sizeof(float);
};

template <typename Element, typename Tiling>
__global__ void __launch_bounds__(Tiling::kThreads, 1) backward_main_kernel(BackwardParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kHeadDim = Tiling::kHeadDim, kBlockN = Tiling::kBlockN, kBlockM = Tiling::kBlockM;
  constexpr int kStride = Tiling::kStride, kPStride = Tiling::kPStride, kThreads = Tiling::kThreads;
  constexpr int kChunksPerRow = kHeadDim / 8;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  Element* sK = reinterpret_cast<Element*>(smem_raw);
  Element* sV = sK + Tiling::kKvElements;
  Element* sQ = sV + Tiling::kKvElements;      // [2][kBlockM][kStride]
  Element* sdO = sQ + 2 * Tiling::kQElements;  // [2][kBlockM][kStride]
  Element* sP = sdO + 2 * Tiling::kQElements;  // [kBlockM][kPStride]
  Element* sdS = sP + Tiling::kPElements;      // [kBlockM][kPStride]
  float* sLse = reinterpret_cast<float*>(sdS + Tiling::kPElements);  // [2][kBlockM]
  float* sDelta = sLse + 2 * kBlockM;                                 // [2][kBlockM]

  const int key_block = blockIdx.x, head_kv = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates

  const SequenceView seq = sequence_view(p, b);
  const int key_begin = key_block * kBlockN;
  if (key_begin >= seq.seqlen_k) return;  // varlen: past this sequence's end
  const int key_end = min(key_begin + kBlockN, seq.seqlen_k);
  const int offset = p.bottom_right ? seq.seqlen_k - seq.seqlen_q : 0;  // key aligned with query 0

  // The query rows that see at least one key of [key_begin, key_end): the mask's skipped blocks
  // are never visited (FA2: blocks outside the causal / window band are skipped, not masked).
  int query_first = 0, query_last = seq.seqlen_q;  // [first, last)
  if (p.causal_or_right) query_first = max(query_first, key_begin - offset - p.window_right);
  if (p.has_left) query_last = min(query_last, key_end - 1 - offset + p.window_left + 1);
  const int block_first = query_first / kBlockM;
  const int block_last = query_last > query_first ? (query_last - 1) / kBlockM + 1 : block_first;  // exclusive
  const int blocks_per_head = block_last - block_first;
  const int iterations = blocks_per_head * p.group;

  // ---- Load K_j and V_j (line 6).
  const Element* k_base = static_cast<const Element*>(p.k) + seq.batch_k * p.k_batch +
                          (seq.position_k + key_begin) * p.k_row + static_cast<std::int64_t>(head_kv) * p.k_head;
  const Element* v_base = static_cast<const Element*>(p.v) + seq.batch_k * p.v_batch +
                          (seq.position_k + key_begin) * p.v_row + static_cast<std::int64_t>(head_kv) * p.v_head;
  for (int chunk = tid; chunk < kBlockN * kChunksPerRow; chunk += kThreads) {
    const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    const bool valid = key_begin + row < key_end && col < p.head_dim;
    cp_async_16(sK + row * kStride + col, valid ? k_base + row * p.k_row + col : k_base, valid);
    cp_async_16(sV + row * kStride + col, valid ? v_base + row * p.v_row + col : v_base, valid);
  }
  cp_async_commit();

  // Issue the loads of iteration `it` (query block and query head) into stage `stage`.
  auto load_query_block = [&](int it, int stage) {
    const int head_q = head_kv * p.group + it / blocks_per_head;
    const int query_begin = (block_first + it % blocks_per_head) * kBlockM;
    const Element* q_base = static_cast<const Element*>(p.q) + seq.batch_q * p.q_batch +
                            (seq.position_q + query_begin) * p.q_row + static_cast<std::int64_t>(head_q) * p.q_head;
    const Element* do_base = static_cast<const Element*>(p.d_o) + seq.batch_q * p.do_batch +
                             (seq.position_q + query_begin) * p.do_row + static_cast<std::int64_t>(head_q) * p.do_head;
    Element* q_stage = sQ + stage * Tiling::kQElements;
    Element* do_stage = sdO + stage * Tiling::kQElements;
    for (int chunk = tid; chunk < kBlockM * kChunksPerRow; chunk += kThreads) {
      const int row = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
      const bool valid = query_begin + row < seq.seqlen_q && col < p.head_dim;
      cp_async_16(q_stage + row * kStride + col, valid ? q_base + row * p.q_row + col : q_base, valid);
      cp_async_16(do_stage + row * kStride + col, valid ? do_base + row * p.do_row + col : do_base, valid);
    }
    const std::int64_t ws = static_cast<std::int64_t>(head_q) * p.total_rows_q + seq.workspace_row_q + query_begin;
    for (int row = tid; row < kBlockM; row += kThreads) {
      const bool valid = query_begin + row < seq.seqlen_q;
      // Rows past the end read LSE 0 and D 0; they are masked on the boundary block.
      cp_async_4(sLse + stage * kBlockM + row, valid ? p.lse_log2 + ws + row : p.lse_log2, valid);
      cp_async_4(sDelta + stage * kBlockM + row, valid ? p.delta + ws + row : p.delta, valid);
    }
  };

  // ldmatrix lane addressing (see the fragment layouts of mma.m16n8k16 in the PTX ISA):
  //  A from row-major [m][k]: m (lane % 16), k 8 * (lane / 16).
  //  A from [k][m] storage (transposed): k (lane % 8) + 8 * (lane / 16), m 8 * ((lane / 8) % 2).
  //  B from [n][k] (non-transposed, two n tiles): n (lane % 8) + 8 * (lane / 16), k 8 * ((lane / 8) % 2).
  //  B from [k][n] (transposed, two n tiles): k (lane % 16), n 8 * (lane / 16).
  const int a_m = lane % 16, a_k = 8 * (lane / 16);
  const int at_k = lane % 8 + 8 * (lane / 16), at_m = 8 * ((lane / 8) % 2);
  const int bn_n = lane % 8 + 8 * (lane / 16), bn_k = 8 * ((lane / 8) % 2);
  const int bt_k = lane % 16, bt_n = 8 * (lane / 16);

  // This warp's tiles in the three warp grids.
  const int s_row0 = (warp % Tiling::kSWarpsM) * Tiling::kSRows;  // query rows of S, dP
  const int s_col0 = (warp / Tiling::kSWarpsM) * Tiling::kSCols;  // key columns of S, dP
  const int kv_row0 = (warp % Tiling::kKvWarpsN) * Tiling::kKvRows;  // key rows of dK, dV
  const int kv_col0 = (warp / Tiling::kKvWarpsN) * Tiling::kKvCols;  // columns of dK, dV
  const int q_row0 = (warp % Tiling::kQWarpsM) * Tiling::kQRows;     // query rows of dQ
  const int q_col0 = (warp / Tiling::kQWarpsM) * Tiling::kQCols;     // columns of dQ

  constexpr int kSM = Tiling::kSRows / 16, kSN = Tiling::kSCols / 8;
  constexpr int kKvM = Tiling::kKvRows / 16, kKvN = Tiling::kKvCols / 8;
  constexpr int kQM = Tiling::kQRows / 16, kQN = Tiling::kQCols / 8;

  float acc_dk[kKvM][kKvN][4], acc_dv[kKvM][kKvN][4];
#pragma unroll
  for (int m = 0; m < kKvM; ++m) {
#pragma unroll
    for (int n = 0; n < kKvN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[m][n][e] = acc_dv[m][n][e] = 0.0f;
    }
  }

  if (iterations > 0) load_query_block(0, 0);
  cp_async_commit();

  for (int it = 0; it < iterations; ++it) {
    const int stage = it % 2;
    const int head_q = head_kv * p.group + it / blocks_per_head;
    const int query_block = block_first + it % blocks_per_head;
    const int query_begin = query_block * kBlockM;
    cp_async_wait_all();
    // Stage `stage` is loaded; every warp is done with the other stage, sP and sdS.
    __syncthreads();
    if (it + 1 < iterations) load_query_block(it + 1, stage ^ 1);
    cp_async_commit();

    const Element* q_stage = sQ + stage * Tiling::kQElements;
    const Element* do_stage = sdO + stage * Tiling::kQElements;
    const float* lse_stage = sLse + stage * kBlockM;
    const float* delta_stage = sDelta + stage * kBlockM;

    // ---- S = Q_i K_j^T (line 11) and dP = dO_i V_j^T (line 14), this warp's 32 x kSCols tile.
    float acc_s[kSM][kSN][4], acc_dp[kSM][kSN][4];
#pragma unroll
    for (int m = 0; m < kSM; ++m) {
#pragma unroll
      for (int n = 0; n < kSN; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_s[m][n][e] = acc_dp[m][n][e] = 0.0f;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      std::uint32_t a_q[kSM][4];
#pragma unroll
      for (int m = 0; m < kSM; ++m) ldmatrix_x4(a_q[m], q_stage + (s_row0 + m * 16 + a_m) * kStride + kk * 16 + a_k);
#pragma unroll
      for (int np = 0; np < kSN / 2; ++np) {
        std::uint32_t b_k[4];
        ldmatrix_x4(b_k, sK + (s_col0 + np * 16 + bn_n) * kStride + kk * 16 + bn_k);
#pragma unroll
        for (int m = 0; m < kSM; ++m) {
          mma_16816<Element>(acc_s[m][2 * np], a_q[m], b_k[0], b_k[1]);
          mma_16816<Element>(acc_s[m][2 * np + 1], a_q[m], b_k[2], b_k[3]);
        }
      }
      std::uint32_t a_do[kSM][4];
#pragma unroll
      for (int m = 0; m < kSM; ++m) ldmatrix_x4(a_do[m], do_stage + (s_row0 + m * 16 + a_m) * kStride + kk * 16 + a_k);
#pragma unroll
      for (int np = 0; np < kSN / 2; ++np) {
        std::uint32_t b_v[4];
        ldmatrix_x4(b_v, sV + (s_col0 + np * 16 + bn_n) * kStride + kk * 16 + bn_k);
#pragma unroll
        for (int m = 0; m < kSM; ++m) {
          mma_16816<Element>(acc_dp[m][2 * np], a_do[m], b_v[0], b_v[1]);
          mma_16816<Element>(acc_dp[m][2 * np + 1], a_do[m], b_v[2], b_v[3]);
        }
      }
    }

    // ---- P = exp(scale * S - LSE) (line 13) and dS = P o (dP - D) (line 16), to shared memory.
    const bool needs_mask =
        key_begin + kBlockN > seq.seqlen_k || query_begin + kBlockM > seq.seqlen_q ||
        (p.causal_or_right && key_begin + kBlockN - 1 > query_begin + offset + p.window_right) ||
        (p.has_left && key_begin < query_begin + kBlockM - 1 + offset - p.window_left);
#pragma unroll
    for (int m = 0; m < kSM; ++m) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int query_local = s_row0 + m * 16 + g + 8 * half;
        const float lse = lse_stage[query_local], delta = delta_stage[query_local];
        Element* p_row = sP + query_local * kPStride + s_col0 + 2 * t;
        Element* ds_row = sdS + query_local * kPStride + s_col0 + 2 * t;
#pragma unroll
        for (int n = 0; n < kSN; ++n) {
          float prob[2], grad[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            prob[e] = exp2f(acc_s[m][n][2 * half + e] * p.scale_log2 - lse);
            if (needs_mask) {
              const int query = query_begin + query_local, key = key_begin + s_col0 + n * 8 + 2 * t + e;
              const int diagonal = query + offset;
              const bool visible = key < seq.seqlen_k && query < seq.seqlen_q &&
                                   !(p.causal_or_right && key > diagonal + p.window_right) &&
                                   !(p.has_left && key < diagonal - p.window_left);
              if (!visible) prob[e] = 0.0f;
            }
            grad[e] = prob[e] * (acc_dp[m][n][2 * half + e] - delta);
          }
          *reinterpret_cast<std::uint32_t*>(p_row + n * 8) = pack2<Element>(prob[0], prob[1]);
          *reinterpret_cast<std::uint32_t*>(ds_row + n * 8) = pack2<Element>(grad[0], grad[1]);
        }
      }
    }
    __syncthreads();  // P and dS complete in shared memory

    // ---- dV_j += P^T dO_i (line 12) and dK_j += dS^T Q_i (line 18): 32 keys x kKvCols.
#pragma unroll
    for (int ks = 0; ks < kBlockM / 16; ++ks) {
      std::uint32_t a_p[kKvM][4], a_ds[kKvM][4];
#pragma unroll
      for (int m = 0; m < kKvM; ++m) {
        ldmatrix_x4_trans(a_p[m], sP + (ks * 16 + at_k) * kPStride + kv_row0 + m * 16 + at_m);
        ldmatrix_x4_trans(a_ds[m], sdS + (ks * 16 + at_k) * kPStride + kv_row0 + m * 16 + at_m);
      }
#pragma unroll
      for (int np = 0; np < kKvN / 2; ++np) {
        std::uint32_t b_do[4], b_q[4];
        ldmatrix_x4_trans(b_do, do_stage + (ks * 16 + bt_k) * kStride + kv_col0 + np * 16 + bt_n);
        ldmatrix_x4_trans(b_q, q_stage + (ks * 16 + bt_k) * kStride + kv_col0 + np * 16 + bt_n);
#pragma unroll
        for (int m = 0; m < kKvM; ++m) {
          mma_16816<Element>(acc_dv[m][2 * np], a_p[m], b_do[0], b_do[1]);
          mma_16816<Element>(acc_dv[m][2 * np + 1], a_p[m], b_do[2], b_do[3]);
          mma_16816<Element>(acc_dk[m][2 * np], a_ds[m], b_q[0], b_q[1]);
          mma_16816<Element>(acc_dk[m][2 * np + 1], a_ds[m], b_q[2], b_q[3]);
        }
      }
    }

    // ---- dQ_i += dS K_j (line 20): kQRows x kQCols per warp, added to the fp32 accumulator in
    // HBM with 16-byte atomics (sm_90) after pairing lanes so each holds 4 consecutive columns.
    {
      float acc_dq[kQM][kQN][4];
#pragma unroll
      for (int m = 0; m < kQM; ++m) {
#pragma unroll
        for (int n = 0; n < kQN; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_dq[m][n][e] = 0.0f;
        }
      }
#pragma unroll
      for (int ks = 0; ks < kBlockN / 16; ++ks) {
        std::uint32_t a_ds[kQM][4];
#pragma unroll
        for (int m = 0; m < kQM; ++m) ldmatrix_x4(a_ds[m], sdS + (q_row0 + m * 16 + a_m) * kPStride + ks * 16 + a_k);
#pragma unroll
        for (int np = 0; np < kQN / 2; ++np) {
          std::uint32_t b_k[4];
          ldmatrix_x4_trans(b_k, sK + (ks * 16 + bt_k) * kStride + q_col0 + np * 16 + bt_n);
#pragma unroll
          for (int m = 0; m < kQM; ++m) {
            mma_16816<Element>(acc_dq[m][2 * np], a_ds[m], b_k[0], b_k[1]);
            mma_16816<Element>(acc_dq[m][2 * np + 1], a_ds[m], b_k[2], b_k[3]);
          }
        }
      }

      // Deterministic mode: wait for this query block's turn (key blocks in increasing order).
      int* counter = nullptr;
      int turn = 0;
      if (p.deterministic) {
        int first_key = 0;
        if (p.has_left) first_key = max(0, query_begin + offset - p.window_left);
        turn = key_block - first_key / kBlockN;
        counter = p.dq_counters + (static_cast<std::int64_t>(b) * p.heads_q + head_q) * p.query_blocks + query_block;
        if (tid == 0) {
          int seen;
          do {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
          } while (seen != turn);
        }
        __syncthreads();
      }
      float* dq_base =
          p.dq_accum + (static_cast<std::int64_t>(head_q) * p.total_rows_q + seq.workspace_row_q) * p.head_dim;
#pragma unroll
      for (int m = 0; m < kQM; ++m) {
#pragma unroll
        for (int n = 0; n < kQN; ++n) {
          const float* c = acc_dq[m][n];
          // Lanes t and t^1 trade halves: even t takes row g, columns 2t..2t+3; odd t takes row
          // g + 8, columns 2t-2..2t+1.
          const bool odd = (t & 1) != 0;
          const float send0 = odd ? c[0] : c[2], send1 = odd ? c[1] : c[3];
          const float got0 = __shfl_xor_sync(0xffffffffu, send0, 1);
          const float got1 = __shfl_xor_sync(0xffffffffu, send1, 1);
          const int row = query_begin + q_row0 + m * 16 + g + (odd ? 8 : 0);
          const int col = q_col0 + n * 8 + 2 * (t & ~1);
          const float4 value = odd ? make_float4(got0, got1, c[2], c[3]) : make_float4(c[0], c[1], got0, got1);
          if (row < seq.seqlen_q && col < p.head_dim) {
            add_to_dq(dq_base + static_cast<std::int64_t>(row) * p.head_dim + col, value);
          }
        }
      }
      if (p.deterministic) {
        __threadfence();
        __syncthreads();
        if (tid == 0) asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(counter), "r"(turn + 1) : "memory");
      }
    }
  }

  // ---- Write dK_j (scaled: S = scale * Q K^T) and dV_j (line 23).
  Element* dk_base = static_cast<Element*>(p.dk) + seq.batch_k * p.dk_batch + (seq.position_k + key_begin) * p.dk_row +
                     static_cast<std::int64_t>(head_kv) * p.dk_head;
  Element* dv_base = static_cast<Element*>(p.dv) + seq.batch_k * p.dv_batch + (seq.position_k + key_begin) * p.dv_row +
                     static_cast<std::int64_t>(head_kv) * p.dv_head;
#pragma unroll
  for (int m = 0; m < kKvM; ++m) {
#pragma unroll
    for (int n = 0; n < kKvN; ++n) {
      const int col = kv_col0 + n * 8 + 2 * t;
      if (col >= p.head_dim) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = kv_row0 + m * 16 + g + 8 * half;
        if (key_begin + row >= key_end) continue;
        *reinterpret_cast<std::uint32_t*>(dk_base + row * p.dk_row + col) =
            pack2<Element>(acc_dk[m][n][2 * half] * p.scale, acc_dk[m][n][2 * half + 1] * p.scale);
        *reinterpret_cast<std::uint32_t*>(dv_base + row * p.dv_row + col) =
            pack2<Element>(acc_dv[m][n][2 * half], acc_dv[m][n][2 * half + 1]);
      }
    }
  }
#else
  (void)p;
  __trap();  // the host refuses devices below compute capability 8.0
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side.

// The head dims the kernel is instantiated for (a head_dim is padded up to the next one; the padded
// columns are zero in shared memory and never stored): one instantiation per range keeps the build
// short.
int padded_head_dim(int head_dim) {
  if (head_dim > 128) return head_dim <= 192 ? 192 : 256;
  return (head_dim + 31) / 32 * 32;
}

// The smallest query block of any tiling: sizes the deterministic counters.
constexpr int kMinBlockM = 32;

struct WorkspaceLayout {
  std::size_t lse_offset, delta_offset, dq_offset, counters_offset, total;
};

WorkspaceLayout workspace_layout(const Problem& problem, bool deterministic) {
  auto align = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t rows = static_cast<std::size_t>(problem.total_rows_q());
  const std::size_t heads = static_cast<std::size_t>(problem.heads_q);
  WorkspaceLayout layout{};
  layout.lse_offset = 0;
  layout.delta_offset = align(rows * heads * sizeof(float));
  layout.dq_offset = layout.delta_offset + align(rows * heads * sizeof(float));
  layout.counters_offset = layout.dq_offset + align(rows * heads * problem.head_dim * sizeof(float));
  const int query_blocks = (problem.seqlen_q + kMinBlockM - 1) / kMinBlockM;
  const std::size_t counters =
      deterministic ? static_cast<std::size_t>(problem.batch) * heads * static_cast<std::size_t>(query_blocks) : 0;
  layout.total = layout.counters_offset + align(counters * sizeof(int));
  return layout;
}

template <typename Element, int kHeadDim, int kBlockN, int kBlockM>
void launch_backward(BackwardParams params, cudaStream_t stream) {
  using Tiling = BackwardTiling<kHeadDim, kBlockN, kBlockM>;
  params.query_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
  int device = 0, smem_limit = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  if (static_cast<std::size_t>(smem_limit) < Tiling::kSmemBytes) {
    throw std::invalid_argument("fa2_backward: head_dim = " + std::to_string(params.head_dim) + " needs " +
                                std::to_string(Tiling::kSmemBytes) + " bytes of shared memory per block; this device allows " +
                                std::to_string(smem_limit) + " (allowed: head_dim <= 128 here)");
  }
  {
    const std::int64_t threads = static_cast<std::int64_t>(params.total_rows_q) * params.heads_q * 8;
    const int blocks = static_cast<int>((threads + 255) / 256);
    backward_preprocess_kernel<Element><<<blocks, 256, 0, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa2_backward preprocess launch");
  }
  {
    auto kernel = backward_main_kernel<Element, Tiling>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(Tiling::kSmemBytes)),
               "fa2_backward cudaFuncSetAttribute");
    const dim3 grid((params.seqlen_k + Tiling::kBlockN - 1) / Tiling::kBlockN, params.heads_kv, params.batch);
    kernel<<<grid, Tiling::kThreads, Tiling::kSmemBytes, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa2_backward main launch");
  }
  {
    const std::int64_t threads = static_cast<std::int64_t>(params.total_rows_q) * params.heads_q * (params.head_dim / 4);
    const int blocks = static_cast<int>((threads + 255) / 256);
    backward_convert_dq_kernel<Element><<<blocks, 256, 0, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa2_backward convert launch");
  }
}

template <typename Element>
void dispatch_head_dim(const BackwardParams& params, cudaStream_t stream) {
  switch (padded_head_dim(params.head_dim)) {
    case 32: return launch_backward<Element, 32, 128, 64>(params, stream);
    case 64: return launch_backward<Element, 64, 128, 128>(params, stream);
    case 96: return launch_backward<Element, 96, 128, 64>(params, stream);
    case 128: return launch_backward<Element, 128, 128, 64>(params, stream);
    // Above 128: blocks of 64 keys, so the dK/dV accumulators (32 keys x head_dim/4 per warp) still
    // fit the registers; about 217 KB of shared memory at 256 (sm_90; an A100 allows 163 KB).
    case 192: return launch_backward<Element, 192, 64, 64>(params, stream);
    case 256: return launch_backward<Element, 256, 64, 64>(params, stream);
    default: break;
  }
  throw std::invalid_argument("fa2_backward: head_dim = " + std::to_string(params.head_dim) +
                              " is not supported; allowed: multiples of 8 up to 256");
}

[[noreturn]] void refuse_backward(const std::string& message) {
  throw std::invalid_argument("fa2_backward: " + message);
}

}  // namespace

std::size_t fa2_backward_workspace_bytes(const Problem& problem, bool deterministic) {
  return workspace_layout(problem, deterministic).total;
}

void fa2_backward(const Problem& problem, const BackwardArgs& args) {
  constexpr const char* kName = "fa2_backward";
  require_kernel_supported(problem, kName);
  if (problem.head_dim % 8 != 0 || problem.head_dim > kMaxSupportedHeadDim) {
    refuse_backward("head_dim = " + std::to_string(problem.head_dim) + " is not supported; allowed: multiples of 8 up to " +
                    std::to_string(kMaxSupportedHeadDim));
  }
  require_compute_capability(8, 0, kName);
  const struct {
    const DeviceTensor* tensor;
    const char* name;
  } tensors[] = {{&args.q, "q"},   {&args.k, "k"},   {&args.v, "v"},   {&args.o, "o"},  {&args.d_o, "d_o"},
                 {&args.dq, "dq"}, {&args.dk, "dk"}, {&args.dv, "dv"}};
  for (const auto& entry : tensors) require_tensor(*entry.tensor, entry.name, kName, 16, 8);
  require_tensor(args.lse, "lse", kName, 4, 1);
  if (problem.varlen() && (args.cu_seqlens_q == nullptr || args.cu_seqlens_k == nullptr)) {
    refuse_backward("cu_seqlens_q / cu_seqlens_k are null for a varlen problem; allowed: device copies of the offsets");
  }

  const bool deterministic = args.deterministic;
  const WorkspaceLayout layout = workspace_layout(problem, deterministic);
  if (args.workspace != nullptr && args.workspace_bytes < layout.total) {
    refuse_backward("workspace_bytes = " + std::to_string(args.workspace_bytes) +
                    "; allowed: at least fa2_backward_workspace_bytes() = " + std::to_string(layout.total));
  }
  cudaStream_t stream = args.stream;
  void* workspace = args.workspace;
  const bool owns_workspace = workspace == nullptr;
  if (owns_workspace) check_cuda(cudaMallocAsync(&workspace, layout.total, stream), "fa2_backward cudaMallocAsync");
  auto* bytes = static_cast<unsigned char*>(workspace);

  BackwardParams p{};
  p.q = args.q.data, p.k = args.k.data, p.v = args.v.data, p.o = args.o.data, p.d_o = args.d_o.data;
  p.lse = static_cast<const float*>(args.lse.data);
  p.dq = args.dq.data, p.dk = args.dk.data, p.dv = args.dv.data;
  auto strides = [](const DeviceTensor& x, std::int64_t& batch, std::int64_t& row, std::int64_t& head) {
    batch = x.batch_stride, row = x.row_stride, head = x.head_stride;
  };
  strides(args.q, p.q_batch, p.q_row, p.q_head);
  strides(args.k, p.k_batch, p.k_row, p.k_head);
  strides(args.v, p.v_batch, p.v_row, p.v_head);
  strides(args.o, p.o_batch, p.o_row, p.o_head);
  strides(args.d_o, p.do_batch, p.do_row, p.do_head);
  strides(args.dq, p.dq_batch, p.dq_row, p.dq_head);
  strides(args.dk, p.dk_batch, p.dk_row, p.dk_head);
  strides(args.dv, p.dv_batch, p.dv_row, p.dv_head);
  strides(args.lse, p.lse_batch, p.lse_row, p.lse_head);
  p.cu_seqlens_q = problem.varlen() ? args.cu_seqlens_q : nullptr;
  p.cu_seqlens_k = problem.varlen() ? args.cu_seqlens_k : nullptr;
  p.batch = problem.batch;
  p.heads_q = problem.heads_q;
  p.heads_kv = problem.heads_kv;
  p.group = problem.group_size();
  p.seqlen_q = problem.seqlen_q;
  p.seqlen_k = problem.seqlen_k;
  p.head_dim = problem.head_dim;
  p.total_rows_q = problem.total_rows_q();
  p.scale = static_cast<float>(problem.scale());
  p.scale_log2 = static_cast<float>(problem.scale() * 1.4426950408889634);
  const Mask& mask = problem.mask;
  p.causal_or_right = mask.causal || mask.window_right >= 0;
  p.window_right = mask.causal ? (mask.window_right >= 0 ? std::min(0, mask.window_right) : 0) : mask.window_right;
  p.has_left = mask.window_left >= 0;
  p.window_left = mask.window_left;
  p.bottom_right = mask.alignment == CausalAlignment::bottom_right;
  p.deterministic = deterministic;
  p.lse_log2 = reinterpret_cast<float*>(bytes + layout.lse_offset);
  p.delta = reinterpret_cast<float*>(bytes + layout.delta_offset);
  p.dq_accum = reinterpret_cast<float*>(bytes + layout.dq_offset);
  p.dq_counters = reinterpret_cast<int*>(bytes + layout.counters_offset);

  if (p.total_rows_q > 0) {
    if (deterministic) {
      check_cuda(cudaMemsetAsync(p.dq_counters, 0, layout.total - layout.counters_offset, stream),
                 "fa2_backward counters memset");
    }
    if (problem.dtype == DType::bf16) {
      dispatch_head_dim<__nv_bfloat16>(p, stream);
    } else {
      dispatch_head_dim<__half>(p, stream);
    }
  }
  if (owns_workspace) check_cuda(cudaFreeAsync(workspace, stream), "fa2_backward cudaFreeAsync");
}

}  // namespace flashlab::kernels
