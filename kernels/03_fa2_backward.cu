// Generation 2 backward: FlashAttention-2 Algorithm 2 (Dao 2023) on tensor cores (mma.sync
// m16n8k16, ldmatrix, cp.async double buffering), sm_80 and newer, bf16 and fp16.
//
// Three kernels, in order on one stream:
//   1. preprocess: D_i = rowsum(dO_i * O_i) (Algorithm 2 line 4) and LSE rescaled to base 2 (the
//      fp32 dQ accumulator is zeroed by a memset before it).
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
//      them with one bulk asynchronous reduction (cp.reduce.async.bulk) instead. Blocks that the causal or
//      window mask hides entirely are skipped (never loaded); only blocks that straddle the mask
//      boundary or the sequence ends are masked element by element.
//   3. convert: dQ = scale * accumulator, rounded to the dtype, back in row order (line 21's dQ
//      written out).
//
// Each of the five GEMMs has its own warp grid (see BackwardTiling), with 32-row warp tiles so
// every fragment loaded from shared memory feeds several mma instructions; P and dS pass through
// shared memory between the grids. Every shared-memory address of the loop is a per-lane base
// plus a compile-time offset, and S and dP are computed one after the other, so the loop stays
// within the register file (the dK/dV accumulators take half of it) without spilling.
//
// Tiles: 128 keys x 64 queries (d = 32, 96, 128), 128 x 128 (d = 64), 64 x 64 (d = 192, 256),
// 8 warps, one thread block per SM.
//
// Deterministic mode: the key blocks that touch query block i add their dQ contributions in
// decreasing key-block order, serialised by a per-(batch, head, query block) counter in HBM (a
// ticket lock), with per-thread reductions (no bulk copies): the same additions in the same order
// every run, so dQ is bitwise repeatable. dK and dV never need it (each is owned by one thread
// block).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/attention_api.hpp"
#include "kernels/kernel_common.cuh"

namespace flashlab::kernels {

namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kMaxSupportedHeadDim = 256;
// Rows of padding after each sequence in the dQ accumulator (at least every tiling's query block),
// so the last, partial query block of a sequence adds its whole tile without a bounds test.
constexpr int kDqRowPadding = 128;

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
  int padded_head_dim;  // the kernel's head dim: the row length of the dQ accumulator
  int total_rows_q;     // rows of the workspace arrays: batch * seqlen_q, or the packed total
  float scale;
  float scale_log2;  // scale * log2(e)
  int bottom_right;  // causal / window alignment: 1 bottom-right, 0 top-left
  int window_left, window_right;  // -1: unbounded; causal already folded into window_right
  bool deterministic;
  int query_blocks;  // ceil(seqlen_q / kBlockM): stride of the deterministic counters
  // Workspace.
  float* lse_log2;    // [heads_q][total_rows_q]: LSE * log2(e), +inf for rows without keys
  float* delta;       // [heads_q][total_rows_q]: D = rowsum(dO * O)
  float* dq_accum;    // [heads_q][dq_rows][padded_head_dim], query blocks in tile order
  std::int64_t dq_rows;  // total_rows_q + kDqRowPadding * batch: each sequence's rows padded
  int* dq_counters;   // [batch][heads_q][query_blocks] (deterministic mode)
};

