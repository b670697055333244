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
// The dQ accumulator holds each query block's tile as contiguous slices of 64 columns or 64 rows
// (Tile::kDqSlices of Tile::kDqSliceFloats) in the order the consumers hold them (dq_slice_index).
struct BackwardParams : fa2::BackwardParams {
  CUtensorMap q_map, k_map, v_map, do_map;  // (column, row, head, batch); varlen: one batch of packed rows
  CUtensorMap lse_map, delta_map;           // (workspace row, head) of lse_log2 and delta
  TileOrder order;                          // which (key block, KV head, batch) the t-th tile is
  int* tile_counter;                        // the persistent walk's draws (walk_ahead), zero at launch
};

using namespace device;
using namespace sm90;

// Named barrier 1: both consumer warpgroups have written their half of dS^T (head dim split: of
// P and dS). Named barriers 2 and 3: a deterministic dQ writer has taken an even (odd) step's
// slices (write_dq). Two, because a named barrier counts threads, not warps: with one, a writer's
// arrive and its own next sync would complete it without the other writer. Named barriers 4 and
// 5: warpgroup 0's (1's) dK_j and dV_j are staged (write_staged_dk_dv).
constexpr int kDsBarrier = 1, kDqWriterBarrier = 2, kStagedEpilogueBarrier = 4;

// Where value e (0..3) of n8 tile i of thread `thread` of a warpgroup's dQ slice accumulator sits
// in the slice: 16 contiguous bytes per (tile, thread), consecutive threads side by side, so the
// staging stores are conflict-free and a staged slice is one contiguous bulk reduction (head dim
// split: each thread's 16-byte reductions are coalesced).
__host__ __device__ constexpr int dq_slice_index(int tile, int thread, int e) { return (tile * 128 + thread) * 4 + e; }

// The walk's published key blocks (walk_key_blocks): a ring of kWalkSlots.
constexpr int kWalkSlots = 2;

struct BackwardBarriers {
  static constexpr int kMaxStages = 2;
  Mbarrier walk_full[kWalkSlots], walk_empty[kWalkSlots];  // a key block published; every reader done with it
  Mbarrier walk_draw;  // the producer has issued a key block's loads: the walker may draw the next
  Mbarrier k_full, v_full, kv_empty;  // K_j in, V_j in; the consumers done with them (the next key block's may load)
  Mbarrier q_full[kMaxStages], q_empty[kMaxStages];
  Mbarrier dq_full[2], dq_empty[2];  // keys split: the staged slices
  Mbarrier dq_turn, dq_added;        // head dim split, deterministic mode: the consumers' turn to add dQ_i, and their sums added
};

