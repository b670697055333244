// The FA3-generation forward kernel (FlashAttention-3, Shah et al. 2024, Algorithm 1 with the
// pipelining of Section 3.2), for sm_90a. Templated on the element type, the padded head dim and
// the steps of Fa3Steps; kernels/03_fa3_sm90/forward_host.cu fills its parameters and
// forward_instances/ instantiates it, one head dim per file.
//
// A block is one producer warpgroup and kConsumerWarpgroups consumer warpgroups (warp
// specialization, Section 3.1). The producer's first thread loads Q once per tile and K, V block
// by block into a kStages ring with TMA; each consumer warpgroup owns 64 query rows and runs the
// FA2 loop on them with wgmma: S = Q K_j^T from shared memory (SS), the online softmax in
// registers (exp2 with the scale folded in, FA4's conditional rescaling), O += P V_j with P
// straight from the S accumulators (RS). setmaxnreg moves registers from the producer to the
// consumers. The steps on top, each switchable:
//   ping_pong: the consumer warpgroups pass a turn around with named barriers, so one issues its
//     GEMMs while the others run their softmax (Section 3.1, "pingpong scheduling");
//   intra_warpgroup_overlap: S_{j+1} = Q K_{j+1}^T and O += P_j V_j are issued together and the
//     softmax of block j + 1 runs while P_j V_j is on the tensor cores (Section 3.2, Algorithm 2);
//   persistent: gridDim.x = the SM count and each block walks tiles, so one tile's epilogue overlaps
//     the next tile's loads: every gridDim.x-th without a mask, the next from a global counter,
//     longest first, with the causal mask (for_each_tile).
// O goes through shared memory (over the warpgroup's own Q rows where there is no room for a
// separate tile) and out with a TMA store, or with plain 16-byte stores for varlen batches,
// whose sequences end inside the tensor; LSE is written from registers.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "kernels/03_fa3_sm90/forward_tiling.hpp"
#include "kernels/03_fa3_sm90/tile_order.hpp"
#include "kernels/attention_api.hpp"
#include "kernels/common/attention_params.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/conversions.cuh"
#include "kernels/common/reductions.cuh"
#include "kernels/common/sm90_sync.cuh"
#include "kernels/common/sm90_tma.cuh"
#include "kernels/common/sm90_wgmma.cuh"

