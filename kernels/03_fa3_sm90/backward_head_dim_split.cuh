// The FA3 backward's head-dim-split dataflow (d 256; backward_tiling.hpp), on
// backward_pipeline.cuh's producer: two consumer warpgroups each compute S = Q_i K_j^T and
// dP = dO_i V_j^T for half of the 64 keys (queries as the rows; lines 11-16), write their halves
// of P and dS to shared memory, and then each owns half of the head-dim columns of dV_j += P^T
// dO_i, dK_j += dS^T Q_i and dQ_i = dS K_j (lines 17-21), all operands from shared memory. dQ is
// added from the registers with 16-byte reductions; in deterministic mode producer warp 1 opens
// each query block's turn to them, and they fence and publish a step's sums behind the next step's
// S and dP issue. dK_j (scaled) and dV_j leave through shared memory (line 23).
#pragma once

#include "kernels/03_fa3_sm90/backward_pipeline.cuh"

namespace flashlab::kernels::fa3 {

// The head-dim-split dataflow's deterministic dQ (producer warp 1, lane 0): the consumers add
// their dQ_i from the registers, and this lane orders them like write_dq's tickets. For each step
// of the walk it waits for the key block's turn, opens the step to the consumers (dq_turn), waits
// until all eight consumer warps have added and fenced their sums (dq_added), and passes the turn.
template <class Tile>
__device__ void order_dq_additions(const BackwardParams& p, const KeyBlockWork& w, BackwardBarriers& bars) {
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, step.advance(w)) {
    const DqTurn turn = dq_turn<Tile>(p, w, step);
    wait_for_turn(turn.counter, turn.turn);
    mbarrier_arrive(&bars.dq_turn);
    mbarrier_wait(&bars.dq_added, (w.first_step + it) & 1);
    pass_turn(turn.counter, turn.turn + 1);  // a release: the sums the consumers fenced go before it
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
  const std::int64_t dq_row0 = dq_first_row(w);

  // This thread's dQ sums visible (a release fence at GPU scope waits for its reductions), then
  // its warp's arrival: order_dq_additions passes the turn once all eight warps have arrived.
  auto publish_sums = [&] {
    cuda::ptx::fence(cuda::ptx::sem_release, cuda::ptx::scope_gpu);
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&bars.dq_added);
  };
  if (w.iterations > 0) {
    mbarrier_wait(&bars.k_full, w.kv_loads & 1);
    mbarrier_wait(&bars.v_full, w.kv_loads & 1);
  }
  RingPosition<Tile::kStages> ring = ring_position<Tile::kStages>(w.first_step);
  QueryStep step = first_query_step(p, w);
  for (int it = 0; it < w.iterations; ++it, ring.advance(), step.advance(w)) {
    const int n = w.first_step + it;  // the step in the block's walk: the parities below
    const int query_begin = step.block * kBlockM;
    const std::uint64_t stage = ring.stage * kQStageStep, buffer = (n % 2) * kBufferStep;
    const float* lse = rows + ring.stage * 2 * Tile::kRowsPitch;
    const float* delta = lse + Tile::kRowsPitch;
    mbarrier_wait(&bars.q_full[ring.stage], ring.phase);

    // Lines 11 and 14: S = Q_i K_j^T and dP = dO_i V_j^T, this warpgroup's keys.
    float s[kKeys / 2], dp[kKeys / 2];
    auto issue_scores = [&](float (&d)[kKeys / 2], std::uint64_t rows_a, std::uint64_t keys_b) {
      scores_over_head_dim<T, kKeys, kHeadDim, kBlockM, kBlockN>(d, rows_a + stage, keys_b);
    };
    wgmma_fence();
    issue_scores(s, q_k_major, k_keys);
    issue_scores(dp, do_k_major, v_keys);
    // Deterministic mode: the previous step's sums are fenced and published while S and dP run.
    if (p.deterministic && it > 0) publish_sums();
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
    const std::uint32_t p_tile = p_tile0 + (n % 2) * 2 * Tile::kDsBytes, ds_tile = p_tile + Tile::kDsBytes;
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
    if (p.deterministic) mbarrier_wait(&bars.dq_turn, n & 1);
    float* tile = p.dq_accum + (static_cast<std::int64_t>(step.head) * p.dq_rows + dq_row0 + query_begin) * kHeadDim +
                  kColumns / 64 * group * Tile::kDqSliceFloats;
#pragma unroll
    for (int j = 0; j < kColumns / 8; ++j) {
      red_add_v4_f32(tile + j / 8 * Tile::kDqSliceFloats + dq_slice_index(j % 8, thread, 0),
                     make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
    }
    wgmma_wait<0>();
    fence_registers(dk), fence_registers(dv);
    __syncwarp();  // every lane's reads of the stage come before the release
    if (lane == 0) mbarrier_arrive(&bars.q_empty[ring.stage]);
  }
  if (p.deterministic && w.iterations > 0) publish_sums();  // the last step's
  // Every wgmma reading K_j, V_j is done: the walk's next key block may load its own.
  if (Tile::kPersistent && w.iterations > 0 && lane == 0) mbarrier_arrive(&bars.kv_empty);

  // Line 23: all 64 keys, this warpgroup's columns.
  store_dk_dv_staged<T, Tile, kColumns>(p, w, dk, dv, shared, group, 0, kColumns * group);
}

}  // namespace flashlab::kernels::fa3
