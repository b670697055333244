// The FA3-generation backward kernel (FlashAttention-3, Shah et al. 2024, Section 3 applied to
// FA2 Algorithm 2), for sm_90a; kernels/03_fa3_sm90/backward_host.cu fills its parameters,
// backward_instances/ instantiates it, one head dim per file; backward_tiling.hpp gives the tiles.
//
// Three kernels on one stream, as in the FA2 rung: the FA2 rung's preprocess (D = rowsum(dO * O)
// and LSE in base 2, Algorithm 2 line 4), the main kernel here, and the dQ convert here.
//
// The main kernel: one block per (key block j, KV head, batch); warp specialization (Section 3.1):
//   producer warp 0: K_j and V_j once by TMA (line 6), then for every query block i that sees
//     them (every query head of the group) Q_i, dO_i, LSE_i and D_i by TMA, into a kStages ring
//     (lines 8-9);
//   producer warp 1: dQ: each consumer warpgroup's fp32 slice of dS K_j arrives in shared memory;
//     one lane adds it to the fp32 accumulator in HBM with one bulk reduction
//     (cp.reduce.async.bulk .add.f32), in deterministic mode in key-block order after a ticket,
//     warps 1 and 2 taking the query blocks in turn (line 21's dQ_i += dS K_j);
//   two consumer warpgroups, 64 keys each, on wgmma (lines 11-20), S and dP transposed:
//     S^T = K_j Q_i^T and dP^T = V_j dO_i^T (SS), P^T = exp2(S^T scale log2(e) - LSE) with the
//     mask on boundary blocks only, dV_j += P^T dO_i with P^T from registers (RS) while dS^T =
//     P^T o (dP^T - D) is formed, dS^T to shared memory (stmatrix) for both warpgroups, then this
//     warpgroup's dQ slice = dS K_j (SS, dS read MN-major from the transposed tile) and dK_j +=
//     dS^T Q_i (RS), the slice staged for the dQ writer while dK runs.
// dK_j (scaled) and dV_j leave from registers at the end (line 23). setmaxnreg moves registers
// from the producer warpgroup to the consumers.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/02_fa2_sm80/backward_kernel.cuh"
#include "kernels/03_fa3_sm90/backward_tiling.hpp"
#include "kernels/03_fa3_sm90/tile_order.hpp"
#include "kernels/common/attention_params.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/conversions.cuh"
#include "kernels/common/sm90.cuh"
#include "kernels/common/sm90_sync.cuh"
#include "kernels/common/sm90_tma.cuh"
#include "kernels/common/sm90_wgmma.cuh"
#include "kernels/common/turns.cuh"

namespace flashlab::kernels::fa3 {

// The FA2 rung's backward parameters (its preprocess reads them) and TMA's view of Q, K, V, dO.
// The dQ accumulator holds each query block's tile as two contiguous 64 x 64 slices in the order
// the consumers stage them (dq_slice_index).
struct BackwardParams : fa2::BackwardParams {
  CUtensorMap q_map, k_map, v_map, do_map;  // (column, row, head, batch); varlen: one batch of packed rows
  CUtensorMap lse_map, delta_map;           // (workspace row, head) of lse_log2 and delta
  TileOrder order;                          // which (key block, KV head, batch) the t-th block takes
};

using namespace device;
using namespace sm90;

// Named barrier 1: both consumer warpgroups have written their half of dS^T. Named barriers 2
// and 3: a deterministic dQ writer has taken an even (odd) step's slices (write_dq). Two, because
// a named barrier counts threads, not warps: with one, a writer's arrive and its own next sync
// would complete it without the other writer.
constexpr int kDsBarrier = 1, kDqWriterBarrier = 2;

// Where value e (0..3) of n8 tile i of thread `thread` of a warpgroup's 64 x 64 dQ slice sits in
// the staged slice: 16 contiguous bytes per (tile, thread), consecutive threads side by side, so
// the staging stores are conflict-free and the slice is one contiguous bulk reduction.
__host__ __device__ constexpr int dq_slice_index(int tile, int thread, int e) { return (tile * 128 + thread) * 4 + e; }

struct BackwardBarriers {
  static constexpr int kMaxStages = 2;
  Mbarrier kv_full;
  Mbarrier q_full[kMaxStages], q_empty[kMaxStages];
  Mbarrier dq_full[2], dq_empty[2];  // keys split: the staged slices
  Mbarrier dq_turn, dq_added;        // head dim split, deterministic mode: the consumers' turn to add dQ_i, and their sums added
};

// The block's key block, KV head and batch: the t-th block of the launch (linear index, x fastest)
// takes the t-th of the backward's tile order (tile_order.hpp).
struct BlockPosition {
  int key_block, head_kv, batch;
};
__device__ __forceinline__ BlockPosition block_position(const BackwardParams& p) {
  const int linear = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const TileCoordinates c = p.order.coordinates(linear);
  return {c.m_block, c.head, c.batch};
}

// The query blocks a key block visits (FA2 Algorithm 2 with masks: only the queries that see
// some key of the block), the same for the producer, the dQ writer and the consumers.
struct KeyBlockWork {
  SequenceView sequence;
  MaskRule mask;
  int key_block, head_kv, batch;
  int key_begin, key_end;       // key_end: min(key_begin + kBlockN, seqlen_k)
  int block_first, block_last;  // query blocks [block_first, block_last) of each query head
  int iterations;               // (block_last - block_first) * group_size
};
template <class Tile>
__device__ __forceinline__ KeyBlockWork key_block_work(const BackwardParams& p) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  KeyBlockWork w;
  const BlockPosition position = block_position(p);
  w.key_block = position.key_block, w.head_kv = position.head_kv, w.batch = position.batch;
  w.sequence = sequence_view(p, w.batch);
  w.mask = mask_rule(p, w.sequence);
  w.key_begin = w.key_block * kBlockN;
  w.key_end = min(w.key_begin + kBlockN, w.sequence.seqlen_k);
  w.block_first = w.block_last = w.iterations = 0;
  if (w.key_begin < w.sequence.seqlen_k) {
    const IndexRange queries = w.mask.visible_queries(w.key_begin, w.key_end);
    w.block_first = queries.first / kBlockM;
    w.block_last = queries.last > queries.first ? (queries.last - 1) / kBlockM + 1 : w.block_first;
    w.iterations = (w.block_last - w.block_first) * p.group_size;
  }
  return w;
}
// A position on the walk: query block and query head, the blocks fastest (so the loops carry it
// instead of dividing the iteration count).
struct QueryStep {
  int block, head;
  __device__ __forceinline__ void advance(const KeyBlockWork& w) {
    if (++block == w.block_last) block = w.block_first, ++head;
  }
};
__device__ __forceinline__ QueryStep first_query_step(const BackwardParams& p, const KeyBlockWork& w) {
  return {w.block_first, w.head_kv * p.group_size};
}

