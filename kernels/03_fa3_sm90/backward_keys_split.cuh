// The FA3 backward's keys-split dataflow (d 64 and 128; backward_tiling.hpp), on
// backward_pipeline.cuh's producer:
//   two consumer warpgroups, 64 keys each, on wgmma (lines 11-20), S and dP transposed:
//     S^T = K_j Q_i^T and dP^T = V_j dO_i^T issued together (SS), P^T = exp2(S^T scale log2(e) -
//     LSE) with the mask on boundary blocks only, dS^T = P^T o (dP^T - D) from the fp32 P^T, dS^T
//     to shared memory (stmatrix) for both warpgroups, dV_j += P^T dO_i with P^T from registers
//     (RS), then this warpgroup's dQ slice = dS K_j (SS, dS read MN-major from the transposed
//     tile; at d 128, whose 80-row query blocks are no multiple of wgmma's M, the slice
//     transposed, dQ^T = K_j^T dS^T, from dS stored untransposed by stmatrix .trans) and
//     dK_j += dS^T Q_i (RS), the slice staged for the dQ writer while dK runs;
//   producer warp 1 (and 2 in deterministic mode): dQ: each consumer warpgroup's fp32 slice of
//     dS K_j arrives in shared memory; one lane adds it to the fp32 accumulator in HBM with one
//     bulk reduction (cp.reduce.async.bulk .add.f32), in deterministic mode in key-block order
//     after a ticket, warps 1 and 2 taking the query blocks in turn (line 21's dQ_i += dS K_j).
// dK_j (scaled) and dV_j leave at the end (line 23) through shared memory: over K_j and V_j at
// d 128, over the warpgroup's own rows of dS^T in d 64's persistent walk.
#pragma once

#include "kernels/03_fa3_sm90/backward_pipeline.cuh"

namespace flashlab::kernels::fa3 {

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
  const int writers = p.deterministic ? 2 : 1;  // the kernel runs warps 1 .. writers here
  const std::int64_t dq_row0 = dq_first_row(w);
  const std::uint32_t stage_base = static_cast<std::uint32_t>(__cvta_generic_to_shared(shared + Tile::kDqStage));
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, step.advance(w)) {
    const int n = w.first_step + it;  // the step in the block's walk
    if (n % writers != writer) continue;
    DqTurn turn{nullptr, 0};
    if (p.deterministic && lane == 0) {
      turn = dq_turn<Tile>(p, w, step);
      wait_for_turn(turn.counter, turn.turn);
      fence_proxy_async_global();  // the reductions below come after the sums the turn waited for
    }
    // The slices' barriers are at step n once the other writer has taken step n - 1's (a parity
    // wait cannot tell the two apart).
    if (writers == 2 && n > 0) named_barrier_sync(kDqWriterBarrier + (n - 1) % 2, 64);
    if (lane == 0) {
      float* tile = p.dq_accum + (static_cast<std::int64_t>(step.head) * p.dq_rows + dq_row0 + step.block * kBlockM) * Tile::kHeadDim;
      for (int slice = 0; slice < 2; ++slice) {
        mbarrier_wait(&bars.dq_full[slice], n & 1);
        bulk_reduce_add_f32(tile + slice * Tile::kDqSliceFloats, stage_base + slice * Tile::kDqStageBytes,
                            Tile::kDqStageBytes);
        bulk_commit();
      }
    }
    __syncwarp();
    if (writers == 2) named_barrier_arrive(kDqWriterBarrier + n % 2, 64);  // the last one: finish_dq_writes
    if (lane == 0) {
      bulk_wait_read();  // the staging slices may be rewritten: the consumers go on
      mbarrier_arrive(&bars.dq_empty[0]), mbarrier_arrive(&bars.dq_empty[1]);
      if (p.deterministic) {
        bulk_wait();  // the sums are in memory
        pass_turn(turn.counter, turn.turn + 1);  // a release: the sums go before it
      }
    }
  }
}

