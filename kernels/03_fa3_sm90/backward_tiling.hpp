// The FA3 rung's backward tiling: plain C++ (no CUDA), read by the kernel, its launcher and the
// exported tile list (kernels/tilings.hpp).
//
// One block owns kBlockN keys of one KV head (FA2 Algorithm 2 line 6: K_j, V_j stay in shared
// memory, dK_j, dV_j in registers) and walks the query blocks of kBlockM rows that see them, for
// every query head of the group, with two consumer warpgroups. Two dataflows:
// - d 64 and 128, keys split: kBlockN = 128, each warpgroup owns 64 keys and all head-dim columns
//   of their dK and dV. It computes S^T = K_j Q_i^T and dP^T = V_j dO_i^T (keys as the rows of the
//   wgmma tile, so P^T and dS^T are already the register A operands of dV += P^T dO and
//   dK += dS^T Q). dQ_i = dS K_j is split in two slices, one per warpgroup: along the rows when
//   kBlockM = 128 (d 64); along the head dim at d 128, whose query blocks are 80 rows (FA3's and
//   FlashAttention-4's choice there: every shared-memory operand read serves more FLOPs than at
//   64), or 64 in the masked variant. 80 is no multiple of wgmma's 64-row M, so with 80 rows each
//   warpgroup computes its slice transposed, dQ_i^T = K_j^T dS^T (its 64 head-dim columns as M,
//   the queries as N).
// - d 256, head dim split: 64 keys x 256 columns of dK and dV are 256 fp32 registers per thread
//   of one warpgroup, so each warpgroup owns 128 columns of dK, dV and dQ for all 64 keys instead.
//   Both then need all of P and dS: each computes S = Q_i K_j^T and dP = dO_i V_j^T for 32 of the
//   keys (queries as rows), and P and dS go through shared memory, the A operands of
//   dV += P^T dO, dK += dS^T Q and dQ = dS K for both. dQ is added from the registers with
//   16-byte reductions: its staging would not fit beside two stages of Q_i and dO_i.
#pragma once

#include <cstddef>
#include <iterator>
#include <utility>

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa3 {

// kMaskedVariant: d 128's second tiling, 64-row query blocks, for masks that leave key blocks
// short walks (backward_masked_variant below).
template <int kHeadDim_, bool kMaskedVariant_ = false>
struct BackwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kMaskedVariant = kMaskedVariant_;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "padded head dims 64, 128 and 256");
  static_assert(!kMaskedVariant || kHeadDim == 128, "a masked variant at d 128 only");
  static constexpr bool kHeadDimSplit = kHeadDim == 256;  // the second dataflow above
  static constexpr int kBlockN = kHeadDimSplit ? 64 : 128;
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : kHeadDim == 128 && !kMaskedVariant ? 80 : 64;
  static constexpr int kConsumerWarpgroups = 2;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMinBlocksPerSm = 1;  // one block per SM holds the whole register file
  // A block per SM walking key blocks (backward_pipeline.cuh), else one per key block: at d 128
  // and 256 the walk's loop cost more than the start-up it hides (docs/fa3_backward_log.md, "Persistent blocks").
  static constexpr bool kPersistent = kHeadDim == 64;
  // The block start, where a block takes one key block: thread 0 sends K_j, the first step's loads
  // and then V_j before the block's first __syncthreads (backward_kernel.cuh, produce_inputs), and
  // the keys-split consumers wait for V_j between the issues of S^T and dP^T (consume). A walk
  // sends K_j and V_j after each key block's first Q_i and dO_i; its consumers wait for both first.
  static constexpr bool kBlockStart = !kPersistent;
  static constexpr int kStages = 2;                     // Q_i, dO_i, LSE_i, D_i of the next block load during this one
  static constexpr int kPanels = kHeadDim / 64;         // 64-column panels of the 128-byte swizzle
  static constexpr bool kDqSplitsColumns = kBlockM != 128;  // else the two slices split the rows
  static constexpr bool kDqTransposed = kBlockM % 64 != 0;  // keys split: dQ_i^T = K_j^T dS^T per slice
  // The fp32 dQ accumulator holds a query block's tile as slices of 64 columns (kBlockM x 64
  // floats) when kDqSplitsColumns, else of 64 rows (64 x 64), each in the order dq_slice_index
  // gives (transposed: its accumulator's rows are the slice's columns).
  static constexpr int kDqSliceFloats = kDqSplitsColumns && !kHeadDimSplit ? kBlockM * 64 : 64 * 64;
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
  static constexpr int kDsBytes = kBlockN * kBlockM * kElementBytes;   // dS^T (dQ transposed: dS; head dim split: P, then dS), per buffer (two)
  static constexpr int kScoreTiles = kHeadDimSplit ? 2 : 1;            // head dim split: P and dS
  static constexpr int kDqStageBytes = kHeadDimSplit ? 0 : kDqSliceFloats * 4;  // per warpgroup
  static constexpr int kK = 0, kV = kK + kKVBytes, kQ = kV + kKVBytes, kDO = kQ + kStages * kQBytes;
  static constexpr int kDs = kDO + kStages * kQBytes, kDqStage = kDs + 2 * kScoreTiles * kDsBytes;
  // LSE_i, D_i: [stage][2][kRowsPitch] floats, each row on 128 bytes (where TMA lands them).
  static constexpr int kRowsPitch = (kBlockM + 31) / 32 * 32;
  static constexpr int kRows = kDqStage + kConsumerWarpgroups * kDqStageBytes;
  static constexpr int kBarriers = kRows + kStages * 2 * kRowsPitch * 4;
  static constexpr int kBarrierBytes = 160;  // the kernel asserts that BackwardBarriers fits
  static constexpr int kWalk = kBarriers + kBarrierBytes;  // the walk's published key blocks (backward_pipeline.cuh)
  static constexpr int kWalkBytes = 256;  // kWalkSlots (2) key blocks and a counter per warp; the kernel asserts it
  static constexpr int kSharedBytes = kWalk + kWalkBytes + 1024;  // and the base's alignment
  static_assert(kSharedBytes <= kHopperSharedBytes, "the tiles must fit a Hopper block's shared memory");
  static_assert(kRows % 128 == 0 && kRowsPitch * 4 % 128 == 0, "LSE_i and D_i land by TMA on 128-byte boundaries");
  static_assert(kQBytes % 1024 == 0 && kDsBytes % 1024 == 0 && kDs % 1024 == 0 && kBlockM * 128 % 1024 == 0,
                "the 128-byte swizzle's 1024-byte atoms");
};