// ---------------------------------------------------------------------------------------------
// Producer warp 0, lane 0: every TMA copy.
template <class Tile>
__device__ void produce_inputs(const BackwardParams& p, const KeyBlockWork& w, unsigned char* shared,
                               BackwardBarriers& bars) {
  constexpr int kBlockM = Tile::kBlockM;
  const int map_batch = static_cast<int>(w.sequence.batch), head_kv = w.head_kv;
  if (w.iterations > 0) {  // a block no query sees loads nothing
    tma_prefetch_map(p.q_map), tma_prefetch_map(p.do_map);
    mbarrier_arrive_expect_bytes(&bars.kv_full, 2 * Tile::kKVBytes);
    const int key0 = static_cast<int>(w.sequence.position_k) + w.key_begin;
    for (int panel = 0; panel < Tile::kPanels; ++panel) {
      tma_load(shared + Tile::kK + panel * Tile::kBlockN * 128, p.k_map, panel * 64, key0, head_kv, map_batch, &bars.kv_full);
      tma_load(shared + Tile::kV + panel * Tile::kBlockN * 128, p.v_map, panel * 64, key0, head_kv, map_batch, &bars.kv_full);
    }
  }
  float* rows = reinterpret_cast<float*>(shared + Tile::kRows);
  RingPosition<Tile::kStages> ring;
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, ring.advance(), step.advance(w)) {
    const int query_begin = step.block * kBlockM;
    mbarrier_wait(&bars.q_empty[ring.stage], ring.phase ^ 1);
    Mbarrier* full = &bars.q_full[ring.stage];
    mbarrier_arrive_expect_bytes(full, 2 * Tile::kQBytes + 2 * kBlockM * 4);
    const int row0 = static_cast<int>(w.sequence.position_q) + query_begin;
    for (int panel = 0; panel < Tile::kPanels; ++panel) {
      const int offset = ring.stage * Tile::kQBytes + panel * kBlockM * 128;
      tma_load(shared + Tile::kQ + offset, p.q_map, panel * 64, row0, step.head, map_batch, full);
      tma_load(shared + Tile::kDO + offset, p.do_map, panel * 64, row0, step.head, map_batch, full);
    }
    // LSE_i (base 2) and D_i, from a row on 16 bytes (TMA's innermost coordinate must be). Rows
    // past the sequence read zeros or the next sequence's (finite, or +inf for a row without keys):
    // their scores are masked to -inf, so P = 0 and dS = 0.
    const int workspace_row = static_cast<int>(backward_rows_first_row(w.sequence.first_row_q, w.batch)) + query_begin;
    float* stage_rows = rows + ring.stage * 2 * kBlockM;
    tma_load_rows(stage_rows, p.lse_map, workspace_row, step.head, full);
    tma_load_rows(stage_rows + kBlockM, p.delta_map, workspace_row, step.head, full);
  }
}

