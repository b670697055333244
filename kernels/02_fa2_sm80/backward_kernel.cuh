// The FA2 rung's backward kernels: FlashAttention-2 Algorithm 2 (Dao 2023) on tensor cores
// (mma.sync m16n8k16, ldmatrix, cp.async double buffering), sm_80 and newer, bf16 and fp16;
// backward_host.cu launches them, backward_tiling.hpp gives their tiles.
//
// Three kernels, in order on one stream:
//   1. preprocess: D_i = rowsum(dO_i * O_i) (Algorithm 2 line 4) and LSE rescaled to base 2 (the
//      fp32 dQ accumulator is zeroed by a memset before it here, by the preprocess itself for the
//      FA3 rung).
//   2. main: one thread block per (key block j, KV head, batch). K_j and V_j stay in shared memory
//      (line 6); dK_j and dV_j accumulate in registers (line 7) over every query block i of every
//      query head of the KV head's group (GQA/MQA sum over the group here, in registers). Per query
//      block (lines 8-20): S = Q_i K_j^T is recomputed and P = exp2(S * scale * log2(e) - LSE *
//      log2(e)) written to shared memory; dP = dO_i V_j^T and dS = P o (dP - D_i) likewise; then
//      dV_j += P^T dO_i, dQ_i += dS K_j (added to an fp32 accumulator in HBM with atomics, issued
//      before the last GEMM so they drain under it) and dK_j += dS^T Q_i. The accumulator keeps
//      each query block's dQ tile in the order of the mma fragments (see BackwardTiling), so each
//      thread adds 16 contiguous bytes per fragment with no shuffles and no per-row addresses; on
//      sm_90, where shared memory allows, each warp stages its fragments in shared memory and adds
//      them with one bulk asynchronous reduction (cp.reduce.async.bulk) instead. Blocks that the
//      causal or window mask hides entirely are skipped (never loaded); only blocks that straddle
//      the mask boundary or the sequence ends are masked element by element.
//   3. convert: dQ = scale * accumulator, rounded to the dtype, back in row order (line 21's dQ
//      written out).
//
// Each of the five GEMMs has its own warp grid (see BackwardTiling), with 32-row warp tiles so
// every fragment loaded from shared memory feeds several mma instructions; P and dS pass through
// shared memory between the grids. Every shared-memory address of the loop is a per-lane base
// plus a compile-time offset, and S and dP are computed one after the other, so the loop stays
// within the register file (the dK/dV accumulators take half of it) without spilling.
//
// Deterministic mode: the key blocks that touch query block i add their dQ contributions in
// decreasing key-block order, serialised by a per-(batch, head, query block) counter in HBM (a
// ticket lock), with per-thread reductions (no bulk copies): the same additions in the same order
// every run, so dQ is bitwise repeatable. dK and dV never need it (each is owned by one thread
// block).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/02_fa2_sm80/backward_tiling.hpp"
#include "kernels/common/attention_params.hpp"
#include "kernels/common/backward_workspace.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/conversions.cuh"
#include "kernels/common/reductions.cuh"
#include "kernels/common/sm80.cuh"
#include "kernels/common/sm90.cuh"
#include "kernels/common/turns.cuh"

