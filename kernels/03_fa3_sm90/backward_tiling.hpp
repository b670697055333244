// The FA3 rung's backward tiling: plain C++ (no CUDA), read by the kernel, its launcher and the
// exported tile list (kernels/tilings.hpp).
//
// One block owns kBlockN keys of one KV head (FA2 Algorithm 2 line 6: K_j, V_j stay in shared
// memory, dK_j, dV_j in registers) and walks the query blocks of kBlockM rows that see them, for
// every query head of the group, with two consumer warpgroups. Two dataflows:
// - d 64 and 128, keys split: kBlockN = 128, each warpgroup owns 64 keys and all head-dim columns
//   of their dK and dV. It computes S^T = K_j Q_i^T and dP^T = V_j dO_i^T (keys as the rows of the
//   wgmma tile, so P^T and dS^T are already the register A operands of dV += P^T dO and
//   dK += dS^T Q). dQ_i = dS K_j is split in two 64 x 64 slices, one per warpgroup: along the
//   head dim when kBlockM = 64 (d 128), along the rows when kBlockM = 128 (d 64).
// - d 256, head dim split: 64 keys x 256 columns of dK and dV are 256 fp32 registers per thread
//   of one warpgroup, so each warpgroup owns 128 columns of dK, dV and dQ for all 64 keys instead.
//   Both then need all of P and dS: each computes S = Q_i K_j^T and dP = dO_i V_j^T for 32 of the
//   keys (queries as rows), and P and dS go through shared memory, the A operands of
//   dV += P^T dO, dK += dS^T Q and dQ = dS K for both. dQ is added from the registers with
//   16-byte reductions: its staging would not fit beside two stages of Q_i and dO_i.
#pragma once

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa3 {

template <int kHeadDim_>
struct BackwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "padded head dims 64, 128 and 256");
  static constexpr bool kHeadDimSplit = kHeadDim == 256;  // the second dataflow above
  static constexpr int kBlockN = kHeadDimSplit ? 64 : 128;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMinBlocksPerSm = 1;  // one block per SM holds the whole register file
  // A block per SM walking key blocks (backward_pipeline.cuh), else one per key block: at d 128
  // and 256 the walk's loop cost more than the start-up it hides (docs/kernels.md, "Persistent blocks").
  static constexpr bool kPersistent = kHeadDim == 64;
  static constexpr int kStages = 2;                     // Q_i, dO_i, LSE_i, D_i of the next block load during this one
  static constexpr int kPanels = kHeadDim / 64;         // 64-column panels of the 128-byte swizzle
  static constexpr bool kDqSplitsColumns = kBlockM == 64;  // else the two slices split the rows
  // The fp32 dQ accumulator holds a query block's tile as 64 x 64 slices (along the columns when
  // kDqSplitsColumns, else along the rows), each in the order dq_slice_index gives.
  static constexpr int kDqSliceFloats = 64 * 64;
  static constexpr int kDqSlices = kBlockM * kHeadDim / kDqSliceFloats;
  static_assert(kHeadDimSplit || kDqSlices == kConsumerWarpgroups, "keys split: one staged slice per warpgroup");
  // setmaxnreg moves registers from the producer warpgroup to the consumers within the block's
  // launch allocation (168 per thread: 65536 / 384 rounded down to a multiple of 8); a request
  // beyond it would wait forever.
  static constexpr int kLaunchRegisters = 168;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(kProducerRegisters * 128 + kConsumerRegisters * 128 * kConsumerWarpgroups <= kLaunchRegisters * kThreads,
                "setmaxnreg stays within the launch allocation");

  // Shared memory, bytes from a 1024-byte aligned base.
  static constexpr int kKVBytes = kBlockN * kHeadDim * kElementBytes;  // each of K and V
  static constexpr int kQBytes = kBlockM * kHeadDim * kElementBytes;   // each of Q and dO, per stage
  static constexpr int kDsBytes = kBlockN * kBlockM * kElementBytes;   // dS^T (head dim split: P, then dS), per buffer (two)
  static constexpr int kScoreTiles = kHeadDimSplit ? 2 : 1;            // head dim split: P and dS
  static constexpr int kDqStageBytes = kHeadDimSplit ? 0 : kDqSliceFloats * 4;  // per warpgroup
  static constexpr int kK = 0, kV = kK + kKVBytes, kQ = kV + kKVBytes, kDO = kQ + kStages * kQBytes;
  static constexpr int kDs = kDO + kStages * kQBytes, kDqStage = kDs + 2 * kScoreTiles * kDsBytes;
  static constexpr int kRows = kDqStage + kConsumerWarpgroups * kDqStageBytes;  // LSE_i, D_i: [stage][2][kBlockM] floats
  static constexpr int kBarriers = kRows + kStages * 2 * kBlockM * 4;
  static constexpr int kWalk = kBarriers + 256;  // the walk's published key blocks (backward_pipeline.cuh)
  static constexpr int kWalkBytes = 4 * 160;  // kWalkSlots (2) key blocks and a counter per warp; the kernel asserts it
  static constexpr int kSharedBytes = kWalk + kWalkBytes + 1024;  // and the base's alignment
  static_assert(kSharedBytes <= kHopperSharedBytes, "the tiles must fit a Hopper block's shared memory");
  static_assert(kRows % 128 == 0 && kBlockM * 4 % 128 == 0, "LSE_i and D_i land by TMA on 128-byte boundaries");
};

// The padded head dims the kernel is instantiated for (one instance file each); other head dims
// are refused by name.
inline constexpr int kBackwardHeadDims[] = {64, 128, 256};
constexpr int backward_padded_head_dim(int head_dim) {
  for (const int padded : kBackwardHeadDims) {
    if (head_dim <= padded) return padded;
  }
  return 0;
}

}  // namespace flashlab::kernels::fa3