namespace flashlab::kernels::fa3 {

// AttentionParams (the tensors, for O's plain stores and LSE; shapes, mask, scale) and TMA's
// view of Q, K, V and O.
struct ForwardParams : AttentionParams {
  CUtensorMap q_map, k_map, v_map, o_map;  // (column, row, head, batch); varlen: one batch of packed rows
  TileOrder order;         // which tile is the t-th (tile_order.hpp); causal: taken dynamically when persistent
  int tiles;               // order.tiles(): m_blocks * heads_q * batch
  int* tile_counter;       // zeroed before the launch: the dynamic scheduler's next tile - gridDim.x
};

using namespace device;
using namespace sm90;

// Named barriers: 1 + w is consumer warpgroup w's GEMM turn, 4 + w its epilogue.
constexpr int kTurnBarrier = 1, kEpilogueBarrier = 4;


// One tile's sequence (its lengths, where it starts: SequenceView), its key blocks and its mask.
// The tensor maps address a sequence by (row, batch): position_q / position_k and batch.
struct TileWork {
  SequenceView sequence;
  MaskRule mask;
  int row_begin, n_begin, n_end;
  __device__ __forceinline__ bool has_rows() const { return row_begin < sequence.seqlen_q; }
};
template <int kBlockM, int kBlockN>
__device__ __forceinline__ TileWork tile_work(const ForwardParams& p, const TileCoordinates& tile) {
  TileWork w;
  w.sequence = sequence_view(p, tile.batch);
  w.mask = mask_rule(p, w.sequence);
  w.row_begin = tile.m_block * kBlockM;
  w.n_begin = w.n_end = 0;
  if (w.has_rows()) {
    // FA2 Algorithm 1 with masks: only the key blocks some row of the tile can see are visited.
    const int row_last = min(w.row_begin + kBlockM, w.sequence.seqlen_q) - 1;
    const int key_first = w.mask.first_key(w.row_begin), key_last = w.mask.last_key(row_last);
    w.n_begin = key_first / kBlockN;
    w.n_end = key_last > key_first ? (key_last + kBlockN - 1) / kBlockN : w.n_begin;
  }
  return w;
}

struct Barriers;

// The tiles of this block, the same sequence for the producer and the consumers. Not persistent:
// tile blockIdx.x. Persistent without a causal mask: every gridDim.x-th tile (static; neighbouring
// blocks share K and V in L2). Persistent and causal (tiles of unequal work, longest first): every
// block starts at tile blockIdx.x; the producer takes each next tile from a global counter once it
// has issued the loads of the last, and hands it to the consumers through a two-slot ring in
// shared memory; an index >= p.tiles ends the walk.
template <bool kPersistent, bool kProducer, class Body>
__device__ __forceinline__ void for_each_tile(const ForwardParams& p, Barriers& bars, const Body& body);

template <int kHeadDim>
struct SharedLayout {
  using Tile = ForwardTiling<kHeadDim>;
  // Byte offsets from the 1024-byte aligned base: Q, (O), the K ring, the V ring, the barriers.
  static constexpr int kQ = 0;
  static constexpr int kO = Tile::kOAliasesQ ? kQ : Tile::kQBytes;
  static constexpr int kK = kO + Tile::kQBytes;
  static constexpr int kV = kK + Tile::kStages * Tile::kKVStageBytes;
  static constexpr int kBarriers = kV + Tile::kStages * Tile::kKVStageBytes;
};
struct Barriers {
  static constexpr int kMaxGroups = 3, kMaxStages = 4;
  Mbarrier q_full[kMaxGroups], q_empty[kMaxGroups];
  Mbarrier k_full[kMaxStages], k_empty[kMaxStages], v_full[kMaxStages], v_empty[kMaxStages];
  Mbarrier tile_full[2], tile_empty[2];  // the dynamic scheduler's ring of tile indices
  int tile_slot[2];
  float pin[4 * (kMaxGroups + 1)];  // one word per warp: see pin_before_wait
};

template <bool kPersistent, bool kProducer, class Body>
__device__ __forceinline__ void for_each_tile(const ForwardParams& p, Barriers& bars, const Body& body) {
  const bool dynamic = kPersistent && p.order.heaviest_first;
  int walked = 0;
  for (int tile = blockIdx.x; tile < p.tiles; ++walked) {
    body(p.order.coordinates(tile));
    if constexpr (!kPersistent) break;
    if (!dynamic) {
      tile += gridDim.x;
      continue;
    }
    const int slot = walked % 2;
    const std::uint32_t phase = (walked / 2) & 1;
    if constexpr (kProducer) {
      const int next = gridDim.x + atomicAdd(p.tile_counter, 1);
      mbarrier_wait(&bars.tile_empty[slot], phase ^ 1);
      bars.tile_slot[slot] = next;
      mbarrier_arrive(&bars.tile_full[slot]);  // release: the index is visible to the waiters
      tile = next;
    } else {
      mbarrier_wait(&bars.tile_full[slot], phase);
      tile = *static_cast<volatile int*>(&bars.tile_slot[slot]);
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbarrier_arrive(&bars.tile_empty[slot]);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The producer: one thread issues every TMA load (Algorithm 1 lines 4 and 6-7 of FA2, as copies).
template <int kHeadDim, bool kPersistent>
__device__ void produce(const ForwardParams& p, unsigned char* shared, Barriers& bars) {
  using Tile = ForwardTiling<kHeadDim>;
  using Layout = SharedLayout<kHeadDim>;
  constexpr int kQPanel = Tile::kBlockM * 128, kKVPanel = Tile::kBlockN * 128;
  tma_prefetch_map(p.q_map), tma_prefetch_map(p.k_map), tma_prefetch_map(p.v_map);
  RingPosition<Tile::kStages> kv;
  std::uint32_t q_phase = 0;
  for_each_tile<kPersistent, true>(p, bars, [&](const TileCoordinates& tile) {
    const TileWork w = tile_work<Tile::kBlockM, Tile::kBlockN>(p, tile);
    if (w.n_end == w.n_begin) return;  // no rows, or no visible key: nothing to load
    for (int group = 0; group < Tile::kConsumerWarpgroups; ++group) {
      mbarrier_wait(&bars.q_empty[group], q_phase ^ 1);
      mbarrier_arrive_expect_bytes(&bars.q_full[group], Tile::kPanels * 64 * 128);
      for (int panel = 0; panel < Tile::kPanels; ++panel) {
        tma_load(shared + Layout::kQ + panel * kQPanel + group * 64 * 128, p.q_map, panel * 64,
                 static_cast<int>(w.sequence.position_q) + w.row_begin + 64 * group, tile.head,
                 static_cast<int>(w.sequence.batch), &bars.q_full[group]);
      }
    }
    q_phase ^= 1;
    const int kv_head = tile.head / p.group_size;
    for (int n_block = w.n_begin; n_block < w.n_end; ++n_block, kv.advance()) {
      const int key0 = static_cast<int>(w.sequence.position_k) + n_block * Tile::kBlockN;
      const int map_batch = static_cast<int>(w.sequence.batch);
      const int stage_offset = kv.stage * Tile::kKVStageBytes;
      mbarrier_wait(&bars.k_empty[kv.stage], kv.phase ^ 1);
      mbarrier_arrive_expect_bytes(&bars.k_full[kv.stage], Tile::kKVStageBytes);
      for (int panel = 0; panel < Tile::kPanels; ++panel) {
        tma_load(shared + Layout::kK + stage_offset + panel * kKVPanel, p.k_map, panel * 64, key0, kv_head, map_batch,
                 &bars.k_full[kv.stage]);
      }
      mbarrier_wait(&bars.v_empty[kv.stage], kv.phase ^ 1);
      mbarrier_arrive_expect_bytes(&bars.v_full[kv.stage], Tile::kKVStageBytes);
      for (int panel = 0; panel < Tile::kPanels; ++panel) {
        tma_load(shared + Layout::kV + stage_offset + panel * kKVPanel, p.v_map, panel * 64, key0, kv_head, map_batch,
                 &bars.v_full[kv.stage]);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// The consumers: the online softmax of one warpgroup's 64 rows (FA2 Algorithm 1 lines 8-13).

// The per-thread softmax state of its two rows (g and g + 8 of its warp's 16).
struct RowState {
  float max[2];  // running max in log2 units (scale folded in); stale by up to kRescaleThresholdLog2
  float sum[2];  // this thread's share of the running sum (the quad adds them at the end)
};

// 2^x on the FMA pipes instead of the multi-function unit (FA4's idea for Blackwell, measured here
// on Hopper: docs/kernels.md): 2^floor(x) through the exponent bits, 2^fraction by a degree-3
// polynomial (least-squares fit with p(0) = 1; relative error 1.7e-4, under half a bf16 ulp).
// x = -inf gives +0 exactly (clamped to -127: p = 1 and the exponent field underflows to 0).
__device__ __forceinline__ float exp2_on_fma(float x) {
  x = fmaxf(x, -127.f);
  const float whole = floorf(x), fraction = x - whole;
  const float power = fmaf(fmaf(fmaf(0.0763254647f, fraction, 0.228308246f), fraction, 0.695036167f), fraction, 1.f);
  return __int_as_float(__float_as_int(power) + (static_cast<int>(whole) << 23));
}

// Lines 9-10 on one block of scores: mask (only where the block crosses the mask's edge), the
// block's row max, the running max (moved only when the block's exceeds it by more than
// kRescaleThresholdLog2: FA4's conditional rescaling, so P <= 2^kRescaleThresholdLog2 and O and l keep the same stale
// max), P = exp2(s * scale - max) packed as the A operand of P V, the running sums. Returns
// whether some row of this warp moved its max (corrections then hold the factors for O). P stays
// in s in fp32 until pack_a_operand.
// Every kExp2OnFmaEvery-th n8 tile of scores (0: none) takes exp2_on_fma.
// `row0` is the sequence row of this thread's first row (its second is row0 + 8).
template <int kBlockN, int kExp2OnFmaEvery>
__device__ __forceinline__ bool softmax_block(float (&s)[kBlockN / 2], RowState& rows, float (&corrections)[2],
                                              bool mask_block, const MaskRule& mask, int row0, int key0,
                                              float scale_log2, int t) {
  if (mask_block) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const KeyInterval keys = mask.row_keys(row0 + 8 * r);  // each row's keys: two compares per score
#pragma unroll
      for (int i = 0; i < kBlockN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + 8 * i + 2 * t + e;
          if (key < keys.low || key > keys.high) s[4 * i + 2 * r + e] = -INFINITY;
        }
    }
  }
  bool moved = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float partial[kBlockN / 8];
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) partial[i] = fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]);
    float block_max = 0.f;
    if constexpr ((kBlockN / 8 & (kBlockN / 8 - 1)) == 0) {
      block_max = tree_reduce(partial, MaxOp{});
    } else {
      block_max = partial[0];
#pragma unroll
      for (int i = 1; i < kBlockN / 8; ++i) block_max = fmaxf(block_max, partial[i]);
    }
    block_max = quad_reduce(block_max, MaxOp{});
    const float scaled_max = block_max * scale_log2;
    const float new_max = scaled_max > rows.max[r] + kRescaleThresholdLog2 ? scaled_max : rows.max[r];
    const float subtract = new_max == -INFINITY ? 0.f : new_max;  // a row that has seen no key yet
    corrections[r] = exp2f(rows.max[r] - subtract);
    moved = moved || new_max != rows.max[r];
    rows.max[r] = new_max;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float x = fmaf(s[4 * i + 2 * r + e], scale_log2, -subtract);
        bool on_fma = false;
        if constexpr (kExp2OnFmaEvery > 0) on_fma = i % kExp2OnFmaEvery == kExp2OnFmaEvery - 1;
        s[4 * i + 2 * r + e] = on_fma ? exp2_on_fma(x) : exp2f(x);
      }
      sum += s[4 * i + 2 * r] + s[4 * i + 2 * r + 1];
    }
    rows.sum[r] = rows.sum[r] * corrections[r] + sum;
  }
  return __any_sync(kAllLanes, moved);
}

// The 64 rows of a warpgroup in a tile that sees no key at all (a window, or no keys): O = 0 and
// LSE = -inf, written directly (no Q was loaded, so shared memory is not ours to use).
template <typename T, int kHeadDim>
__device__ void write_unseen_rows(const ForwardParams& p, const TileWork& w, int head, int group_row0, int thread) {
  T* o = static_cast<T*>(p.o.data) + w.sequence.o_start + group_row0 * p.o.row_stride + head * p.o.head_stride;
  constexpr int kChunks = kHeadDim / kChunkElements;
  for (int index = thread; index < 64 * kChunks; index += 128) {
    const int row = index / kChunks, column = index % kChunks * kChunkElements;
    if (group_row0 + row < w.sequence.seqlen_q && column < p.head_dim) {
      *reinterpret_cast<uint4*>(o + row * p.o.row_stride + column) = make_uint4(0, 0, 0, 0);
    }
  }
  float* lse = static_cast<float*>(p.lse.data) + w.sequence.lse_start + head * p.lse.head_stride;
  for (int row = thread; row < 64; row += 128) {
    if (group_row0 + row < w.sequence.seqlen_q) lse[(group_row0 + row) * p.lse.row_stride] = -INFINITY;
  }
}

// The compiler may move register-only work across the asm of waits and barriers. Fencing a
// result's registers before such an asm pins the work that produced it before that point: the
// softmax before the wait for P V (or it would not overlap P V), P and the rescaled O before a
// ping-pong turn is taken (or the softmax would run inside the turn).
__device__ __forceinline__ void fence_row_state(RowState& rows, float (&corrections)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    asm volatile("" : "+f"(rows.max[r]), "+f"(rows.sum[r]), "+f"(corrections[r])::"memory");
  }
}