namespace flashlab::kernels::fa2 {

// Threads per block of the preprocess and convert kernels; the preprocess gives each (row, head)
// this many lanes.
inline constexpr int kBackwardAuxThreads = 256;
inline constexpr int kPreprocessLanesPerRow = 8;

// What the three kernels read besides the forward's tensors, resolved on the host.
struct BackwardParams : AttentionParams {
  int batch, heads_kv;
  int padded_head_dim;  // the kernel's head dim: the row length of the dQ accumulator
  int total_rows_q;     // rows of the workspace arrays: batch * seqlen_q, or the packed total
  float scale;
  bool deterministic;
  int query_blocks;  // ceil(seqlen_q / kBlockM): stride of the deterministic counters
  DeviceTensor d_o, dq, dk, dv;
  // Workspace.
  float* lse_log2;       // [heads_q][rows_pitch]: LSE * log2(e), +inf for rows without keys
  float* delta;          // [heads_q][rows_pitch]: D = rowsum(dO * O)
  std::int64_t rows_pitch;  // floats per head of lse_log2 and delta (backward_workspace.hpp)
  float* dq_accum;       // [heads_q][dq_rows][padded_head_dim], query blocks in tile order
  std::int64_t dq_rows;  // total_rows_q + kDqRowPadding * batch: each sequence's rows padded
  int* dq_counters;      // [batch][heads_q][query_blocks] (deterministic mode)
  bool preprocess_zeroes_dq_accum;  // the preprocess zeroes dq_accum (FA3 rung), else a memset before it did
};

// The first row of sequence b (first query row first_row_q) in the dQ accumulator, whose
// sequences are padded by kDqRowPadding.
__device__ __forceinline__ std::int64_t dq_first_row(std::int64_t first_row_q, int b) {
  return first_row_q + static_cast<std::int64_t>(kDqRowPadding) * b;
}
__device__ __forceinline__ std::int64_t dq_first_row(const SequenceView& seq, int b) { return dq_first_row(seq.first_row_q, b); }

// ---------------------------------------------------------------------------------------------
// Kernel 1: preprocess (Algorithm 2 line 4). One group of kPreprocessLanesPerRow lanes per (row,
// head), head-major (consecutive groups take consecutive rows of one head, so a warp's LSE reads
// and D and LSE writes are adjacent in the [b, h, s] layouts); each lane reads its 16-byte chunks
// of dO and O (kPaddedHeadDim columns at most) all at once, then sums them in column order.
template <typename Element, int kPaddedHeadDim>
__global__ void __launch_bounds__(kBackwardAuxThreads) backward_preprocess_kernel(BackwardParams p) {
  using device::to_float;
  constexpr int kLanesPerRow = kPreprocessLanesPerRow;
  constexpr int kChunks = (kPaddedHeadDim + kLanesPerRow * kChunkElements - 1) / (kLanesPerRow * kChunkElements);  // per lane
  const std::int64_t group_index = (static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kLanesPerRow;
  const int lane = threadIdx.x % kLanesPerRow;
  const int head = static_cast<int>(group_index / p.total_rows_q);
  const int row = static_cast<int>(group_index % p.total_rows_q);  // workspace row
  const bool active = head < p.heads_q;
  // The FA3 rung launches its main kernel as this kernel's programmatic dependent: it may start
  // (barriers, its first K, Q and dO loads) once every block here has begun, and waits for this
  // kernel's end before it reads LSE, D or the accumulator (backward_launch.cuh).
  device::allow_dependent_launch();
  if (p.preprocess_zeroes_dq_accum) {
    // The dQ accumulator starts at zero (heads_q x dq_rows x padded_head_dim floats, a multiple of
    // 4): 16-byte stores spread over every thread of the launch, in place of a memset pass before it.
    const std::int64_t vectors = static_cast<std::int64_t>(p.heads_q) * p.dq_rows * p.padded_head_dim / 4;
    const std::int64_t launch_threads = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
    float4* accum = reinterpret_cast<float4*>(p.dq_accum);
    for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += launch_threads) {
      accum[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  float sum = 0.0f;
  if (active) {
    // Workspace row -> tensor address: packed rows for varlen, (batch, position) otherwise.
    std::int64_t batch = 0, position = row;
    if (p.cu_seqlens_q == nullptr) batch = row / p.seqlen_q, position = row % p.seqlen_q;
    const Element* o = p.o.as<const Element>() + p.o.offset(batch, position, 0, head);
    const Element* d_o = p.d_o.as<const Element>() + p.d_o.offset(batch, position, 0, head);
    uint4 o_chunks[kChunks], do_chunks[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = (c * kLanesPerRow + lane) * kChunkElements;
      if (col < p.head_dim) {
        o_chunks[c] = *reinterpret_cast<const uint4*>(o + col);
        do_chunks[c] = *reinterpret_cast<const uint4*>(d_o + col);
      }
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if ((c * kLanesPerRow + lane) * kChunkElements >= p.head_dim) break;
      const Element* oe = reinterpret_cast<const Element*>(&o_chunks[c]);
      const Element* de = reinterpret_cast<const Element*>(&do_chunks[c]);
#pragma unroll
      for (int e = 0; e < kChunkElements; ++e) sum += to_float(oe[e]) * to_float(de[e]);
    }
  }
#pragma unroll
  for (int offset = kLanesPerRow / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(device::kAllLanes, sum, offset);
  if (active && lane == 0) {
    std::int64_t batch = 0, position = row;
    if (p.cu_seqlens_q == nullptr) batch = row / p.seqlen_q, position = row % p.seqlen_q;
    const float lse = p.lse.as<const float>()[p.lse.offset(batch, position, 0, head)];
    // The row's sequence b and its first row: the largest b with cu_seqlens_q[b] <= row for varlen.
    std::int64_t b = batch, first_row = batch * p.seqlen_q;
    if (p.cu_seqlens_q != nullptr) {
      int low = 0, high = p.batch;
      while (high - low > 1) {
        const int middle = (low + high) / 2;
        (p.cu_seqlens_q[middle] <= row ? low : high) = middle;
      }
      b = low, first_row = p.cu_seqlens_q[low];
    }
    const std::int64_t index = head * p.rows_pitch + backward_rows_first_row(first_row, b) + (row - first_row);
    p.delta[index] = sum;
    // A row that sees no key has LSE = -inf; +inf here makes every P of that row exactly 0.
    p.lse_log2[index] = (lse == -INFINITY) ? INFINITY : lse * kLog2eFloat;
  }
}

// ---------------------------------------------------------------------------------------------
// 16 bytes added to the fp32 dQ accumulator: one vector reduction on sm_90 (no returned value),
// four scalar atomics before.
__device__ __forceinline__ void add_to_dq(float* address, float4 value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  device::red_add_v4_f32(address, value);
#else
  atomicAdd(address, value.x);
  atomicAdd(address + 1, value.y);
  atomicAdd(address + 2, value.z);
  atomicAdd(address + 3, value.w);
#endif
}

// One 16-row tile of a warp's packed pairs in the mma C-fragment layout (kSN column tiles of 8)
// written to a row-major shared tile with stmatrix (sm_90; four 8x8 matrices per instruction);
// `lane_address` is this lane's row address, as for an ldmatrix A operand.
template <int kSN>
__device__ __forceinline__ void stmatrix_pair_rows(const std::uint32_t (&pairs)[kSN][2], std::uint32_t lane_address) {
#pragma unroll
  for (int n = 0; n < kSN / 2; ++n) {
    device::stmatrix_x4(lane_address + n * 32, pairs[2 * n][0], pairs[2 * n][1], pairs[2 * n + 1][0], pairs[2 * n + 1][1]);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernel 2: the main loop, on the tiles of Tiling (a BackwardTiling).
template <typename Element, typename Tiling>
__global__ void __launch_bounds__(Tiling::kThreads, Tiling::kMinBlocksPerSm) backward_main_kernel(const BackwardParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace device;
  using T = Tiling;
  constexpr int kHeadDim = T::kHeadDim, kBlockN = T::kBlockN, kBlockM = T::kBlockM, kThreads = T::kThreads;
  constexpr int kRowBytes = T::kStride * 2, kPRowBytes = T::kPStride * 2;  // bytes per shared row
  constexpr bool kStmatrix = T::kStmatrix && __CUDA_ARCH__ >= 900;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  const std::uint32_t smem = shared_address(smem_raw);
  float* s_lse = reinterpret_cast<float*>(smem_raw + T::kRowsOffset);  // [2][kBlockM]
  float* s_delta = s_lse + 2 * kBlockM;                                // [2][kBlockM]

  // Deterministic mode takes turns from the last key block down, so it starts those first.
  const int key_block = p.deterministic ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  const int head_kv = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates

  const SequenceView seq = sequence_view(p, b);
  const std::int64_t dq_row_q = dq_first_row(seq, b);
  const int key_begin = key_block * kBlockN;
  if (key_begin >= seq.seqlen_k) return;  // varlen: past this sequence's end
  const int key_end = min(key_begin + kBlockN, seq.seqlen_k);
  const MaskRule mask = mask_rule(p, seq);

  // The query rows that see at least one key of [key_begin, key_end): the mask's skipped blocks
  // are never visited (FA2: blocks outside the causal / window band are skipped, not masked).
  const IndexRange queries = mask.visible_queries(key_begin, key_end);
  const int block_first = queries.first / kBlockM;
  const int block_last = queries.last > queries.first ? (queries.last - 1) / kBlockM + 1 : block_first;  // exclusive
  const int iterations = (block_last - block_first) * p.group_size;
  // Deterministic mode: the last key block that visits query block i (one this block visits): the
  // block of the last key its last row sees (the visitors of a query block are consecutive).
  auto last_visitor = [&](int i) {
    const int row_last = min(seq.seqlen_q, (i + 1) * kBlockM) - 1;
    return (mask.last_key(row_last) - 1) / kBlockN;
  };

  // ---- Load K_j and V_j (line 6).
  const Element* k_base = p.k.as<const Element>() + p.k.offset(seq.batch, seq.position_k, key_begin, head_kv);
  const Element* v_base = p.v.as<const Element>() + p.v.offset(seq.batch, seq.position_k, key_begin, head_kv);
  auto shared_tile = [&](int offset) { return reinterpret_cast<Element*>(smem_raw + offset); };
  load_tile_async<Element, kHeadDim, kBlockN, kThreads, T::kStride>(shared_tile(T::kKOffset), k_base, p.k.row_stride,
                                                                    key_end - key_begin, p.head_dim);
  load_tile_async<Element, kHeadDim, kBlockN, kThreads, T::kStride>(shared_tile(T::kVOffset), v_base, p.v.row_stride,
                                                                    key_end - key_begin, p.head_dim);
  cp_async_commit();

  // Issue the loads of query block `query_block` of head `head_q` (Q_i, dO_i, LSE_i, D_i) into
  // stage `stage`.
  auto load_query_block = [&](int query_block, int head_q, int stage) {
    const int query_begin = query_block * kBlockM;
    const Element* q_src = p.q.as<const Element>() + p.q.offset(seq.batch, seq.position_q, query_begin, head_q);
    const Element* do_src = p.d_o.as<const Element>() + p.d_o.offset(seq.batch, seq.position_q, query_begin, head_q);
    const int stage_offset = stage * T::kQBytes;
    load_tile_async<Element, kHeadDim, kBlockM, kThreads, T::kStride>(shared_tile(T::kQOffset + stage_offset), q_src,
                                                                      p.q.row_stride, seq.seqlen_q - query_begin, p.head_dim);
    load_tile_async<Element, kHeadDim, kBlockM, kThreads, T::kStride>(shared_tile(T::kdOOffset + stage_offset), do_src,
                                                                      p.d_o.row_stride, seq.seqlen_q - query_begin, p.head_dim);
    const std::int64_t rows = head_q * p.rows_pitch + backward_rows_first_row(seq.first_row_q, b) + query_begin;
    for (int row = tid; row < kBlockM; row += kThreads) {
      const bool valid = query_begin + row < seq.seqlen_q;
      // Rows past the end read LSE 0 and D 0; they are masked on the boundary block.
      const std::uint32_t offset = T::kRowsOffset + (stage * kBlockM + row) * 4;
      cp_async_4(smem + offset, valid ? p.lse_log2 + rows + row : p.lse_log2, valid);
      cp_async_4(smem + offset + 2 * kBlockM * 4, valid ? p.delta + rows + row : p.delta, valid);
    }
  };

  // This warp's tiles in the three warp grids.
  const int s_row0 = (warp % T::kSWarpsM) * T::kSRows;     // query rows of S, dP
  const int s_col0 = (warp / T::kSWarpsM) * T::kSCols;     // key columns of S, dP
  const int kv_row0 = (warp % T::kKvWarpsN) * T::kKvRows;  // key rows of dK, dV
  const int kv_col0 = (warp / T::kKvWarpsN) * T::kKvCols;  // columns of dK, dV
  const int q_row0 = (warp % T::kQWarpsM) * T::kQRows;     // query rows of dQ
  const int q_col0 = (warp / T::kQWarpsM) * T::kQCols;     // columns of dQ

  // This lane's ldmatrix row addresses at k-step 0 of stage 0 (the fragment layouts of
  // mma.m16n8k16 are in common/sm80.cuh); every other address of the loop is one of these plus
  // a compile-time offset (and the stage's).
  //  A from row-major [m][k]: m (lane % 16), k 8 * (lane / 16).
  //  A from [k][m] storage (transposed): k (lane % 8) + 8 * (lane / 16), m 8 * ((lane / 8) % 2).
  //  B from [n][k] (two n tiles): n (lane % 8) + 8 * (lane / 16), k 8 * ((lane / 8) % 2).
  //  B from [k][n] storage (transposed, two n tiles): k (lane % 16), n 8 * (lane / 16).
  const int a_m = lane % 16, a_k = 8 * (lane / 16);
  const int at_k = lane % 8 + 8 * (lane / 16), at_m = 8 * ((lane / 8) % 2);
  const int bn_n = lane % 8 + 8 * (lane / 16), bn_k = 8 * ((lane / 8) % 2);
  const int bt_k = lane % 16, bt_n = 8 * (lane / 16);
  const std::uint32_t s_a = smem + T::kQOffset + ((s_row0 + a_m) * T::kStride + a_k) * 2;   // Q; + dO - Q: dO
  const std::uint32_t s_b = smem + T::kKOffset + ((s_col0 + bn_n) * T::kStride + bn_k) * 2;  // K; + V - K: V
  const std::uint32_t kv_a = smem + T::kPOffset + (at_k * T::kPStride + kv_row0 + at_m) * 2;  // P^T; dS^T
  const std::uint32_t kv_b = smem + T::kQOffset + (bt_k * T::kStride + kv_col0 + bt_n) * 2;   // Q; dO
  const std::uint32_t q_a = smem + T::kdSOffset + ((q_row0 + a_m) * T::kPStride + a_k) * 2;  // dS
  const std::uint32_t q_b = smem + T::kKOffset + (bt_k * T::kStride + q_col0 + bt_n) * 2;     // K
  // This lane's first element of P (and dS) in the S-grid layout.
  unsigned char* p_store = smem_raw + T::kPOffset + ((s_row0 + g) * T::kPStride + s_col0 + 2 * t) * 2;
  const std::uint32_t p_stmatrix = smem + T::kPOffset + ((s_row0 + a_m) * T::kPStride + s_col0 + a_k) * 2;
  // This lane's first dQ value in a query block's tile (tile order) and in the staging tile.
  const int dq_lane_offset = warp * T::kDqWarpFloats + lane * 4;
  constexpr bool kBulkDq = T::kBulkDq && __CUDA_ARCH__ >= 900;
  const std::uint32_t dq_stage_warp = smem + T::kDqStageOffset + warp * T::kDqWarpFloats * 4;

  constexpr int kSM = T::kSRows / 16, kSN = T::kSCols / 8;
  constexpr int kKvM = T::kKvRows / 16, kKvN = T::kKvCols / 8;
  constexpr int kQM = T::kQM, kQN = T::kQN;

  float acc_dk[kKvM][kKvN][4], acc_dv[kKvM][kKvN][4];
#pragma unroll
  for (int m = 0; m < kKvM; ++m) {
#pragma unroll
    for (int n = 0; n < kKvN; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc_dk[m][n][e] = acc_dv[m][n][e] = 0.0f;
    }
  }

  // The loop visits query blocks block_first .. block_last - 1 of each query head of the group.
  int query_block = block_first, head_q = head_kv * p.group_size;
  if (iterations > 0) load_query_block(query_block, head_q, 0);
  cp_async_commit();

  for (int it = 0; it < iterations; ++it) {
    const int stage = it % 2;
    const int query_begin = query_block * kBlockM;
    int next_block = query_block + 1, next_head = head_q;
    if (next_block == block_last) next_block = block_first, ++next_head;
    cp_async_wait<0>();
    // Stage `stage` is loaded; every warp is done with the other stage, P and dS.
    __syncthreads();
    if (it + 1 < iterations) load_query_block(next_block, next_head, stage ^ 1);
    cp_async_commit();

    const std::uint32_t stage_offset = stage * T::kQBytes;
    const float* lse_rows = s_lse + stage * kBlockM + s_row0 + g;
    const float* delta_rows = s_delta + stage * kBlockM + s_row0 + g;
    // Only blocks that cross the mask's edge or the end of the keys or queries are masked.
    const bool needs_mask = query_begin + kBlockM > seq.seqlen_q ||
                            !mask.block_full(query_begin, query_begin + kBlockM - 1, key_begin, key_begin + kBlockN);

    // ---- S = Q_i K_j^T (line 11), this warp's 32 x kSCols tile; keys a row must not see are set
    // to -inf (boundary blocks only); P = exp(scale * S - LSE) (line 13), rounded to the dtype,
    // kept packed in registers for dS (the same P the tensor cores read for dV) and written to
    // shared memory.
    std::uint32_t p_pairs[kSM][kSN][2];
    {
      float acc_s[kSM][kSN][4] = {};
      warp_mma_pipelined<Element, kHeadDim / 16, kSM, kSN>(
          acc_s, [&](std::uint32_t(&a)[4], int k, int m) { ldmatrix_x4(a, s_a + stage_offset + m * 16 * kRowBytes + k * 32); },
          [&](std::uint32_t(&b)[4], int k, int n) { ldmatrix_x4(b, s_b + n * 16 * kRowBytes + k * 32); });
      if (needs_mask) {
#pragma unroll
        for (int m = 0; m < kSM; ++m) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int query = query_begin + s_row0 + m * 16 + g + 8 * half;
#pragma unroll
            for (int n = 0; n < kSN; ++n) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int key = key_begin + s_col0 + n * 8 + 2 * t + e;
                if (query >= seq.seqlen_q || !mask.visible(query, key)) acc_s[m][n][2 * half + e] = -INFINITY;
              }
            }
          }
        }
      }
#pragma unroll
      for (int m = 0; m < kSM; ++m) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float lse = lse_rows[m * 16 + 8 * half];
#pragma unroll
          for (int n = 0; n < kSN; ++n) {
            const float p0 = exp2f(fmaf(acc_s[m][n][2 * half], p.scale_log2, -lse));
            const float p1 = exp2f(fmaf(acc_s[m][n][2 * half + 1], p.scale_log2, -lse));
            p_pairs[m][n][half] = pack2<Element>(p0, p1);
            if constexpr (!kStmatrix) {
              *reinterpret_cast<std::uint32_t*>(p_store + (m * 16 + 8 * half) * kPRowBytes + n * 16) = p_pairs[m][n][half];
            }
          }
        }
        if constexpr (kStmatrix) stmatrix_pair_rows(p_pairs[m], p_stmatrix + m * 16 * kPRowBytes);
      }
    }

    // ---- dP = dO_i V_j^T (line 14), then dS = P o (dP - D) (line 16), written to shared memory.
    {
      float acc_dp[kSM][kSN][4] = {};
      warp_mma_pipelined<Element, kHeadDim / 16, kSM, kSN>(
          acc_dp,
          [&](std::uint32_t(&a)[4], int k, int m) {
            ldmatrix_x4(a, s_a + (T::kdOOffset - T::kQOffset) + stage_offset + m * 16 * kRowBytes + k * 32);
          },
          [&](std::uint32_t(&b)[4], int k, int n) {
            ldmatrix_x4(b, s_b + (T::kVOffset - T::kKOffset) + n * 16 * kRowBytes + k * 32);
          });
#pragma unroll
      for (int m = 0; m < kSM; ++m) {
        std::uint32_t ds_pairs[kSN][2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float delta = delta_rows[m * 16 + 8 * half];
#pragma unroll
          for (int n = 0; n < kSN; ++n) {
            const float2 prob = unpack2<Element>(p_pairs[m][n][half]);
            const float ds0 = prob.x * (acc_dp[m][n][2 * half] - delta);
            const float ds1 = prob.y * (acc_dp[m][n][2 * half + 1] - delta);
            ds_pairs[n][half] = pack2<Element>(ds0, ds1);
            if constexpr (!kStmatrix) {
              *reinterpret_cast<std::uint32_t*>(p_store + T::kPBytes + (m * 16 + 8 * half) * kPRowBytes + n * 16) =
                  ds_pairs[n][half];
            }
          }
        }
        if constexpr (kStmatrix) stmatrix_pair_rows(ds_pairs, p_stmatrix + T::kPBytes + m * 16 * kPRowBytes);
      }
    }
    __syncthreads();  // P and dS complete in shared memory

    // ---- dV_j += P^T dO_i (line 12): 32 keys x kKvCols, P^T and dO through transposing ldmatrix.
    warp_mma_pipelined<Element, kBlockM / 16, kKvM, kKvN>(
        acc_dv, [&](std::uint32_t(&a)[4], int k, int m) { ldmatrix_x4_trans(a, kv_a + k * 16 * kPRowBytes + m * 32); },
        [&](std::uint32_t(&b)[4], int k, int n) {
          ldmatrix_x4_trans(b, kv_b + (T::kdOOffset - T::kQOffset) + stage_offset + k * 16 * kRowBytes + n * 32);
        });

    // ---- dQ_i += dS K_j (line 20): kQRows x kQCols per warp, added to the fp32 accumulator in
    // HBM: the tile order keeps each lane's 4 values of a fragment in 16 contiguous bytes.
    {
      float acc_dq[kQM][kQN][4] = {};
      warp_mma_pipelined<Element, kBlockN / 16, kQM, kQN>(
          acc_dq, [&](std::uint32_t(&a)[4], int k, int m) { ldmatrix_x4(a, q_a + m * 16 * kPRowBytes + k * 32); },
          [&](std::uint32_t(&b)[4], int k, int n) { ldmatrix_x4_trans(b, q_b + k * 16 * kRowBytes + n * 32); });
      // Query block i's tile (rows past the sequence's end land in its padding, never read).
      float* dq_tile = p.dq_accum + (static_cast<std::int64_t>(head_q) * p.dq_rows + dq_row_q + query_begin) * kHeadDim;
      if (kBulkDq && !p.deterministic) {
        // Stage this warp's fragments once its previous reduction has read them (lane 0 waits),
        // then lane 0 adds them to HBM with one asynchronous bulk reduction.
        if (lane == 0) bulk_wait_read();
        __syncwarp();
#pragma unroll
        for (int m = 0; m < kQM; ++m) {
#pragma unroll
          for (int n = 0; n < kQN; ++n) {
            const float* c = acc_dq[m][n];
            st_shared_v4(dq_stage_warp + ((m * kQN + n) * 128 + lane * 4) * 4, c[0], c[1], c[2], c[3]);
          }
        }
        fence_proxy_async_shared();  // the staged values, visible to the bulk copy
        __syncwarp();
        if (lane == 0) {
          bulk_reduce_add_f32(dq_tile + warp * T::kDqWarpFloats, dq_stage_warp, T::kDqWarpFloats * 4);
          bulk_commit();
        }
      } else {
        // Deterministic mode: wait for this query block's turn. Its key blocks add in decreasing
        // order, so key block j's k-th query block waits only for key block j + 1's (k-1)-th, done
        // a step before (in increasing order a causal key block j would idle j whole steps).
        int* counter = nullptr;
        int turn = 0;
        if (p.deterministic) {
          turn = last_visitor(query_block) - key_block;
          counter = p.dq_counters + (static_cast<std::int64_t>(b) * p.heads_q + head_q) * p.query_blocks + query_block;
          if (tid == 0) wait_for_turn(counter, turn);
          __syncthreads();
        }
        float* dq_lane = dq_tile + dq_lane_offset;
#pragma unroll
        for (int m = 0; m < kQM; ++m) {
#pragma unroll
          for (int n = 0; n < kQN; ++n) {
            const float* c = acc_dq[m][n];
            add_to_dq(dq_lane + (m * kQN + n) * 128, make_float4(c[0], c[1], c[2], c[3]));
          }
        }
        if (p.deterministic) {
          __threadfence();
          __syncthreads();
          if (tid == 0) pass_turn(counter, turn + 1);
        }
      }
    }

    // ---- dK_j += dS^T Q_i (line 18): 32 keys x kKvCols.
    warp_mma_pipelined<Element, kBlockM / 16, kKvM, kKvN>(
        acc_dk,
        [&](std::uint32_t(&a)[4], int k, int m) { ldmatrix_x4_trans(a, kv_a + T::kPBytes + k * 16 * kPRowBytes + m * 32); },
        [&](std::uint32_t(&b)[4], int k, int n) { ldmatrix_x4_trans(b, kv_b + stage_offset + k * 16 * kRowBytes + n * 32); });
    query_block = next_block, head_q = next_head;
  }

  // The staging tile must outlive the last bulk reduction's reads.
  if (kBulkDq && lane == 0) bulk_wait_read();

  // ---- Write dK_j (scaled: S = scale * Q K^T) and dV_j (line 23).
  Element* dk_base = p.dk.as<Element>() + p.dk.offset(seq.batch, seq.position_k, key_begin, head_kv);
  Element* dv_base = p.dv.as<Element>() + p.dv.offset(seq.batch, seq.position_k, key_begin, head_kv);
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
        *reinterpret_cast<std::uint32_t*>(dk_base + row * p.dk.row_stride + col) =
            pack2<Element>(acc_dk[m][n][2 * half] * p.scale, acc_dk[m][n][2 * half + 1] * p.scale);
        *reinterpret_cast<std::uint32_t*>(dv_base + row * p.dv.row_stride + col) =
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
// Kernel 3: dQ = scale * accumulator, rounded to the dtype, back from the tile order to rows. One
// thread block per (query block, head, batch); each thread reads one fragment's 4 values (16
// contiguous bytes) and writes its two row pairs.
template <typename Element, typename Tiling>
__global__ void __launch_bounds__(kBackwardAuxThreads) backward_convert_dq_kernel(const BackwardParams p) {
  using T = Tiling;
  const int query_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const SequenceView seq = sequence_view(p, b);
  const std::int64_t dq_row_q = dq_first_row(seq, b);
  const int query_begin = query_block * T::kBlockM;
  if (query_begin >= seq.seqlen_q) return;
  const float* tile =
      p.dq_accum + (static_cast<std::int64_t>(head) * p.dq_rows + dq_row_q + query_begin) * T::kHeadDim;
  Element* dq = p.dq.as<Element>() + p.dq.offset(seq.batch, seq.position_q, query_begin, head);
  for (int index = threadIdx.x; index < T::kBlockM * T::kHeadDim / 4; index += blockDim.x) {
    // index = fragment * 32 + lane, fragment = (warp * kQM + m) * kQN + n: the tile order.
    const int lane = index % kWarpSize, fragment = index / kWarpSize;
    const int warp = fragment / (T::kQM * T::kQN), m = fragment / T::kQN % T::kQM, n = fragment % T::kQN;
    const int row = (warp % T::kQWarpsM) * T::kQRows + m * 16 + lane / 4;
    const int col = (warp / T::kQWarpsM) * T::kQCols + n * 8 + 2 * (lane % 4);
    if (col >= p.head_dim) continue;
    const float4 value = *reinterpret_cast<const float4*>(tile + 4 * index);
    if (query_begin + row < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + row * p.dq.row_stride + col) =
          device::pack2<Element>(value.x * p.scale, value.y * p.scale);
    }
    if (query_begin + row + 8 < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + (row + 8) * p.dq.row_stride + col) =
          device::pack2<Element>(value.z * p.scale, value.w * p.scale);
    }
  }
}

}  // namespace flashlab::kernels::fa2
