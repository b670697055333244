// The FA3 rung's backward tiling: plain C++ (no CUDA), read by the kernel, its launcher and the
// exported tile list (kernels/tilings.hpp).
//
// One block owns kBlockN = 128 keys of one KV head (FA2 Algorithm 2 line 6: K_j, V_j stay in
// shared memory, dK_j, dV_j in registers) and walks the query blocks of kBlockM rows that see
// them, for every query head of the group. Two consumer warpgroups own 64 keys each: they compute
// S^T = K_j Q_i^T and dP^T = V_j dO_i^T (keys as the rows of the wgmma tile, so P^T and dS^T are
// already the register A operands of dV += P^T dO and dK += dS^T Q). dQ_i = dS K_j is split in
// two 64 x 64 slices, one per warpgroup: along the head dim when kBlockM = 64 (d 128), along
// the rows when kBlockM = 128 (d 64).
#pragma once

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa3 {

template <int kHeadDim_>
struct BackwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim == 64 || kHeadDim == 128, "padded head dims 64 and 128");
  static constexpr int kBlockN = 128;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMinBlocksPerSm = 1;  // one block per SM holds the whole register file
  static constexpr int kStages = 2;                     // Q_i, dO_i, LSE_i, D_i of the next block load during this one
  static constexpr int kPanels = kHeadDim / 64;         // 64-column panels of the 128-byte swizzle
  static constexpr bool kDqSplitsColumns = kBlockM == 64;  // else the two slices split the rows
  static constexpr int kDqSliceFloats = 64 * 64;
  static_assert(2 * kDqSliceFloats == kBlockM * kHeadDim, "two 64 x 64 slices make a dQ tile");
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
  static constexpr int kDsBytes = kBlockN * kBlockM * kElementBytes;   // dS^T, per buffer (two)
  static constexpr int kDqStageBytes = kDqSliceFloats * 4;             // per warpgroup
  static constexpr int kK = 0, kV = kK + kKVBytes, kQ = kV + kKVBytes, kDO = kQ + kStages * kQBytes;
  static constexpr int kDs = kDO + kStages * kQBytes, kDqStage = kDs + 2 * kDsBytes;
  static constexpr int kRows = kDqStage + kConsumerWarpgroups * kDqStageBytes;  // LSE_i, D_i: [stage][2][kBlockM] floats
  static constexpr int kBarriers = kRows + kStages * 2 * kBlockM * 4;
  static constexpr int kSharedBytes = kBarriers + 256 + 1024;  // the barriers, and the base's alignment
  static_assert(kSharedBytes <= kHopperSharedBytes, "the tiles must fit a Hopper block's shared memory");
  static_assert(kRows % 128 == 0 && kBlockM * 4 % 128 == 0, "LSE_i and D_i land by TMA on 128-byte boundaries");
};

// The padded head dims the kernel is instantiated for (one instance file each); other head dims
// are refused by name.
inline constexpr int kBackwardHeadDims[] = {64, 128};
constexpr int backward_padded_head_dim(int head_dim) {
  for (const int padded : kBackwardHeadDims) {
    if (head_dim <= padded) return padded;
  }
  return 0;
}

}  // namespace flashlab::kernels::fa3