// The dQ writers, producer warps 1 and 2 (lane 0 of each does the work): add each staged dQ slice
// to the accumulator with one bulk reduction (line 21) and free the staging once the reduction has
// read it. Atomic mode: warp 1 alone. Deterministic mode: query block i's key blocks add in
// decreasing order (the FA2 rung's ticket: its last visitor first), each once the one before has
// published its sums; the wait for a reduction to land keeps its writer until it passes the turn,
// so the two warps take the query blocks in turn (even and odd steps of the walk) and one waits
// for its sums while the other reduces the next slice.
template <class Tile>
__device__ void write_dq(const BackwardParams& p, const KeyBlockWork& w, unsigned char* shared, BackwardBarriers& bars,
                         int writer, int lane) {
  constexpr int kBlockM = Tile::kBlockM;
  const int writers = p.deterministic ? 2 : 1;
  if (writer >= writers) return;
  const std::int64_t dq_row0 = fa2::dq_first_row(w.sequence, w.batch);
  const std::uint32_t stage_base = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared + Tile::kDqStage));
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, step.advance(w)) {
    if (it % writers != writer) continue;
    int* counter = nullptr;
    int turn = 0;
    if (p.deterministic && lane == 0) {
      const int row_last = min(w.sequence.seqlen_q, (step.block + 1) * kBlockM) - 1;
      turn = (w.mask.last_key(row_last) - 1) / Tile::kBlockN - w.key_block;
      counter = p.dq_counters + (static_cast<std::int64_t>(w.batch) * p.heads_q + step.head) * p.query_blocks + step.block;
      wait_for_turn(counter, turn);
      fence_proxy_async_global();  // the reductions below come after the sums the turn waited for
    }
    // The slices' barriers are at step `it` once the other writer has taken step it - 1's (a
    // parity wait cannot tell the two apart).
    if (writers == 2 && it > 0) named_barrier_sync(kDqWriterBarrier + (it - 1) % 2, 64);
    if (lane == 0) {
      float* tile = p.dq_accum + (static_cast<std::int64_t>(step.head) * p.dq_rows + dq_row0 + step.block * kBlockM) * Tile::kHeadDim;
      for (int slice = 0; slice < 2; ++slice) {
        mbarrier_wait(&bars.dq_full[slice], it & 1);
        bulk_reduce_add_f32(tile + slice * Tile::kDqSliceFloats, stage_base + slice * Tile::kDqStageBytes,
                            Tile::kDqStageBytes);
        bulk_commit();
      }
    }
    __syncwarp();
    if (writers == 2 && it + 1 < w.iterations) named_barrier_arrive(kDqWriterBarrier + it % 2, 64);
    if (lane == 0) {
      bulk_wait_read();  // the staging slices may be rewritten: the consumers go on
      mbarrier_arrive(&bars.dq_empty[0]), mbarrier_arrive(&bars.dq_empty[1]);
      if (p.deterministic) {
        bulk_wait();  // the sums are in memory
        __threadfence();
        pass_turn(counter, turn + 1);
      }
    }
  }
  if (lane == 0) bulk_wait_read();  // shared memory must outlive the last reduction's reads
}

// The head-dim-split dataflow's deterministic dQ (producer warp 1, lane 0): the consumers add
// their dQ_i from the registers, and this lane orders them like write_dq's tickets. For each step
// of the walk it waits for the key block's turn, opens the step to the consumers (dq_turn), waits
// until all eight consumer warps have added and fenced their sums (dq_added), and passes the turn.
template <class Tile>
__device__ void order_dq_additions(const BackwardParams& p, const KeyBlockWork& w, BackwardBarriers& bars) {
  constexpr int kBlockM = Tile::kBlockM;
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, step.advance(w)) {
    const int row_last = min(w.sequence.seqlen_q, (step.block + 1) * kBlockM) - 1;
    const int turn = (w.mask.last_key(row_last) - 1) / Tile::kBlockN - w.key_block;
    int* counter = p.dq_counters + (static_cast<std::int64_t>(w.batch) * p.heads_q + step.head) * p.query_blocks + step.block;
    wait_for_turn(counter, turn);
    mbarrier_arrive(&bars.dq_turn);
    mbarrier_wait(&bars.dq_added, it & 1);
    __threadfence();
    pass_turn(counter, turn + 1);
  }
}

// ---------------------------------------------------------------------------------------------
// The consumers.