// After the walk (`steps` of it): the deterministic writer that would take the next step takes
// the turn the last step handed over, so that no named barrier is left half arrived; then shared
// memory outlives the last reduction's reads.
__device__ __forceinline__ void finish_dq_writes(int steps, int writers, int writer, int lane) {
  if (writers == 2 && steps > 0 && steps % 2 == writer) named_barrier_sync(kDqWriterBarrier + (steps - 1) % 2, 64);
  if (lane == 0) bulk_wait_read();
}

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
  // Transposed, dQ^T = K_j^T dS^T: A = the same panel of K_j, MN-major; B = dS, K-major (queries
  // as rows, keys in 64-column panels), k16 step k at panel k / 4, +32 bytes inside it.
  const int a_panel = Tile::kDqSplitsColumns ? 0 : group, b_panel = Tile::kDqSplitsColumns ? group : 0;
  const std::uint64_t ds_mn_major = mn_major_descriptor(base + Tile::kDs + a_panel * kBlockN * 128, kBlockN * 128);
  const std::uint64_t ds_k_major = k_major_descriptor(base + Tile::kDs);
  const std::uint64_t k_mn_major = mn_major_descriptor(base + Tile::kK + b_panel * kBlockN * 128, kBlockN * 128);
  constexpr std::uint64_t kQStageStep = Tile::kQBytes >> 4, kDsBufferStep = Tile::kDsBytes >> 4;
  // S^T and dP^T are issued together and P^T stays in fp32 until dS^T. dV is issued once dS^T is
  // stored, so that no wgmma reads its A operand from the registers while the dS^T arithmetic runs
  // (docs/fa3_backward_log.md, "dV after dS^T at d 64"); at 80 rows the packed P^T would not fit beside
  // the fp32 one. With 64 query rows dV is issued between the exponentials and dS^T.
  constexpr bool kDvAfterDs = kBlockM != 64;
  // With 80 rows the LSE_i of a thread's 20 query columns do not fit beside both scores in flight:
  // each lane holds LSE of queries lane, lane + 32 and lane + 64, and the exponentials fetch
  // theirs by shuffle. With 128 rows (d 64) four such loads a lane (queries lane + 32 j) replace
  // the sixteen 8-byte loads of a thread's 32 query columns, which held up the scores' issue.
  constexpr bool kLseByShuffle = kBlockM == 80 || kBlockM == 128;
  constexpr int kLaneRows = Tile::kRowsPitch / 32;

  float dk[kHeadDim / 2], dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) dk[i] = dv[i] = 0.f;

  // stmatrix's row addresses in the dS^T tile: lanes 8j .. 8j + 7 give the rows of 8 x 8 matrix j
  // of a k16 step (keys + 8 (j % 2), queries + 8 (j / 2): the register order of an A fragment).
  // Transposed (.trans) into the dS tile, matrix j's rows are its queries and its columns its keys.
  const int ds_row = Tile::kDqTransposed ? lane % 8 + 8 * (lane / 16) : 64 * group + 16 * warp + lane % 8 + 8 * (lane / 8 % 2);
  const int ds_column = Tile::kDqTransposed ? 64 * group + 16 * warp + 8 * (lane / 8 % 2) : 8 * (lane / 16);
  const std::uint32_t ds_tile0 = base + Tile::kDs;

  // K_j, and V_j too in a walk; the block start waits for V_j after S^T's issue, as the producer
  // sends it after the first Q_i (BackwardTiling::kBlockStart).
  if (w.iterations > 0) {
    mbarrier_wait(&bars.k_full, w.kv_loads & 1);
    if constexpr (!Tile::kBlockStart) mbarrier_wait(&bars.v_full, w.kv_loads & 1);
  }
  RingPosition<Tile::kStages> ring = ring_position<Tile::kStages>(w.first_step);
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, ring.advance(), step.advance(w)) {
    const int n = w.first_step + it;  // the step in the block's walk: the parities below
    const int query_begin = step.block * kBlockM;
    const std::uint64_t stage = ring.stage * kQStageStep;
    const float* lse = rows + ring.stage * 2 * Tile::kRowsPitch;
    const float* delta = lse + Tile::kRowsPitch;
    mbarrier_wait(&bars.q_full[ring.stage], ring.phase);

    // LSE_i of this thread's query columns (or of the lane's queries), read before the scores are
    // issued: behind their operand reads a shared-memory load waits longer than the scores take.
    float2 lse_i[kLseByShuffle ? 1 : kBlockM / 8];
    float lse_lane[kLseByShuffle ? kLaneRows : 1];
    if constexpr (kLseByShuffle) {
#pragma unroll
      for (int j = 0; j < kLaneRows; ++j) lse_lane[j] = lse[32 * j + lane];  // within kRowsPitch
    } else {
#pragma unroll
      for (int i = 0; i < kBlockM / 8; ++i) lse_i[i] = *reinterpret_cast<const float2*>(lse + 8 * i + 2 * t);
    }

    // Lines 11 and 14: S^T = K_j Q_i^T and dP^T = V_j dO_i^T.
    float s[kBlockM / 2], dp[kBlockM / 2];
    auto issue_scores = [&](float (&d)[kBlockM / 2], std::uint64_t rows_a, std::uint64_t columns_b) {
      scores_over_head_dim<T, kBlockM, kHeadDim, kBlockN, kBlockM>(d, rows_a, columns_b + stage);
    };
    wgmma_fence();
    issue_scores(s, k_rows, q_k_major);
    if constexpr (Tile::kBlockStart) {
      if (it == 0) mbarrier_wait(&bars.v_full, w.kv_loads & 1);
      wgmma_fence();  // unconditional: around a branch ptxas would fence the in-flight S^T itself (C7519)
    }
    issue_scores(dp, v_rows, do_k_major);
    wgmma_wait<1>();  // S^T done; dP^T may still run
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
      float2 row_lse;
      if constexpr (kLseByShuffle) {  // queries 8 i + 2 t and + 1: lanes 8 (i % 4) + 2 t and + 1, register i / 4
        row_lse.x = __shfl_sync(0xffffffffu, lse_lane[i / 4], 8 * (i % 4) + 2 * t);
        row_lse.y = __shfl_sync(0xffffffffu, lse_lane[i / 4], 8 * (i % 4) + 2 * t + 1);
      } else {
        row_lse = lse_i[i];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        s[4 * i + 2 * r] = exp2f(fmaf(s[4 * i + 2 * r], p.scale_log2, -row_lse.x));
        s[4 * i + 2 * r + 1] = exp2f(fmaf(s[4 * i + 2 * r + 1], p.scale_log2, -row_lse.y));
      }
    }
    std::uint32_t pf[kBlockM / 16][4];
    // Line 12: dV_j += P^T dO_i.
    auto issue_dv = [&] {
      pack_a_operand<T, kBlockM>(s, pf);
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < kBlockM / 16; ++k) {
        Wgmma<T, kHeadDim>::template rs<1>(dv, pf[k], do_mn_major + stage + ((k * 16 * 128) >> 4), 1);
      }
      wgmma_commit();
    };
    if constexpr (!kDvAfterDs) issue_dv();
    // D_i, read while dP^T finishes.
    float2 delta_i[kBlockM / 8];
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) delta_i[i] = *reinterpret_cast<const float2*>(delta + 8 * i + 2 * t);
    if constexpr (kDvAfterDs) {
      wgmma_wait<0>();  // dP^T done
    } else {
      wgmma_wait<1>();  // dP^T done; dV may still run
    }
    fence_registers(dp);

    // Line 16: dS^T = P^T o (dP^T - D).
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        dp[4 * i + 2 * r] = s[4 * i + 2 * r] * (dp[4 * i + 2 * r] - delta_i[i].x);
        dp[4 * i + 2 * r + 1] = s[4 * i + 2 * r + 1] * (dp[4 * i + 2 * r + 1] - delta_i[i].y);
      }
    }
    std::uint32_t dsf[kBlockM / 16][4];
    pack_a_operand<T, kBlockM>(dp, dsf);
    // dS^T to shared memory (buffer n % 2) in the TMA box layout, keys as rows, query panels (dQ
    // transposed: dS, queries as rows, key panels): one stmatrix per k16 step.
    const std::uint32_t ds_tile = ds_tile0 + (n % 2) * Tile::kDsBytes;