// The padded head dims the kernel is instantiated for; other head dims are refused by name.
inline constexpr int kBackwardHeadDims[] = {64, 128, 256};
constexpr int backward_padded_head_dim(int head_dim) {
  for (const int padded : kBackwardHeadDims) {
    if (head_dim <= padded) return padded;
  }
  return 0;
}

// d 128 takes 80-row query blocks (FA3's and FlashAttention-4's choice without a mask), except
// where a mask (the Problem's mask fields: causal, window_left, window_right, -1 unbounded) leaves
// most key blocks a short walk with two or three masked steps in it: a window with a left bound
// (a key block's walk spans the window), and a diagonal (causal, or a right bound) below
// kBackwardLongCausal queries. There 80-row blocks crossing the diagonal cost more
// than the larger tile saves, and the masked variant takes 64 rows (docs/fa3_backward_log.md, "80-query
// blocks at d 128, on the fp32 P^T order").
inline constexpr int kBackwardLongCausal = 8192;
constexpr bool backward_masked_variant(int padded_head_dim, bool causal, int window_left, int window_right, int seqlen_q) {
  const bool diagonal = causal || window_right >= 0, left_bound = window_left >= 0;
  return padded_head_dim == 128 && (left_bound || (diagonal && seqlen_q < kBackwardLongCausal));
}

// The instances (one file each in backward_instances/): a padded head dim and whether it is the
// masked variant. visit.template operator()<head_dim, masked_variant>() for each, in order.
struct BackwardInstance {
  int head_dim;
  bool masked_variant;
};
inline constexpr BackwardInstance kBackwardInstances[] = {{64, false}, {128, false}, {128, true}, {256, false}};
template <typename Visit>
void for_each_backward_instance(Visit&& visit) {
  [&]<std::size_t... kIndex>(std::index_sequence<kIndex...>) {
    (visit.template operator()<kBackwardInstances[kIndex].head_dim, kBackwardInstances[kIndex].masked_variant>(), ...);
  }(std::make_index_sequence<std::size(kBackwardInstances)>());
}
// visit.template operator()<head_dim, masked_variant>() for the one instance given, if the list
// has it; returns whether it did.
template <typename Visit>
bool visit_backward_instance(int head_dim, bool masked_variant, Visit&& visit) {
  bool visited = false;
  for_each_backward_instance([&]<int kHeadDim, bool kMaskedVariant>() {
    if (visited || kHeadDim != head_dim || kMaskedVariant != masked_variant) return;
    visit.template operator()<kHeadDim, kMaskedVariant>();
    visited = true;
  });
  return visited;
}

}  // namespace flashlab::kernels::fa3