template <typename T, class Tile>
__device__ void consume(const BackwardParams& p, const KeyBlockWork& w, unsigned char* shared, BackwardBarriers& bars,
                        int group) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kHeadDim = Tile::kHeadDim;
  const int thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
  const std::uint32_t base = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  // This thread's keys: rows key_row0 and key_row0 + 8 of the key block.
  const int key_row0 = 64 * group + 16 * warp + g;
  const float* rows = reinterpret_cast<const float*>(shared + Tile::kRows);

  // Descriptors. S^T and dP^T: A = this warpgroup's 64 rows of K (V), K-major; B = Q_i (dO_i),
  // K-major, kBlockM rows; k16 step k at panel k / 4, +32 bytes per step inside it.
  const std::uint64_t k_rows = k_major_descriptor(base + Tile::kK + group * 64 * 128);
  const std::uint64_t v_rows = k_major_descriptor(base + Tile::kV + group * 64 * 128);
  const std::uint64_t q_k_major = k_major_descriptor(base + Tile::kQ);
  const std::uint64_t do_k_major = k_major_descriptor(base + Tile::kDO);
  // dV += P^T dO_i and dK += dS^T Q_i: B = dO_i (Q_i) MN-major (the head dim contiguous), k16 step
  // of queries + 2048 bytes.
  const std::uint64_t q_mn_major = mn_major_descriptor(base + Tile::kQ, kBlockM * 128);
  const std::uint64_t do_mn_major = mn_major_descriptor(base + Tile::kDO, kBlockM * 128);
  // dQ slice = dS K_j: A = dS, MN-major from the dS^T tile (keys as rows, queries contiguous):
  // this warpgroup's 64 queries are panel `group` when the slices split the rows; B = K_j
  // MN-major, its 64 columns panel `group` when they split the columns; k16 step of keys + 2048.
  const int a_panel = Tile::kDqSplitsColumns ? 0 : group, b_panel = Tile::kDqSplitsColumns ? group : 0;
  const std::uint64_t ds_mn_major = mn_major_descriptor(base + Tile::kDs + a_panel * kBlockN * 128, kBlockN * 128);
  const std::uint64_t k_mn_major = mn_major_descriptor(base + Tile::kK + b_panel * kBlockN * 128, kBlockN * 128);
  constexpr std::uint64_t kQStageStep = Tile::kQBytes >> 4, kDsBufferStep = Tile::kDsBytes >> 4;
  // With 64 query rows (d 128) the registers hold S^T and dP^T together, and P^T stays in fp32
  // until dS^T; with 128 (d 64) dP^T is issued once P^T is packed, and dS^T reads P^T back from
  // the packed A fragments.
  constexpr bool kScoresTogether = kBlockM == 64, kKeepP = kBlockM == 64;

  float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  // stmatrix's row addresses in the dS^T tile: lanes 8j .. 8j + 7 give the rows of 8 x 8 matrix j
  // of a k16 step (keys + 8 (j % 2), queries + 8 (j / 2): the register order of an A fragment).
  const int ds_row = 64 * group + 16 * warp + lane % 8 + 8 * (lane / 8 % 2), ds_column = 8 * (lane / 16);
  const std::uint32_t ds_tile0 = base + Tile::kDs;

  if (w.iterations > 0) mbarrier_wait(&bars.kv_full, 0);
  RingPosition<Tile::kStages> ring;
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, ring.advance(), step.advance(w)) {
    const int query_begin = step.block * kBlockM;
    const std::uint64_t stage = ring.stage * kQStageStep;
    const float* lse = rows + ring.stage * 2 * kBlockM;
    const float* delta = lse + kBlockM;
    mbarrier_wait(&bars.q_full[ring.stage], ring.phase);

    // Lines 11 and 14: S^T = K_j Q_i^T and dP^T = V_j dO_i^T.
    float s[kBlockM / 2], dp[kBlockM / 2];
    auto issue_scores = [&](float (&d)[kBlockM / 2], std::uint64_t rows_a, std::uint64_t columns_b) {
#pragma unroll
      for (int k = 0; k < kHeadDim / 16; ++k) {
        const std::uint64_t a = (k / 4 * kBlockN * 128 + k % 4 * 32) >> 4, b = (k / 4 * kBlockM * 128 + k % 4 * 32) >> 4;
        Wgmma<T, kBlockM>::template ss<0>(d, rows_a + a, columns_b + stage + b, k > 0);
      }
      wgmma_commit();
    };
    wgmma_fence();
    issue_scores(s, k_rows, q_k_major);
    if constexpr (kScoresTogether) issue_scores(dp, v_rows, do_k_major);
    // LSE_i of this thread's query columns, read while the scores run.
    float2 lse_i[kBlockM / 8];
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) lse_i[i] = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * t);
    if constexpr (kScoresTogether) {
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    fence_registers(s);

    // Lines 12-13: P^T = exp2(S^T scale log2(e) - LSE log2(e)); keys a query must not see, keys
    // past the sequence and queries past it are -inf (on blocks crossing an edge only).
    const bool needs_mask = query_begin + kBlockM > w.sequence.seqlen_q || w.key_begin + kBlockN > w.sequence.seqlen_k ||
                            !w.mask.block_full(query_begin, query_begin + kBlockM - 1, w.key_begin, w.key_begin + kBlockN);
    if (needs_mask) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        // The queries that see this key (none past the keys, none past the queries), relative to
        // this thread's first column: two compares per score.
        const QueryInterval seen = w.mask.col_queries(w.key_begin + key_row0 + 8 * r);
        const int low = seen.low - query_begin - 2 * t, high = seen.high - query_begin - 2 * t;
#pragma unroll
        for (int i = 0; i < kBlockM / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (8 * i + e < low || 8 * i + e > high) s[4 * i + 2 * r + e] = -INFINITY;
          }
      }
    }
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s[4 * i + 2 * r] = exp2f(fmaf(s[4 * i + 2 * r], p.scale_log2, -lse_i[i].x));
        s[4 * i + 2 * r + 1] = exp2f(fmaf(s[4 * i + 2 * r + 1], p.scale_log2, -lse_i[i].y));
      }
    }
    std::uint32_t pf[kBlockM / 16][4];
    pack_a_operand<T, kBlockM>(s, pf);

    // Line 12: dV_j += P^T dO_i.
    wgmma_fence();
    if constexpr (!kScoresTogether) issue_scores(dp, v_rows, do_k_major);