// The query blocks a key block visits (FA2 Algorithm 2 with masks: only the queries that see
// some key of the block), the same for the producer, the dQ writer and the consumers, and where
// the key block sits in its block's walk: the steps (query blocks) and K/V loads before it, which
// give the ring position and the parities of the per-step and K/V barriers.
struct KeyBlockWork {
  struct Sequence {  // what the kernel reads of the key block's SequenceView
    int seqlen_q, seqlen_k;
    std::int64_t first_row_q, position_q, position_k, batch;
  } sequence;
  MaskRule mask;
  int key_block, head_kv, batch;
  int key_begin, key_end;       // key_end: min(key_begin + kBlockN, seqlen_k)
  int block_first, block_last;  // query blocks [block_first, block_last) of each query head
  int iterations;               // (block_last - block_first) * group_size
  int first_step;               // the block's steps before this key block's first
  int kv_loads;                 // the block's key blocks before this one that loaded K and V
  int end;                      // 1: the walk is over (no key block)
  __device__ __forceinline__ bool past_sequence() const { return key_begin >= sequence.seqlen_k; }  // varlen
};
// Key block `tile` of the order, written field by field where the walk publishes it.
template <class Tile>
__device__ __forceinline__ void write_key_block_work(const BackwardParams& p, int tile, int first_step, int kv_loads,
                                                     KeyBlockWork& w) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN;
  const TileCoordinates position = p.order.coordinates(tile);
  w.key_block = position.m_block, w.head_kv = position.head, w.batch = position.batch;
  w.first_step = first_step, w.kv_loads = kv_loads, w.end = 0;
  const SequenceView sequence = sequence_view(p, w.batch);
  w.sequence = {sequence.seqlen_q, sequence.seqlen_k, sequence.first_row_q, sequence.position_q, sequence.position_k,
                sequence.batch};
  w.mask = mask_rule(p, sequence);
  w.key_begin = w.key_block * kBlockN;
  w.key_end = min(w.key_begin + kBlockN, w.sequence.seqlen_k);
  w.block_first = w.block_last = w.iterations = 0;
  if (w.key_begin < w.sequence.seqlen_k) {
    const IndexRange queries = w.mask.visible_queries(w.key_begin, w.key_end);
    w.block_first = queries.first / kBlockM;
    w.block_last = queries.last > queries.first ? (queries.last - 1) / kBlockM + 1 : w.block_first;
    w.iterations = (w.block_last - w.block_first) * p.group_size;
  }
}
// The walk, where the tiling is persistent (BackwardTiling::kPersistent: d 64, whose key blocks
// walk the fewest query blocks, so that their start-up weighs most): block b takes key blocks
// (tiles) of the backward's tile order (tile_order.hpp, heaviest first) one after another, so
// that one key block's last steps
// and dK_j, dV_j stores overlap the loads of the next one's Q_i and dO_i, and the grid's tail is
// one key block per block instead of a wave of block launches. Its first is tile b; each next one
// is drawn from a counter (tile_counter, zeroed per launch) once a slot is free, so that a block
// takes the next tile when it is about to need it: under a mask the key blocks' walks range from
// one query block to all of them, and a fixed stride would deal them out blind to that. One lane,
// the walker (producer warp 3, idle otherwise), works out each key block's KeyBlockWork and
// publishes it in a ring of kWalkSlots in shared memory, one key block ahead of the consumers;
// every role reads it from there.
template <class Tile>
__device__ void walk_ahead(const BackwardParams& p, KeyBlockWork* slots, BackwardBarriers& bars) {
  int first_step = 0, kv_loads = 0;
  for (int k = 0;; ++k) {
    const int slot = k % kWalkSlots;
    // The next tile is drawn once the producer has issued the previous key block's loads, so that
    // the block holds at most kStages steps of work when it draws: drawn a whole key block ahead,
    // the tiles at the end of a masked order would wait behind a busy block while others idle.
    if (k > 0) mbarrier_wait(&bars.walk_draw, (k - 1) & 1);
    if (k >= kWalkSlots) mbarrier_wait(&bars.walk_empty[slot], (k / kWalkSlots - 1) & 1);
    const int tile = k == 0 ? static_cast<int>(blockIdx.x) : static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
    if (tile >= p.order.tiles()) {
      slots[slot].end = 1;
      mbarrier_arrive(&bars.walk_full[slot]);
      return;
    }
    KeyBlockWork& w = slots[slot];
    write_key_block_work<Tile>(p, tile, first_step, kv_loads, w);
    mbarrier_arrive(&bars.walk_full[slot]);  // release: the readers' wait sees the slot
    const int iterations = w.iterations;
    first_step += iterations, kv_loads += iterations > 0;
  }
}
// Every key block of the walk in order: body(w). The calling warp's `lanes` read the slot, and
// each of them releases it (one arrival per reading lane, so that every read is ordered before
// the walker's next write by the lane's own release). kCopy: w is a copy (the consumers), else
// the slot itself (the producer warpgroup, whose 24 registers would not hold a copy).
// The warp's position on the walk stays in shared memory (`walked`, one int per warp), at an
// address the compiler can prove the same in every lane (the warp index through a shuffle): the
// slot's address, and every field read from it, are then uniform, and the consumers keep their
// copy, the ring stage and the matrix descriptors in uniform registers. Read from a per-lane
// address, they would be built in vector registers and moved to uniform ones before every wgmma
// (docs/kernels.md, "Persistent blocks").
// `passed`, where given: the first lane arrives on it once past each key block (the producer's
// walk_draw).
template <bool kCopy = false, class Body>
__device__ __forceinline__ void walk_key_blocks(KeyBlockWork* slots, BackwardBarriers& bars, unsigned lanes, Body&& body,
                                                Mbarrier* passed = nullptr) {
  const bool first_lane = __ffs(lanes) - 1 == static_cast<int>(threadIdx.x % 32);
  const int warp = __shfl_sync(lanes, static_cast<int>(threadIdx.x / 32), __ffs(lanes) - 1);
  int* walked = reinterpret_cast<int*>(slots + kWalkSlots) + warp;
  if (first_lane) *walked = 0;
  __syncwarp(lanes);
  for (;;) {
    const int k = *walked, slot = k % kWalkSlots;
    mbarrier_wait(&bars.walk_full[slot], (k / kWalkSlots) & 1);
    if (slots[slot].end) break;
    if (!slots[slot].past_sequence()) {
      if constexpr (kCopy) {
        const KeyBlockWork w = slots[slot];
        body(w);
      } else {
        body(slots[slot]);
      }
    }
    if (passed != nullptr && first_lane) mbarrier_arrive(passed);
    const int done = *walked;  // k read again: nothing of the walk stays in registers across the body
    mbarrier_arrive(&bars.walk_empty[done % kWalkSlots]);
    __syncwarp(lanes);  // every lane has read `walked`
    if (first_lane) *walked = done + 1;
    __syncwarp(lanes);
  }
}
// The block's key blocks, body(w) for each: the walk where the tiling is persistent, else the
// one key block of the block (tile blockIdx.x): worked out in registers by the consumers (kCopy),
// whose loops then fold its zero first step, and read from slot 0, which the kernel writes before
// its first __syncthreads, by the producer warpgroup's roles (their 24 registers would spill it).
template <class Tile, bool kCopy = false, class Body>
__device__ __forceinline__ void for_each_key_block(const BackwardParams& p, KeyBlockWork* slots, BackwardBarriers& bars,
                                                   unsigned lanes, Body&& body, Mbarrier* passed = nullptr) {
  if constexpr (Tile::kPersistent) {
    walk_key_blocks<kCopy>(slots, bars, lanes, body, passed);
  } else if constexpr (kCopy) {
    KeyBlockWork w;
    write_key_block_work<Tile>(p, static_cast<int>(blockIdx.x), 0, 0, w);
    if (!w.past_sequence()) body(w);
  } else if (!slots[0].past_sequence()) {
    body(slots[0]);
  }
}
// The ring position of the block's step `step`.
template <int kStages>
__device__ __forceinline__ RingPosition<kStages> ring_position(int step) {
  return {step % kStages, static_cast<std::uint32_t>(step / kStages) & 1u};
}
// The key block's sequence's first row in the dQ accumulator.
__device__ __forceinline__ std::int64_t dq_first_row(const KeyBlockWork& w) {
  return fa2::dq_first_row(w.sequence.first_row_q, w.batch);
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

// Byte `byte` of 16-byte chunk `chunk` of staged row `row` (rows of kRowBytes from `tile`): chunk
// c at chunk c ^ (row % 8), so that both the staging stores (8 rows of one chunk per warp) and
// the reads of write_staged_dk_dv (a row's chunks) hit 32 banks.
template <int kRowBytes, typename Byte>
__device__ __forceinline__ Byte* staged_chunk(Byte* tile, int row, int chunk, int byte = 0) {
  return tile + row * kRowBytes + (chunk ^ (row % 8)) * 16 + byte;
}

// Line 23, from shared memory: a warpgroup's staged dK_j (times the softmax scale: S = scale Q K^T)
// and dV_j, 64 key rows (row_base ..) of kColumns columns (column0 ..) each, T, a row's 16-byte
// chunks placed by staged_chunk, written to memory a row's chunks by consecutive threads
// once the whole warpgroup has staged them; rows past the keys and columns past the head dim are
// not written. The trip through shared memory costs less than the accumulators' 4-byte stores
// straight to memory (docs/fa3_backward_log.md, "dK and dV through shared memory").
template <typename T, int kColumns>
__device__ __forceinline__ void write_staged_dk_dv(const BackwardParams& p, const KeyBlockWork& w, const unsigned char* staged_dk,
                                                   const unsigned char* staged_dv, int group, int row_base, int column0) {
  constexpr int kChunks = kColumns / 8, kRowBytes = kColumns * kElementBytes, kRowsPerPass = 128 / kChunks;
  named_barrier_sync(kStagedEpilogueBarrier + group, 128);
  T* dk_out = p.dk.as<T>() + p.dk.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
  T* dv_out = p.dv.as<T>() + p.dv.offset(w.sequence.batch, w.sequence.position_k, w.key_begin, w.head_kv);
  const int thread = threadIdx.x % 128, chunk = thread % kChunks, column = column0 + 8 * chunk;
#pragma unroll
  for (int pass = 0; pass < 64 / kRowsPerPass; ++pass) {
    const int row = kRowsPerPass * pass + thread / kChunks, key = row_base + row;
    if (w.key_begin + key >= w.key_end || column >= p.head_dim) continue;
    *reinterpret_cast<uint4*>(dk_out + key * p.dk.row_stride + column) =
        *reinterpret_cast<const uint4*>(staged_chunk<kRowBytes>(staged_dk, row, chunk));
    *reinterpret_cast<uint4*>(dv_out + key * p.dv.row_stride + column) =
        *reinterpret_cast<const uint4*>(staged_chunk<kRowBytes>(staged_dv, row, chunk));
  }
}

// Line 23 in a block that walks one key block: a warpgroup's dK_j and dV_j (its accumulators: a
// thread's rows 16 warp + g and + 8, columns 8 i + 2 t and + 1) staged with 4-byte stores once
// both warpgroups are here (so no wgmma reads K_j or V_j any more, and none will load over them):
// warpgroup 0's over K_j, 1's over V_j; then written by write_staged_dk_dv. (d 64's persistent
// walk, whose next K_j and V_j may be loading, stages over dS^T instead: backward_keys_split.cuh.)
template <typename T, class Tile, int kColumns>
__device__ __forceinline__ void store_dk_dv_staged(const BackwardParams& p, const KeyBlockWork& w, const float (&dk)[kColumns / 2],
                                                   const float (&dv)[kColumns / 2], unsigned char* shared, int group,
                                                   int row_base, int column0) {
  constexpr int kChunks = kColumns / 8, kRowBytes = kColumns * kElementBytes, kTensorBytes = 64 * kRowBytes;
  static_assert(!Tile::kPersistent && 2 * kTensorBytes == Tile::kKVBytes && Tile::kV == Tile::kK + Tile::kKVBytes,
                "a warpgroup's dK_j and dV_j fit one of K_j and V_j, which no next key block loads over");
  named_barrier_sync(kDsBarrier, 256);
  unsigned char* staged_dk = shared + Tile::kK + group * Tile::kKVBytes;
  unsigned char* staged_dv = staged_dk + kTensorBytes;
  const int thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 16 * warp + g + 8 * r;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {  // n8 tile i: this thread's columns 8 i + 2 t and + 1
      *reinterpret_cast<std::uint32_t*>(staged_chunk<kRowBytes>(staged_dk, row, i, 4 * t)) =
          pack2<T>(dk[4 * i + 2 * r] * p.scale, dk[4 * i + 2 * r + 1] * p.scale);
      *reinterpret_cast<std::uint32_t*>(staged_chunk<kRowBytes>(staged_dv, row, i, 4 * t)) =
          pack2<T>(dv[4 * i + 2 * r], dv[4 * i + 2 * r + 1]);
    }
  }
  write_staged_dk_dv<T, kColumns>(p, w, staged_dk, staged_dv, group, row_base, column0);
}