// ptxas hoists wgmma.wait_group above register-only work it does not depend on, which would
// run the softmax after P V has finished instead of beside it. A shared-memory store cannot move
// across the wait, so one predicated store of a value that depends on every exponential (the row
// sums) pins the softmax before it. The word is written, never read. Three consumer warpgroups
// (160 registers each) have no room to hold the finished softmax beside P and O in flight: there the
// third warpgroup's softmax fills the gap instead.
__device__ __forceinline__ void pin_before_wait(Barriers& bars, const RowState& rows, int lane) {
  if (lane == 0) bars.pin[threadIdx.x / 32] = rows.sum[0] + rows.sum[1];
}

template <int kHeadDim>
__device__ __forceinline__ void rescale(float (&o)[kHeadDim / 2], const float (&corrections)[2]) {
#pragma unroll
  for (int i = 0; i < kHeadDim / 8; ++i) {
    o[4 * i + 0] *= corrections[0], o[4 * i + 1] *= corrections[0];
    o[4 * i + 2] *= corrections[1], o[4 * i + 3] *= corrections[1];
  }
}

template <typename T, int kHeadDim, class Steps>
__device__ void consume(const ForwardParams& p, unsigned char* shared, Barriers& bars, int group) {
  using Tile = ForwardTiling<kHeadDim>;
  using Layout = SharedLayout<kHeadDim>;
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kGroups = Tile::kConsumerWarpgroups;
  constexpr bool kPingPong = Steps::kPingPong, kOverlap = Steps::kIntraWarpgroupOverlap;
  constexpr bool kRescaleBeforePv = kHeadDim > 128;
  const int thread = threadIdx.x % 128, warp = thread / 32, lane = thread % 32, g = lane / 4, t = lane % 4;
  const std::uint32_t shared_base = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared));

  // Matrix descriptors of this warpgroup's Q rows and of ring stage 0; the loops add offsets.
  const std::uint64_t q_descriptor = k_major_descriptor(shared_base + Layout::kQ + group * 64 * 128);
  const std::uint64_t k_descriptor = k_major_descriptor(shared_base + Layout::kK);
  const std::uint64_t v_descriptor = mn_major_descriptor(shared_base + Layout::kV, kBlockN * 128);
  constexpr std::uint64_t kStageStep = Tile::kKVStageBytes >> 4;  // descriptor units of 16 bytes

  // Line 8: S = Q K_j^T, kHeadDim / 16 steps of k16 (Q and K K-major, 64-column panels).
  auto issue_s = [&](float (&s)[kBlockN / 2], int stage) {
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      const std::uint64_t a = q_descriptor + ((k / 4 * kBlockM * 128 + k % 4 * 32) >> 4);
      const std::uint64_t b = k_descriptor + stage * kStageStep + ((k / 4 * kBlockN * 128 + k % 4 * 32) >> 4);
      Wgmma<T, kBlockN>::template ss<0>(s, a, b, k > 0);
    }
  };
  // Line 10: O += P V_j, kBlockN / 16 steps of k16 (P in registers, V MN-major).
  auto issue_pv = [&](float (&o)[kHeadDim / 2], const std::uint32_t (&pf)[kBlockN / 16][4], int stage) {
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k) {
      Wgmma<T, kHeadDim>::template rs<1>(o, pf[k], v_descriptor + stage * kStageStep + ((k * 16 * 128) >> 4), 1);
    }
  };
  // Ping-pong: a warpgroup issues GEMMs only in its turn, then hands the turn to the next one.
  auto turn_begin = [&] {
    if constexpr (kPingPong) named_barrier_sync(kTurnBarrier + group, 256);
  };
  // Everything computed for the next GEMMs is done before the turn is taken (see fence_row_state).
  auto ready_for_turn = [&](float (&o)[kHeadDim / 2], std::uint32_t (&pf)[kBlockN / 16][4]) {
    fence_registers(o);
    fence_registers(pf);
  };
  auto turn_end = [&] {
    if constexpr (kPingPong) named_barrier_arrive(kTurnBarrier + (group + 1) % kGroups, 256);
  };
  // A warp is done with a stage once its wgmma reading it completed: lane 0 tells the producer.
  auto release = [&](Mbarrier* barrier) {
    if (lane == 0) mbarrier_arrive(barrier);
  };
  if constexpr (kPingPong) {
    if (group == kGroups - 1) named_barrier_arrive(kTurnBarrier, 256);  // warpgroup 0 goes first
  }

  RingPosition<Tile::kStages> kv;
  std::uint32_t q_phase = 0;
  for_each_tile<Steps::kPersistent, false>(p, bars, [&](const TileCoordinates& tile) {
    const TileWork w = tile_work<kBlockM, kBlockN>(p, tile);
    if (!w.has_rows()) return;
    const int group_row0 = w.row_begin + 64 * group;  // this warpgroup's first row in the sequence
    const int group_row_last = min(group_row0 + 63, w.sequence.seqlen_q - 1);
    const int thread_row0 = group_row0 + 16 * warp + g;  // this thread's rows: thread_row0 and + 8
    RowState rows;
#pragma unroll
    for (int r = 0; r < 2; ++r) rows.max[r] = -INFINITY, rows.sum[r] = 0.f;
    if (w.n_end == w.n_begin) return write_unseen_rows<T, kHeadDim>(p, w, tile.head, group_row0, thread);
    float o[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) o[i] = 0.f;

    {
      mbarrier_wait(&bars.q_full[group], q_phase);
      float s[kBlockN / 2], corrections[2];
      std::uint32_t pf[kBlockN / 16][4];
      auto mask_needed = [&](int n_block) {
        return !w.mask.block_full(group_row0, group_row_last, n_block * kBlockN, (n_block + 1) * kBlockN);
      };
      if constexpr (kOverlap) {
        // Algorithm 2 of FA3: the first S alone, then S_{j+1} with P_j V_j, the softmax of
        // block j + 1 while P_j V_j runs, and the last P V alone.
        mbarrier_wait(&bars.k_full[kv.stage], kv.phase);
        turn_begin();
        wgmma_fence();
        issue_s(s, kv.stage);
        wgmma_commit();
        turn_end();
        wgmma_wait<0>();
        fence_registers(s);
        release(&bars.k_empty[kv.stage]);
        softmax_block<kBlockN, Tile::kExp2OnFmaEvery>(s, rows, corrections, mask_needed(w.n_begin), w.mask, thread_row0,
                                                      w.n_begin * kBlockN, p.scale_log2, t);
        pack_a_operand<T, kBlockN>(s, pf);  // P as the A operand of O += P V
        RingPosition<Tile::kStages> pv = kv;  // the stage of the V that P multiplies next
        kv.advance();
        // Above d 128, O's rescale waits for the next S to be issued and runs beside it (FA3 does
        // the same): the registers of O are then free of work between the wait and the next turn.
        bool rescale_pending = false;
        float pending_corrections[2] = {1.f, 1.f};
        for (int n_block = w.n_begin + 1; n_block < w.n_end; ++n_block) {
          ready_for_turn(o, pf);
          mbarrier_wait(&bars.k_full[kv.stage], kv.phase);
          turn_begin();
          wgmma_fence();
          issue_s(s, kv.stage);
          wgmma_commit();
          if constexpr (kRescaleBeforePv) {
            if (rescale_pending) rescale<kHeadDim>(o, pending_corrections);
          }
          mbarrier_wait(&bars.v_full[pv.stage], pv.phase);
          wgmma_fence();
          issue_pv(o, pf, pv.stage);
          wgmma_commit();
          turn_end();
          wgmma_wait<1>();  // S done; P V may still run
          fence_registers(s);
          release(&bars.k_empty[kv.stage]);
          const bool moved = softmax_block<kBlockN, Tile::kExp2OnFmaEvery>(
              s, rows, kRescaleBeforePv ? pending_corrections : corrections, mask_needed(n_block), w.mask, thread_row0,
              n_block * kBlockN, p.scale_log2, t);
          fence_registers(s);  // the softmax runs here, while P V is on the tensor cores
          fence_row_state(rows, kRescaleBeforePv ? pending_corrections : corrections);
          if constexpr (Tile::kConsumerRegisters >= 240) pin_before_wait(bars, rows, lane);
          wgmma_wait<0>();  // P V done: O may be rescaled, P replaced
          fence_registers(o);
          fence_registers(pf);
          release(&bars.v_empty[pv.stage]);
          if constexpr (kRescaleBeforePv) {
            rescale_pending = moved;  // applied while the next S runs
          } else if (moved) {
            rescale<kHeadDim>(o, corrections);
          }
          pack_a_operand<T, kBlockN>(s, pf);  // P as the A operand of O += P V
          pv = kv;
          kv.advance();
        }
        if constexpr (kRescaleBeforePv) {
          if (rescale_pending) rescale<kHeadDim>(o, pending_corrections);
        }
        ready_for_turn(o, pf);
        mbarrier_wait(&bars.v_full[pv.stage], pv.phase);
        turn_begin();
        wgmma_fence();
        issue_pv(o, pf, pv.stage);
        wgmma_commit();
        turn_end();
        wgmma_wait<0>();
        fence_registers(o);
        fence_registers(pf);
        release(&bars.v_empty[pv.stage]);
      } else {
        // One block at a time: S, softmax, P V, each waiting for the one before.
        for (int n_block = w.n_begin; n_block < w.n_end; ++n_block, kv.advance()) {
          mbarrier_wait(&bars.k_full[kv.stage], kv.phase);
          turn_begin();
          wgmma_fence();
          issue_s(s, kv.stage);
          wgmma_commit();
          turn_end();
          wgmma_wait<0>();
          fence_registers(s);
          release(&bars.k_empty[kv.stage]);
          if (softmax_block<kBlockN, Tile::kExp2OnFmaEvery>(s, rows, corrections, mask_needed(n_block), w.mask,
                                                            thread_row0, n_block * kBlockN, p.scale_log2, t)) {
            rescale<kHeadDim>(o, corrections);
          }
          pack_a_operand<T, kBlockN>(s, pf);  // P as the A operand of O += P V
          ready_for_turn(o, pf);
          mbarrier_wait(&bars.v_full[kv.stage], kv.phase);
          turn_begin();
          wgmma_fence();
          issue_pv(o, pf, kv.stage);
          wgmma_commit();
          turn_end();
          wgmma_wait<0>();
          fence_registers(o);
          fence_registers(pf);
          release(&bars.v_empty[kv.stage]);
        }
      }
      if constexpr (!Tile::kOAliasesQ) release(&bars.q_empty[group]);  // the next tile's Q may land
    }

    // Lines 12-13: O / l and LSE = (max + log2 l) ln 2 (a row that saw no key: O = 0, LSE = -inf).
    float* lse = static_cast<float*>(p.lse.data) + w.sequence.lse_start + tile.head * p.lse.head_stride;
    float inverse[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_reduce(rows.sum[r], SumOp{});
      inverse[r] = sum > 0.f ? 1.f / sum : 0.f;
      const int row = thread_row0 + 8 * r;
      if (t == 0 && row < w.sequence.seqlen_q) {
        lse[row * p.lse.row_stride] = sum > 0.f ? (rows.max[r] + __log2f(sum)) * kLn2Float : -INFINITY;
      }
    }
    // O through shared memory in the TMA box layout: this warpgroup's 64 rows of the O tile.
    unsigned char* o_tile = shared + Layout::kO;
    if (thread == 0 && !Tile::kOAliasesQ) tma_store_wait_read();  // the previous tile's store has read it
    named_barrier_sync(kEpilogueBarrier + group, 128);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int tile_row = 64 * group + 16 * warp + g + 8 * r;
#pragma unroll
      for (int i = 0; i < kHeadDim / 8; ++i) {
        *reinterpret_cast<std::uint32_t*>(o_tile + swizzled_offset(tile_row, 8 * i + 2 * t, kBlockM)) =
            pack2<T>(o[4 * i + 2 * r] * inverse[r], o[4 * i + 2 * r + 1] * inverse[r]);
      }
    }
    if (p.cu_seqlens_q == nullptr) {
      fence_shared_to_async_proxy();
      named_barrier_sync(kEpilogueBarrier + group, 128);
      if (thread == 0) {
        for (int panel = 0; panel < Tile::kPanels; ++panel) {
          tma_store(p.o_map, panel * 64, w.row_begin + 64 * group, tile.head, static_cast<int>(w.sequence.batch),
                    o_tile + panel * kBlockM * 128 + group * 64 * 128);
        }
        tma_store_commit();
        if constexpr (Tile::kOAliasesQ) {
          tma_store_wait_read();
          mbarrier_arrive(&bars.q_empty[group]);
        }
      }
    } else {
      // Varlen: the sequence ends inside the tensor, so the rows past it are not ours to write.
      named_barrier_sync(kEpilogueBarrier + group, 128);
      T* o_global = static_cast<T*>(p.o.data) + w.sequence.o_start + tile.head * p.o.head_stride;
      constexpr int kChunks = kHeadDim / kChunkElements;
      for (int index = thread; index < 64 * kChunks; index += 128) {
        const int row = index / kChunks, column = index % kChunks * kChunkElements;
        if (group_row0 + row < w.sequence.seqlen_q && column < p.head_dim) {
          *reinterpret_cast<uint4*>(o_global + (group_row0 + row) * p.o.row_stride + column) =
              *reinterpret_cast<const uint4*>(o_tile + swizzled_offset(64 * group + row, column, kBlockM));
        }
      }
      if constexpr (Tile::kOAliasesQ) {
        named_barrier_sync(kEpilogueBarrier + group, 128);
        if (thread == 0) mbarrier_arrive(&bars.q_empty[group]);
      }
    }
    q_phase ^= 1;
  });
  if (thread == 0) tma_store_wait_all();  // the block's shared memory must outlive its stores
  if constexpr (kPingPong) {
    if (group == 0) named_barrier_sync(kTurnBarrier, 256);  // the last hand-over, never taken
  }
}