#pragma unroll
    for (int k = 0; k < kBlockM / 16; ++k) {
      Wgmma<T, kHeadDim>::template rs<1>(dv, pf[k], do_mn_major + stage + ((k * 16 * 128) >> 4), 1);
    }
    wgmma_commit();
    // D_i, read while dP^T finishes.
    float2 delta_i[kBlockM / 8];
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) delta_i[i] = *reinterpret_cast<const float2*>(delta + 8 * i + 2 * t);
    wgmma_wait<1>();  // dP^T done; dV may still run
    fence_registers(dp);

    // Line 16: dS^T = P^T o (dP^T - D).
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 prob = kKeepP ? make_float2(s[4 * i + 2 * r], s[4 * i + 2 * r + 1])
                                   : unpack2<T>(pf[i / 2][2 * (i % 2) + r]);
        dp[4 * i + 2 * r] = prob.x * (dp[4 * i + 2 * r] - delta_i[i].x);
        dp[4 * i + 2 * r + 1] = prob.y * (dp[4 * i + 2 * r + 1] - delta_i[i].y);
      }
    }
    std::uint32_t dsf[kBlockM / 16][4];
    pack_a_operand<T, kBlockM>(dp, dsf);
    // dS^T to shared memory (buffer it % 2) in the TMA box layout, keys as rows, query panels: one
    // stmatrix per k16 step.
    const std::uint32_t ds_tile = ds_tile0 + (it % 2) * Tile::kDsBytes;
#pragma unroll
    for (int k = 0; k < kBlockM / 16; ++k) {
      stmatrix_x4(ds_tile + swizzled_offset(ds_row, 16 * k + ds_column, kBlockN), dsf[k][0], dsf[k][1], dsf[k][2], dsf[k][3]);
    }

    // Line 20: this warpgroup's dQ slice = dS K_j, once both halves of dS^T are in; issued before
    // line 18's dK_j += dS^T Q_i so that the slice is staged while dK runs.
    fence_shared_to_async_proxy();
    named_barrier_sync(kDsBarrier, 256);
    float dq[32];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k) {
      const std::uint64_t step16 = (k * 16 * 128) >> 4;
      Wgmma<T, 64>::template ss<1, 1>(dq, ds_mn_major + (it % 2) * kDsBufferStep + step16, k_mn_major + step16, k > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < kBlockM / 16; ++k) {
      Wgmma<T, kHeadDim>::template rs<1>(dk, dsf[k], q_mn_major + stage + ((k * 16 * 128) >> 4), 1);
    }
    wgmma_commit();
    wgmma_wait<1>();  // dV and the dQ slice done; dK may still run
    fence_registers(dq), fence_registers(dv), fence_registers(pf);

    // The slice to the staging buffer once the writer has read the previous one.
    mbarrier_wait(&bars.dq_empty[group], (it & 1) ^ 1);
    float* staged = reinterpret_cast<float*>(shared + Tile::kDqStage + group * Tile::kDqStageBytes);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      *reinterpret_cast<float4*>(staged + dq_slice_index(i, thread, 0)) =
          make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]);
    }
    fence_shared_to_async_proxy();
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&bars.dq_full[group]);
    wgmma_wait<0>();
    fence_registers(dk), fence_registers(dsf);
    __syncwarp();  // every lane's reads of the stage (LSE_i, D_i; Q_i, dO_i by wgmma) come before the release
    if (lane == 0) mbarrier_arrive(&bars.q_empty[ring.stage]);  // this warp is done with Q_i, dO_i
  }

  // Line 23: dK_j (times the softmax scale: S = scale Q K^T) and dV_j, rows past the keys and
  // columns past the head dim not written.
  T* dk_out = p.dk.as<T>() + p.dk.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
  T* dv_out = p.dv.as<T>() + p.dv.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key_row0 + 8 * r;
    if (w.key_begin + row >= w.key_end) continue;
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      const int column = 8 * i + 2 * t;
      if (column >= p.head_dim) continue;
      *reinterpret_cast<std::uint32_t*>(dk_out + row * p.dk.row_stride + column) =
          pack2<T>(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
      *reinterpret_cast<std::uint32_t*>(dv_out + row * p.dv.row_stride + column) =
          pack2<T>(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
    }
  }
}