// Sequence b's extent: length and the offsets of its first row in the tensors and the workspace.
struct SequenceView {
  int seqlen_q, seqlen_k;
  std::int64_t workspace_row_q;  // first row of the sequence in the LSE and D arrays
  std::int64_t dq_row_q;         // first row of the sequence in the dQ accumulator
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
  s.dq_row_q = s.workspace_row_q + static_cast<std::int64_t>(kDqRowPadding) * b;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Kernel 1: preprocess (Algorithm 2 line 4). One group of 8 lanes per (row, head); each lane reads
// 16-byte chunks of dO and O.
template <typename Element>
__global__ void __launch_bounds__(256) backward_preprocess_kernel(BackwardParams p) {
  using device::to_float;
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
// 16 bytes added to the fp32 dQ accumulator: one vector reduction on sm_90 (no returned value),
// four scalar atomics before.
[[maybe_unused]] __device__ __forceinline__ void add_to_dq(float* address, float4 value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(value.x), "f"(value.y), "f"(value.z),
               "f"(value.w)
               : "memory");
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
// Kernel 2: the main loop. kHeadDim is head_dim rounded up to a multiple of 32 (the extra columns
// are zero-filled in shared memory and never stored); kBlockN keys per thread block (K_j, V_j),
// kBlockM query rows per inner iteration (Q_i, dO_i), 8 warps. Each GEMM has its own warp grid
// (warps along rows x warps along columns), chosen so that each warp's tile reuses every
// fragment it loads from shared memory several times:
//   S = Q_i K_j^T and dP = dO_i V_j^T (kBlockM x kBlockN): kBlockM/32 x ... warps of 32 x kSCols;
//   dV_j += P^T dO_i and dK_j += dS^T Q_i (kBlockN x kHeadDim): kBlockN/32 x ... warps of 32 x
//     kKvCols, the accumulators stay in registers for the whole loop;
//   dQ_i += dS K_j (kBlockM x kHeadDim): 2 x 4 warps of 32 x kHeadDim/4 (4 x 2 of 16 x kHeadDim/2
//     when kHeadDim/4 is not a multiple of 16).
// P and dS go through shared memory (rounded to the dtype, as the tensor cores read them).
// (Outside the anonymous namespace: members only the sm_80+ kernel body reads would otherwise
// draw nvcc's unreferenced-member warning in the sm_75 pass.)
}  // namespace

namespace fa2_backward_detail {

template <int kHeadDim_, int kBlockN_, int kBlockM_>
struct BackwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStride = kHeadDim + 8;  // padded rows: ldmatrix without bank conflicts
  static constexpr int kPStride = kBlockN + 8;
  // P and dS stored with stmatrix (sm_90) where the registers allow: at d = 128 its row address
  // register makes the loop spill.
  static constexpr bool kStmatrix = kHeadDim <= 64;
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
  static constexpr int kQM = kQRows / 16, kQN = kQCols / 8;  // mma tiles per warp
  static_assert(kSRows % 16 == 0 && kKvRows % 16 == 0 && kQRows % 16 == 0, "row tiles of 16");
  static_assert(kSWarpsM * kSWarpsN == kWarps && kSCols % 16 == 0, "S warp grid");
  static_assert(kKvWarpsN * kKvWarpsD == kWarps && kKvCols % 16 == 0, "dK/dV warp grid");
  static_assert(kQWarpsM * kQWarpsD == kWarps && kQCols % 16 == 0, "dQ warp grid");
  // Shared memory, in bytes: K, V, then two stages each of Q and dO, P, dS, then two stages of the
  // LSE and D rows (floats).
  static constexpr int kKvBytes = kBlockN * kStride * 2;  // each of K and V
  static constexpr int kQBytes = kBlockM * kStride * 2;   // each of Q and dO, per stage
  static constexpr int kPBytes = kBlockM * kPStride * 2;  // each of P and dS
  static constexpr int kKOffset = 0, kVOffset = kKvBytes, kQOffset = 2 * kKvBytes;
  static constexpr int kdOOffset = kQOffset + 2 * kQBytes, kPOffset = kdOOffset + 2 * kQBytes;
  static constexpr int kdSOffset = kPOffset + kPBytes, kRowsOffset = kdSOffset + kPBytes;
  static constexpr std::size_t kSmemBytes = kRowsOffset + 4 * kBlockM * sizeof(float);
  // The dQ accumulator's tile order: query block i's kBlockM x kHeadDim tile is stored as the
  // warps' mma C fragments, fragment (warp, m, n) at ((warp * kQM + m) * kQN + n) * 128 floats and
  // lane l's four values (rows g and g + 8, columns 2t and 2t + 1) at 4 l within it.
  static constexpr int kDqWarpFloats = kQM * kQN * 128;
  static_assert(kBlockM <= kDqRowPadding, "a sequence's last query block must fit its padding");
  // sm_90: each warp's fragments staged in shared memory for one bulk reduction, where the tile
  // fits next to the rest (up to d = 128).
  static constexpr std::size_t kDqStageOffset = kSmemBytes;
  static constexpr std::size_t kDqStageBytes = static_cast<std::size_t>(kBlockM) * kHeadDim * sizeof(float);
  static constexpr bool kBulkDq = kSmemBytes + kDqStageBytes <= 227 * 1024;
  static constexpr std::size_t smem_bytes(bool bulk_dq) { return kSmemBytes + (bulk_dq ? kDqStageBytes : 0); }
};

}  // namespace fa2_backward_detail