// ---------------------------------------------------------------------------------------------
// Producer warp 0, lane 0: every TMA copy, of the key block's steps [first, last) (a block that
// walks one key block issues its first step, and K_j and V_j, before its first __syncthreads).
template <class Tile>
__device__ void produce_inputs(const BackwardParams& p, const KeyBlockWork& w, unsigned char* shared,
                               BackwardBarriers& bars, int first = 0, int last = 1 << 30) {
  constexpr int kBlockM = Tile::kBlockM;
  const int map_batch = static_cast<int>(w.sequence.batch), head_kv = w.head_kv;
  const int key0 = static_cast<int>(w.sequence.position_k) + w.key_begin;
  // K_j, then V_j, each on its own barrier (a key block no query sees loads nothing), once the
  // consumers are done with the previous key block's. The block start (Tile::kBlockStart) sends K_j
  // before the first Q_i and V_j after it, so that the first scores S^T = K_j Q_i^T wait for those
  // two only (FlashAttention-4's order); the walk sends both after the first Q_i and dO_i, which
  // may load while the previous key block's last step runs.
  auto load_panels = [&](int tile, const CUtensorMap& map, Mbarrier* full) {
    mbarrier_arrive_expect_bytes(full, Tile::kKVBytes);
    for (int panel = 0; panel < Tile::kPanels; ++panel)
      tma_load(shared + tile + panel * Tile::kBlockN * 128, map, panel * 64, key0, head_kv, map_batch, full);
  };
  auto load_keys = [&] {
    if (w.kv_loads > 0) mbarrier_wait(&bars.kv_empty, (w.kv_loads - 1) & 1);
    load_panels(Tile::kK, p.k_map, &bars.k_full);
  };
  if (Tile::kBlockStart && first == 0 && w.iterations > 0) load_keys();
  float* rows = reinterpret_cast<float*>(shared + Tile::kRows);
  RingPosition<Tile::kStages> ring = ring_position<Tile::kStages>(w.first_step);
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < min(w.iterations, last); ++it, ring.advance(), step.advance(w)) {
    if (it < first) continue;
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
    float* stage_rows = rows + ring.stage * 2 * Tile::kRowsPitch;
    // The preprocess writes LSE and D: the key block's first rows wait for its end (its first Q_i
    // and dO_i, and at the block start K_j, are on their way meanwhile).
    if (it == 0) device::wait_for_previous_grid();
    tma_load_rows(stage_rows, p.lse_map, workspace_row, step.head, full);
    tma_load_rows(stage_rows + Tile::kRowsPitch, p.delta_map, workspace_row, step.head, full);
    if (it == 0) {
      if constexpr (!Tile::kBlockStart) load_keys();
      load_panels(Tile::kV, p.v_map, &bars.v_full);
    }
  }
}

}  // namespace flashlab::kernels::fa3