// The head-dim-split consumers (d 256; backward_tiling.hpp): warpgroup `group` computes S and dP
// for keys 32 group .. 32 group + 31 of the block (queries as the rows), writes its half of P and
// dS to shared memory, and once both halves are in, owns columns 128 group .. 128 group + 127 of
// dV_j, dK_j (all 64 keys) and of dQ_i.
template <typename T, class Tile>
__device__ void consume_head_dim_split(const BackwardParams& p, const KeyBlockWork& w, unsigned char* shared,
                                       BackwardBarriers& bars, int group) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kHeadDim = Tile::kHeadDim;
  constexpr int kKeys = kBlockN / 2, kColumns = kHeadDim / 2;  // this warpgroup's keys of S, its columns of dK, dV, dQ
  static_assert(kBlockM == 64 && kBlockN == 64 && kColumns % 64 == 0, "one 64-key panel of P and dS, whole column panels");
  const int thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
  const std::uint32_t base = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));
  const int row0 = 16 * warp + g;  // this thread's query rows of the block: row0 and row0 + 8
  const float* rows = reinterpret_cast<const float*>(shared + Tile::kRows);
  constexpr int kFirstPanel = kColumns / 64;  // times group: this warpgroup's first 64-column panel

  // Descriptors. S and dP: A = Q_i (dO_i), K-major; B = this warpgroup's 32 rows of K_j (V_j),
  // K-major; k16 step k at panel k / 4, +32 bytes per step inside it.
  const std::uint64_t q_k_major = k_major_descriptor(base + Tile::kQ);
  const std::uint64_t do_k_major = k_major_descriptor(base + Tile::kDO);
  const std::uint64_t k_keys = k_major_descriptor(base + Tile::kK + group * kKeys * 128);
  const std::uint64_t v_keys = k_major_descriptor(base + Tile::kV + group * kKeys * 128);
  // The P and dS tiles of a buffer (queries as rows, the 64 keys contiguous). dV += P^T dO_i and
  // dK += dS^T Q_i: A = P^T (dS^T), MN-major from them; B = this warpgroup's columns of dO_i
  // (Q_i), MN-major; both +2048 bytes per k16 step of queries. dQ_i = dS K_j: A = dS, K-major
  // (+32 bytes per k16 step of keys); B = this warpgroup's columns of K_j, MN-major (+2048).
  const std::uint32_t p_tile0 = base + Tile::kDs, ds_tile0 = p_tile0 + Tile::kDsBytes;
  const std::uint64_t p_mn_major = mn_major_descriptor(p_tile0, kBlockM * 128);
  const std::uint64_t ds_mn_major = mn_major_descriptor(ds_tile0, kBlockM * 128);
  const std::uint64_t ds_k_major = k_major_descriptor(ds_tile0);
  const std::uint64_t do_columns = mn_major_descriptor(base + Tile::kDO + kFirstPanel * group * kBlockM * 128, kBlockM * 128);
  const std::uint64_t q_columns = mn_major_descriptor(base + Tile::kQ + kFirstPanel * group * kBlockM * 128, kBlockM * 128);
  const std::uint64_t k_columns = mn_major_descriptor(base + Tile::kK + kFirstPanel * group * kBlockN * 128, kBlockN * 128);
  constexpr std::uint64_t kQStageStep = Tile::kQBytes >> 4, kBufferStep = (2 * Tile::kDsBytes) >> 4;

  float dk[kColumns / 2], dv[kColumns / 2];
#pragma unroll
  for (int i = 0; i < kColumns / 2; ++i) dk[i] = dv[i] = 0.f;

  // stmatrix's row addresses: lanes 8j .. 8j + 7 give the rows of 8 x 8 matrix j of a k16 step
  // (queries + 8 (j % 2), keys + 8 (j / 2): the register order of an A fragment).
  const int st_row = 16 * warp + lane % 8 + 8 * (lane / 8 % 2), st_column = kKeys * group + 8 * (lane / 16);
  const std::int64_t dq_row0 = fa2::dq_first_row(w.sequence, w.batch);

  if (w.iterations > 0) mbarrier_wait(&bars.kv_full, 0);
  RingPosition<Tile::kStages> ring;
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, ring.advance(), step.advance(w)) {
    const int query_begin = step.block * kBlockM;
    const std::uint64_t stage = ring.stage * kQStageStep, buffer = (it % 2) * kBufferStep;
    const float* lse = rows + ring.stage * 2 * kBlockM;
    const float* delta = lse + kBlockM;
    mbarrier_wait(&bars.q_full[ring.stage], ring.phase);

    // Lines 11 and 14: S = Q_i K_j^T and dP = dO_i V_j^T, this warpgroup's keys.
    float s[kKeys / 2], dp[kKeys / 2];
    auto issue_scores = [&](float (&d)[kKeys / 2], std::uint64_t rows_a, std::uint64_t keys_b) {
#pragma unroll
      for (int k = 0; k < kHeadDim / 16; ++k) {
        const std::uint64_t a = (k / 4 * kBlockM * 128 + k % 4 * 32) >> 4, b = (k / 4 * kBlockN * 128 + k % 4 * 32) >> 4;
        Wgmma<T, kKeys>::template ss<0>(d, rows_a + stage + a, keys_b + b, k > 0);
      }
      wgmma_commit();
    };
    wgmma_fence();
    issue_scores(s, q_k_major, k_keys);
    issue_scores(dp, do_k_major, v_keys);
    const float lse_r[2] = {lse[row0], lse[row0 + 8]}, delta_r[2] = {delta[row0], delta[row0 + 8]};
    wgmma_wait<1>();
    fence_registers(s);

    // Lines 12-13: P = exp2(S scale log2(e) - LSE log2(e)); keys a query must not see, keys past
    // the sequence and queries past it are -inf (on blocks crossing an edge only).
    const bool needs_mask = query_begin + kBlockM > w.sequence.seqlen_q || w.key_begin + kBlockN > w.sequence.seqlen_k ||
                            !w.mask.block_full(query_begin, query_begin + kBlockM - 1, w.key_begin, w.key_begin + kBlockN);
    if (needs_mask) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = query_begin + row0 + 8 * r;
        const KeyInterval keys = row < w.sequence.seqlen_q ? w.mask.row_keys(row) : KeyInterval{0, -1};
        const int first_key = w.key_begin + kKeys * group + 2 * t;  // of this thread's first column
        const int low = keys.low - first_key, high = keys.high - first_key;
#pragma unroll
        for (int i = 0; i < kKeys / 8; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (8 * i + e < low || 8 * i + e > high) s[4 * i + 2 * r + e] = -INFINITY;
          }
      }
    }