namespace {

using fa2_backward_detail::BackwardTiling;

template <typename Element, typename Tiling>
__global__ void __launch_bounds__(Tiling::kThreads, 1) backward_main_kernel(const BackwardParams p) {
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
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment coordinates

  const SequenceView seq = sequence_view(p, b);
  const int key_begin = key_block * kBlockN;
  if (key_begin >= seq.seqlen_k) return;  // varlen: past this sequence's end
  const int key_end = min(key_begin + kBlockN, seq.seqlen_k);
  const MaskRule mask{p.bottom_right ? seq.seqlen_k - seq.seqlen_q : 0, p.window_left, p.window_right, seq.seqlen_k};

  // The query rows that see at least one key of [key_begin, key_end): the mask's skipped blocks
  // are never visited (FA2: blocks outside the causal / window band are skipped, not masked).
  int query_first = 0, query_last = seq.seqlen_q;  // [first, last)
  if (mask.right >= 0) query_first = max(query_first, key_begin - mask.offset - mask.right);
  if (mask.left >= 0) query_last = min(query_last, key_end - mask.offset + mask.left);
  const int block_first = query_first / kBlockM;
  const int block_last = query_last > query_first ? (query_last - 1) / kBlockM + 1 : block_first;  // exclusive
  const int iterations = (block_last - block_first) * p.group;
  // Deterministic mode: the last key block that visits query block i (one this block visits): the
  // block of the last key its last row sees (the visitors of a query block are consecutive).
  auto last_visitor = [&](int i) {
    const int row_last = min(seq.seqlen_q, (i + 1) * kBlockM) - 1;
    return (mask.last_key(row_last) - 1) / kBlockN;
  };

  // ---- Load K_j and V_j (line 6).
  const Element* k_base = static_cast<const Element*>(p.k) + seq.batch_k * p.k_batch +
                          (seq.position_k + key_begin) * p.k_row + static_cast<std::int64_t>(head_kv) * p.k_head;
  const Element* v_base = static_cast<const Element*>(p.v) + seq.batch_k * p.v_batch +
                          (seq.position_k + key_begin) * p.v_row + static_cast<std::int64_t>(head_kv) * p.v_head;
  auto shared_tile = [&](int offset) { return reinterpret_cast<Element*>(smem_raw + offset); };
  load_tile_async<Element, kHeadDim, kBlockN, kThreads, T::kStride>(shared_tile(T::kKOffset), k_base, p.k_row,
                                                                    key_end - key_begin, p.head_dim);
  load_tile_async<Element, kHeadDim, kBlockN, kThreads, T::kStride>(shared_tile(T::kVOffset), v_base, p.v_row,
                                                                    key_end - key_begin, p.head_dim);
  cp_async_commit();

  // Issue the loads of query block `query_block` of head `head_q` (Q_i, dO_i, LSE_i, D_i) into
  // stage `stage`.
  auto load_query_block = [&](int query_block, int head_q, int stage) {
    const int query_begin = query_block * kBlockM;
    const Element* q_src = static_cast<const Element*>(p.q) + seq.batch_q * p.q_batch +
                           (seq.position_q + query_begin) * p.q_row + static_cast<std::int64_t>(head_q) * p.q_head;
    const Element* do_src = static_cast<const Element*>(p.d_o) + seq.batch_q * p.do_batch +
                            (seq.position_q + query_begin) * p.do_row + static_cast<std::int64_t>(head_q) * p.do_head;
    const int stage_offset = stage * T::kQBytes;
    load_tile_async<Element, kHeadDim, kBlockM, kThreads, T::kStride>(shared_tile(T::kQOffset + stage_offset), q_src,
                                                                      p.q_row, seq.seqlen_q - query_begin, p.head_dim);
    load_tile_async<Element, kHeadDim, kBlockM, kThreads, T::kStride>(shared_tile(T::kdOOffset + stage_offset), do_src,
                                                                      p.do_row, seq.seqlen_q - query_begin, p.head_dim);
    const std::int64_t rows = static_cast<std::int64_t>(head_q) * p.total_rows_q + seq.workspace_row_q + query_begin;
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
  // mma.m16n8k16 are in kernel_common.cuh); every other address of the loop is one of these plus
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
  int query_block = block_first, head_q = head_kv * p.group;
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
      float* dq_tile = p.dq_accum + (static_cast<std::int64_t>(head_q) * p.dq_rows + seq.dq_row_q + query_begin) * kHeadDim;
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
          if (tid == 0) {
            int seen;
            do {
              asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
            } while (seen != turn);
          }
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
          if (tid == 0) asm volatile("st.release.gpu.global.s32 [%0], %1;\n" ::"l"(counter), "r"(turn + 1) : "memory");
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
// Kernel 3: dQ = scale * accumulator, rounded to the dtype, back from the tile order to rows. One
// thread block per (query block, head, batch); each thread reads one fragment's 4 values (16
// contiguous bytes) and writes its two row pairs.
template <typename Element, typename Tiling>
__global__ void __launch_bounds__(256) backward_convert_dq_kernel(const BackwardParams p) {
  using T = Tiling;
  const int query_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const SequenceView seq = sequence_view(p, b);
  const int query_begin = query_block * T::kBlockM;
  if (query_begin >= seq.seqlen_q) return;
  const float* tile =
      p.dq_accum + (static_cast<std::int64_t>(head) * p.dq_rows + seq.dq_row_q + query_begin) * T::kHeadDim;
  auto* dq = static_cast<Element*>(p.dq) + seq.batch_q * p.dq_batch + (seq.position_q + query_begin) * p.dq_row +
             static_cast<std::int64_t>(head) * p.dq_head;
  for (int index = threadIdx.x; index < T::kBlockM * T::kHeadDim / 4; index += blockDim.x) {
    // index = fragment * 32 + lane, fragment = (warp * kQM + m) * kQN + n: the tile order.
    const int lane = index % 32, fragment = index / 32;
    const int warp = fragment / (T::kQM * T::kQN), m = fragment / T::kQN % T::kQM, n = fragment % T::kQN;
    const int row = (warp % T::kQWarpsM) * T::kQRows + m * 16 + lane / 4;
    const int col = (warp / T::kQWarpsM) * T::kQCols + n * 8 + 2 * (lane % 4);
    if (col >= p.head_dim) continue;
    const float4 value = *reinterpret_cast<const float4*>(tile + 4 * index);
    if (query_begin + row < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + row * p.dq_row + col) =
          device::pack2<Element>(value.x * p.scale, value.y * p.scale);
    }
    if (query_begin + row + 8 < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + (row + 8) * p.dq_row + col) =
          device::pack2<Element>(value.z * p.scale, value.w * p.scale);
    }
  }
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

// At most the query block of every tiling (they use 64 or 128 rows): sizes the deterministic
// counters, one per block of this many rows.
constexpr int kMinBlockM = 32;

struct WorkspaceLayout {
  std::size_t lse_offset, delta_offset, dq_offset, counters_offset, total;
  std::int64_t dq_rows;  // rows per head of the dQ accumulator
};

WorkspaceLayout workspace_layout(const Problem& problem, bool deterministic) {
  auto align = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t rows = static_cast<std::size_t>(problem.total_rows_q());
  const std::size_t heads = static_cast<std::size_t>(problem.heads_q);
  WorkspaceLayout layout{};
  layout.lse_offset = 0;
  layout.delta_offset = align(rows * heads * sizeof(float));
  layout.dq_offset = layout.delta_offset + align(rows * heads * sizeof(float));
  const std::size_t padded = static_cast<std::size_t>(padded_head_dim(problem.head_dim));
  layout.dq_rows = problem.total_rows_q() + static_cast<std::int64_t>(kDqRowPadding) * problem.batch;
  layout.counters_offset =
      layout.dq_offset + align(static_cast<std::size_t>(layout.dq_rows) * heads * padded * sizeof(float));
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
  int device = 0, smem_limit = 0, major = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  // The kernel stages dQ for bulk reductions exactly when it is built for sm_90 or newer.
  const std::size_t smem_bytes = Tiling::smem_bytes(Tiling::kBulkDq && major >= 9);
  if (static_cast<std::size_t>(smem_limit) < smem_bytes) {
    throw std::invalid_argument("fa2_backward: head_dim = " + std::to_string(params.head_dim) + " needs " +
                                std::to_string(smem_bytes) + " bytes of shared memory per block; this device allows " +
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
                                    static_cast<int>(smem_bytes)),
               "fa2_backward cudaFuncSetAttribute");
    const dim3 grid((params.seqlen_k + Tiling::kBlockN - 1) / Tiling::kBlockN, params.heads_kv, params.batch);
    kernel<<<grid, Tiling::kThreads, smem_bytes, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa2_backward main launch");
  }
  {
    const dim3 grid(params.query_blocks, params.heads_q, params.batch);
    backward_convert_dq_kernel<Element, Tiling><<<grid, 256, 0, stream>>>(params);
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
  require_varlen_offsets(problem, args.cu_seqlens_q, args.cu_seqlens_k, kName);

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
  p.padded_head_dim = padded_head_dim(problem.head_dim);
  p.total_rows_q = problem.total_rows_q();
  p.scale = static_cast<float>(problem.scale());
  p.scale_log2 = static_cast<float>(problem.scale() * 1.4426950408889634);
  const Mask& mask = problem.mask;
  p.window_left = mask.window_left;
  p.window_right = mask.effective_window_right();
  p.bottom_right = mask.alignment == CausalAlignment::bottom_right ? 1 : 0;
  p.deterministic = deterministic;
  p.lse_log2 = reinterpret_cast<float*>(bytes + layout.lse_offset);
  p.delta = reinterpret_cast<float*>(bytes + layout.delta_offset);
  p.dq_accum = reinterpret_cast<float*>(bytes + layout.dq_offset);
  p.dq_rows = layout.dq_rows;
  p.dq_counters = reinterpret_cast<int*>(bytes + layout.counters_offset);

  if (p.total_rows_q > 0) {
    // The dQ accumulator and the deterministic counters start at zero.
    check_cuda(cudaMemsetAsync(p.dq_accum, 0, layout.total - layout.dq_offset, stream), "fa2_backward workspace memset");
    if (problem.dtype == DType::bf16) {
      dispatch_head_dim<__nv_bfloat16>(p, stream);
    } else {
      dispatch_head_dim<__half>(p, stream);
    }
  }
  if (owns_workspace) check_cuda(cudaFreeAsync(workspace, stream), "fa2_backward cudaFreeAsync");
}

}  // namespace flashlab::kernels