// Steps as types, so each instance is one kernel.
template <bool kPingPongStep, bool kOverlapStep, bool kPersistentStep>
struct Fa3StepSet {
  static constexpr bool kPingPong = kPingPongStep, kIntraWarpgroupOverlap = kOverlapStep, kPersistent = kPersistentStep;
};

template <typename T, int kHeadDim, class Steps>
__global__ void __launch_bounds__(ForwardTiling<kHeadDim>::kThreads, ForwardTiling<kHeadDim>::kMinBlocksPerSm)
    fa3_forward_kernel(const __grid_constant__ ForwardParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  using Tile = ForwardTiling<kHeadDim>;
  using Layout = SharedLayout<kHeadDim>;
  static_assert(Tile::kConsumerWarpgroups <= Barriers::kMaxGroups && Tile::kStages <= Barriers::kMaxStages);
  static_assert(Layout::kBarriers + sizeof(Barriers) + 1024 <= Tile::kSharedBytes, "barriers and alignment fit");
  extern __shared__ unsigned char shared_raw[];
  unsigned char* shared = aligned_shared_base<1024>(shared_raw);
  Barriers& bars = *reinterpret_cast<Barriers*>(shared + Layout::kBarriers);
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int group = 0; group < Tile::kConsumerWarpgroups; ++group) {
      mbarrier_init(&bars.q_full[group], 1);
      mbarrier_init(&bars.q_empty[group], Tile::kOAliasesQ ? 1 : 4);  // the storing thread, or each warp
    }
    for (int slot = 0; slot < 2; ++slot) {
      mbarrier_init(&bars.tile_full[slot], 1);
      mbarrier_init(&bars.tile_empty[slot], 4 * Tile::kConsumerWarpgroups);
    }
    for (int stage = 0; stage < Tile::kStages; ++stage) {
      mbarrier_init(&bars.k_full[stage], 1), mbarrier_init(&bars.v_full[stage], 1);
      mbarrier_init(&bars.k_empty[stage], 4 * Tile::kConsumerWarpgroups);
      mbarrier_init(&bars.v_empty[stage], 4 * Tile::kConsumerWarpgroups);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (warpgroup == 0) {
    registers_decrease_to<Tile::kProducerRegisters>();
    if (threadIdx.x == 0) produce<kHeadDim, Steps::kPersistent>(p, shared, bars);
  } else {
    registers_increase_to<Tile::kConsumerRegisters>();
    consume<T, kHeadDim, Steps>(p, shared, bars, warpgroup - 1);
  }
#else
  (void)p;
  __trap();
#endif
}

// Launches one instance (kernels/03_fa3_sm90/forward_launch.cuh, instantiated in forward_instances/).
template <typename T, int kHeadDim>
void launch_fa3_forward(const ForwardParams& params, const Fa3Steps& steps, cudaStream_t stream);

}  // namespace flashlab::kernels::fa3