#pragma unroll
    for (int i = 0; i < kKeys / 8; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) s[4 * i + 2 * r + e] = exp2f(fmaf(s[4 * i + 2 * r + e], p.scale_log2, -lse_r[r]));
    std::uint32_t pf[kKeys / 16][4];
    pack_a_operand<T, kKeys>(s, pf);
    const std::uint32_t p_tile = p_tile0 + (it % 2) * 2 * Tile::kDsBytes, ds_tile = p_tile + Tile::kDsBytes;
#pragma unroll
    for (int k = 0; k < kKeys / 16; ++k) {
      stmatrix_x4(p_tile + swizzled_offset(st_row, st_column + 16 * k, kBlockM), pf[k][0], pf[k][1], pf[k][2], pf[k][3]);
    }

    // Line 16: dS = P o (dP - D).
    wgmma_wait<0>();
    fence_registers(dp);
#pragma unroll
    for (int i = 0; i < kKeys / 8; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int e = 0; e < 2; ++e) dp[4 * i + 2 * r + e] = s[4 * i + 2 * r + e] * (dp[4 * i + 2 * r + e] - delta_r[r]);
    std::uint32_t dsf[kKeys / 16][4];
    pack_a_operand<T, kKeys>(dp, dsf);
#pragma unroll
    for (int k = 0; k < kKeys / 16; ++k) {
      stmatrix_x4(ds_tile + swizzled_offset(st_row, st_column + 16 * k, kBlockM), dsf[k][0], dsf[k][1], dsf[k][2], dsf[k][3]);
    }

    // Lines 17-21 once both halves of P and dS are in: dQ_i = dS K_j first (its sums leave while
    // the others run), then dV_j += P^T dO_i and dK_j += dS^T Q_i.
    fence_shared_to_async_proxy();
    named_barrier_sync(kDsBarrier, 256);
    float dq[kColumns / 2];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k) {
      Wgmma<T, kColumns>::template ss<1, 0>(dq, ds_k_major + buffer + ((k * 32) >> 4), k_columns + ((k * 16 * 128) >> 4), k > 0);
    }
    wgmma_commit();
#pragma unroll
    for (int k = 0; k < kBlockM / 16; ++k) {
      const std::uint64_t step16 = (k * 16 * 128) >> 4;
      Wgmma<T, kColumns>::template ss<1, 1>(dv, p_mn_major + buffer + step16, do_columns + stage + step16, 1);
    }
#pragma unroll
    for (int k = 0; k < kBlockM / 16; ++k) {
      const std::uint64_t step16 = (k * 16 * 128) >> 4;
      Wgmma<T, kColumns>::template ss<1, 1>(dk, ds_mn_major + buffer + step16, q_columns + stage + step16, 1);
    }
    wgmma_commit();
    wgmma_wait<1>();
    fence_registers(dq);

    // Line 21: dQ_i += dS K_j, 16-byte reductions into the accumulator's slices 2 group and
    // 2 group + 1 (deterministic mode: in the turn order_dq_additions opens).
    if (p.deterministic) mbarrier_wait(&bars.dq_turn, it & 1);
    float* tile = p.dq_accum + (static_cast<std::int64_t>(step.head) * p.dq_rows + dq_row0 + query_begin) * kHeadDim +
                  kColumns / 64 * group * Tile::kDqSliceFloats;
#pragma unroll
    for (int j = 0; j < kColumns / 8; ++j) {
      red_add_v4_f32(tile + j / 8 * Tile::kDqSliceFloats + dq_slice_index(j % 8, thread, 0),
                     make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
    }
    if (p.deterministic) {
      __threadfence();  // this thread's sums are visible before the turn passes
      __syncwarp();
      if (lane == 0) mbarrier_arrive(&bars.dq_added);
    }
    wgmma_wait<0>();
    fence_registers(dk), fence_registers(dv);
    __syncwarp();  // every lane's reads of the stage come before the release
    if (lane == 0) mbarrier_arrive(&bars.q_empty[ring.stage]);
  }

  // Line 23: dK_j (times the softmax scale) and dV_j, this warpgroup's columns; rows past the
  // keys and columns past the head dim not written.
  T* dk_out = p.dk.as<T>() + p.dk.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
  T* dv_out = p.dv.as<T>() + p.dv.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    if (w.key_begin + row >= w.key_end) continue;