#pragma unroll
    for (int k = 0; k < kBlockM / 16; ++k) {
      if constexpr (Tile::kDqTransposed) {
        stmatrix_x4_trans(ds_tile + swizzled_offset(16 * k + ds_row, ds_column, kBlockM), dsf[k][0], dsf[k][1], dsf[k][2],
                          dsf[k][3]);
      } else {
        stmatrix_x4(ds_tile + swizzled_offset(ds_row, 16 * k + ds_column, kBlockN), dsf[k][0], dsf[k][1], dsf[k][2], dsf[k][3]);
      }
    }
    if constexpr (kDvAfterDs) issue_dv();

    // Line 20: this warpgroup's dQ slice = dS K_j, once both halves of dS^T are in; issued before
    // line 18's dK_j += dS^T Q_i so that the slice is staged while dK runs.
    fence_shared_to_async_proxy();
    named_barrier_sync(kDsBarrier, 256);
    constexpr int kDqValues = Tile::kDqSliceFloats / 128;  // per thread
    float dq[kDqValues];
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kBlockN / 16; ++k) {
      const std::uint64_t step16 = (k * 16 * 128) >> 4;
      if constexpr (Tile::kDqTransposed) {
        const std::uint64_t ds_step = (k / 4 * kBlockM * 128 + k % 4 * 32) >> 4;
        Wgmma<T, kBlockM>::template ss<0, 1>(dq, k_mn_major + step16, ds_k_major + (n % 2) * kDsBufferStep + ds_step, k > 0);
      } else {
        Wgmma<T, 64>::template ss<1, 1>(dq, ds_mn_major + (n % 2) * kDsBufferStep + step16, k_mn_major + step16, k > 0);
      }
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
    mbarrier_wait(&bars.dq_empty[group], (n & 1) ^ 1);
    float* staged = reinterpret_cast<float*>(shared + Tile::kDqStage + group * Tile::kDqStageBytes);
#pragma unroll
    for (int i = 0; i < kDqValues / 4; ++i) {
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
  // Every wgmma reading K_j, V_j is done: the walk's next key block may load its own.
  if (Tile::kPersistent && w.iterations > 0 && lane == 0) mbarrier_arrive(&bars.kv_empty);

  // Line 23 through shared memory. d 64's persistent walk, whose next K_j and V_j may be loading,
  // stages over this warpgroup's own rows of dS^T buffer 0 with the dS^T stores: dK_j (scaled) as
  // query panel 0, dV_j as panel 1. The other warpgroup reads those rows only after the next
  // step's dS^T barrier; this one writes them again only once all its threads have read them.
  if constexpr (Tile::kPersistent) {
    static_assert(kHeadDim * kElementBytes == 128 && 2 * kHeadDim <= kBlockM,
                  "a row of dK_j (dV_j) is a 128-byte row of one query panel of dS^T");
    named_barrier_sync(kDsBarrier, 256);  // no wgmma reads dS^T any more
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) dk[i] *= p.scale;
    std::uint32_t dkf[kHeadDim / 16][4], dvf[kHeadDim / 16][4];
    pack_a_operand<T, kHeadDim>(dk, dkf), pack_a_operand<T, kHeadDim>(dv, dvf);
#pragma unroll
    for (int k = 0; k < kHeadDim / 16; ++k) {
      stmatrix_x4(ds_tile0 + swizzled_offset(ds_row, 16 * k + ds_column, kBlockN), dkf[k][0], dkf[k][1], dkf[k][2], dkf[k][3]);
      stmatrix_x4(ds_tile0 + swizzled_offset(ds_row, kHeadDim + 16 * k + ds_column, kBlockN), dvf[k][0], dvf[k][1], dvf[k][2],
                  dvf[k][3]);
    }
    const unsigned char* staged_dk = shared + Tile::kDs + 64 * group * 128;  // this warpgroup's 64 rows of panel 0
    write_staged_dk_dv<T, kHeadDim>(p, w, staged_dk, staged_dk + kBlockN * 128, group, 64 * group, 0);
    named_barrier_sync(kStagedEpilogueBarrier + group, 128);
  } else {
    store_dk_dv_staged<T, Tile, kHeadDim>(p, w, dk, dv, shared, group, 64 * group, 0);
  }
}

}  // namespace flashlab::kernels::fa3
