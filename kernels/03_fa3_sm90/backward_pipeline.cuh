// The FA3-generation backward (FlashAttention-3, Shah et al. 2024, Section 3 applied to FA2
// Algorithm 2), for sm_90a: what both of its dataflows share (backward_tiling.hpp). The
// parameters, the block's barriers, which key block a block owns and the query blocks it walks,
// and producer warp 0, which brings every input by TMA: K_j and V_j once (line 6), then for every
// query block i that sees them (every query head of the group) Q_i, dO_i, LSE_i and D_i into a
// kStages ring (lines 8-9). backward_keys_split.cuh and backward_head_dim_split.cuh are the two
// dataflows' consumers and dQ; backward_kernel.cuh the kernels.
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
// The dQ accumulator holds each query block's tile as contiguous 64 x 64 slices (Tile::kDqSlices)
// in the order the consumers hold them (dq_slice_index).
struct BackwardParams : fa2::BackwardParams {
  CUtensorMap q_map, k_map, v_map, do_map;  // (column, row, head, batch); varlen: one batch of packed rows
  CUtensorMap lse_map, delta_map;           // (workspace row, head) of lse_log2 and delta
  TileOrder order;                          // which (key block, KV head, batch) the t-th block takes
};

using namespace device;
using namespace sm90;

// Named barrier 1: both consumer warpgroups have written their half of dS^T (head dim split: of
// P and dS). Named barriers 2 and 3: a deterministic dQ writer has taken an even (odd) step's
// slices (write_dq). Two, because a named barrier counts threads, not warps: with one, a writer's
// arrive and its own next sync would complete it without the other writer.
constexpr int kDsBarrier = 1, kDqWriterBarrier = 2;

// Where value e (0..3) of n8 tile i of thread `thread` of a warpgroup's 64 x 64 dQ slice sits in
// the slice: 16 contiguous bytes per (tile, thread), consecutive threads side by side, so the
// staging stores are conflict-free and a staged slice is one contiguous bulk reduction (head dim
// split: each thread's 16-byte reductions are coalesced).
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

// The deterministic dQ's turn (the FA2 rung's ticket): query block `step` of a query head counts
// its visitors in `counter`, and the key blocks add in decreasing order, so this block's turn is
// the number of key blocks after it that the block's last query sees.
struct DqTurn {
  int* counter;
  int turn;
};
template <class Tile>
__device__ __forceinline__ DqTurn dq_turn(const BackwardParams& p, const KeyBlockWork& w, const QueryStep& step) {
  const int row_last = min(w.sequence.seqlen_q, (step.block + 1) * Tile::kBlockM) - 1;
  return {p.dq_counters + (static_cast<std::int64_t>(w.batch) * p.heads_q + step.head) * p.query_blocks + step.block,
          (w.mask.last_key(row_last) - 1) / Tile::kBlockN - w.key_block};
}

// d = A B^T over the head dim (lines 11 and 14), one commit group: A (kRowsA rows) and B (kRowsB
// rows) K-major in 64-column panels of the 128-byte swizzle; k16 step k at panel k / 4, +32 bytes
// per step inside it.
template <typename T, int N, int kHeadDim, int kRowsA, int kRowsB>
__device__ __forceinline__ void scores_over_head_dim(float (&d)[N / 2], std::uint64_t a, std::uint64_t b) {
#pragma unroll
  for (int k = 0; k < kHeadDim / 16; ++k) {
    const std::uint64_t a_step = (k / 4 * kRowsA * 128 + k % 4 * 32) >> 4, b_step = (k / 4 * kRowsB * 128 + k % 4 * 32) >> 4;
    Wgmma<T, N>::template ss<0>(d, a + a_step, b + b_step, k > 0);
  }
  wgmma_commit();
}

// Line 23: dK_j (times the softmax scale: S = scale Q K^T) and dV_j from a thread's accumulators
// of kColumns columns from column0 (rows key_row0 and key_row0 + 8 of the key block); rows past
// the keys and columns past the head dim are not written.
template <typename T, int kColumns>
__device__ __forceinline__ void store_dk_dv(const BackwardParams& p, const KeyBlockWork& w, const float (&dk)[kColumns / 2],
                                            const float (&dv)[kColumns / 2], int key_row0, int column0, int t) {
  T* dk_out = p.dk.as<T>() + p.dk.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
  T* dv_out = p.dv.as<T>() + p.dv.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = key_row0 + 8 * r;
    if (w.key_begin + row >= w.key_end) continue;
#pragma unroll
    for (int i = 0; i < kColumns / 8; ++i) {
      const int column = column0 + 8 * i + 2 * t;
      if (column >= p.head_dim) continue;
      *reinterpret_cast<std::uint32_t*>(dk_out + row * p.dk.row_stride + column) =
          pack2<T>(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
      *reinterpret_cast<std::uint32_t*>(dv_out + row * p.dv.row_stride + column) =
          pack2<T>(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
    }
  }
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

}  // namespace flashlab::kernels::fa3