#pragma unroll
    for (int i = 0; i < kColumns / 8; ++i) {
      const int column = kColumns * group + 8 * i + 2 * t;
      if (column >= p.head_dim) continue;
      *reinterpret_cast<std::uint32_t*>(dk_out + row * p.dk.row_stride + column) =
          pack2<T>(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
      *reinterpret_cast<std::uint32_t*>(dv_out + row * p.dv.row_stride + column) =
          pack2<T>(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
    }
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BackwardTiling<kHeadDim>::kThreads, BackwardTiling<kHeadDim>::kMinBlocksPerSm)
    fa3_backward_kernel(const __grid_constant__ BackwardParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tile = BackwardTiling<kHeadDim>;
  static_assert(Tile::kStages <= BackwardBarriers::kMaxStages);
  static_assert(sizeof(BackwardBarriers) <= 256, "the barriers fit their space");
  extern __shared__ unsigned char shared_raw[];
  unsigned char* shared = aligned_shared_base<1024>(shared_raw);
  BackwardBarriers& bars = *reinterpret_cast<BackwardBarriers*>(shared + Tile::kBarriers);
  const KeyBlockWork w = key_block_work<Tile>(p);
  if (w.key_begin >= w.sequence.seqlen_k) return;  // varlen: past this sequence's end (the whole block)
  if (threadIdx.x == 0) {
    mbarrier_init(&bars.kv_full, 1);
    for (int stage = 0; stage < Tile::kStages; ++stage) {
      mbarrier_init(&bars.q_full[stage], 1);    // producer warp 0's lane 0, with the bytes
      mbarrier_init(&bars.q_empty[stage], 8);   // each consumer warp
    }
    for (int slice = 0; slice < 2; ++slice) {
      mbarrier_init(&bars.dq_full[slice], 4);   // each warp of the slice's warpgroup
      mbarrier_init(&bars.dq_empty[slice], 1);  // the step's dQ writer
    }
    mbarrier_init(&bars.dq_turn, 1);   // order_dq_additions
    mbarrier_init(&bars.dq_added, 8);  // each consumer warp
    mbarrier_init_fence();
  }
  __syncthreads();
  // The warpgroup index through a shuffle, so the compiler knows it is the same in every lane (the
  // consumers' matrix descriptors then stay in uniform registers).
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / 128, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warpgroup == 0) {
    registers_decrease_to<Tile::kProducerRegisters>();
    if (warp == 0 && lane == 0) produce_inputs<Tile>(p, w, shared, bars);
    if constexpr (Tile::kHeadDimSplit) {
      if (warp == 1 && lane == 0 && p.deterministic) order_dq_additions<Tile>(p, w, bars);
    } else {
      if (warp == 1 || warp == 2) write_dq<Tile>(p, w, shared, bars, warp - 1, lane);
    }
  } else {
    registers_increase_to<Tile::kConsumerRegisters>();
    if constexpr (Tile::kHeadDimSplit) {
      consume_head_dim_split<T, Tile>(p, w, shared, bars, warpgroup - 1);
    } else {
      consume<T, Tile>(p, w, shared, bars, warpgroup - 1);
    }
  }
#else
  (void)p;
  __trap();
#endif
}

// dQ = scale * accumulator, rounded to the dtype, back from the slices to rows. One block per
// (query block, head, batch); each thread turns one (tile, thread) group of 4 values into two pairs.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) fa3_backward_convert_dq_kernel(const BackwardParams p) {
  using Tile = BackwardTiling<kHeadDim>;
  const int query_block = blockIdx.x, head = blockIdx.y, b = blockIdx.z;
  const SequenceView seq = sequence_view(p, b);
  const int query_begin = query_block * Tile::kBlockM;
  if (query_begin >= seq.seqlen_q) return;
  const float* tile = p.dq_accum + (static_cast<std::int64_t>(head) * p.dq_rows + fa2::dq_first_row(seq, b) + query_begin) * kHeadDim;
  T* dq = p.dq.as<T>() + p.dq.offset(seq.batch, seq.position_q, query_begin, head);
  for (int index = threadIdx.x; index < Tile::kDqSlices * Tile::kDqSliceFloats / 4; index += blockDim.x) {
    // index = slice * 1024 + n8 tile * 128 + thread (dq_slice_index / 4).
    const int slice = index / 1024, tile_index = index / 128 % 8, thread = index % 128;
    const int lane = thread % 32;
    int row = 16 * (thread / 32) + lane / 4, column = 8 * tile_index + 2 * (lane % 4);
    if (Tile::kDqSplitsColumns) {
      column += 64 * slice;
    } else {
      row += 64 * slice;
    }
    if (column >= p.head_dim) continue;
    const float4 value = *reinterpret_cast<const float4*>(tile + 4 * index);
    if (query_begin + row < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + row * p.dq.row_stride + column) = pack2<T>(value.x * p.scale, value.y * p.scale);
    }
    if (query_begin + row + 8 < seq.seqlen_q) {
      *reinterpret_cast<std::uint32_t*>(dq + (row + 8) * p.dq.row_stride + column) =
          pack2<T>(value.z * p.scale, value.w * p.scale);
    }
  }
}

// Launches the three kernels for one instance (backward_instances/).
template <typename T, int kHeadDim>
void launch_fa3_backward(const BackwardParams& params, cudaStream_t stream);

}  // namespace flashlab::kernels::fa3
