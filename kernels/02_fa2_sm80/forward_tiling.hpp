// The FA2 rung's forward tiling: plain C++ (no CUDA), read by the kernel, its launcher and the
// exported tile list (kernels/tilings.hpp).
#pragma once

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa2 {

// Shared bytes of a Q block of `block_m` rows and a `stages`-deep ring of K and V blocks of
// `block_n` keys, rows padded.
constexpr int forward_shared_bytes(int head_dim, int block_m, int block_n, int stages) {
  return (block_m + 2 * stages * block_n) * (head_dim + kSharedRowPadding) * kElementBytes;
}

// Tile shapes per padded head dim and shared-memory budget: query rows x key columns, warps,
// query row tiles per warp, pipeline stages. Each warp holds 16 * kMTiles rows: two 16-row tiles
// halve the shared-memory traffic for K and V per FLOP, at the price of registers, so the head
// dims above 128 keep one.
template <int kHeadDim_, int kSharedBudget_>
struct ForwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kSharedBudget = kSharedBudget_;
  // Above d = 128, 8 warps share each 64-key block, so every K/V block read from shared memory
  // serves 128 query rows. Where that does not fit the budget (d = 224 and 256 on an A100),
  // 4 warps take 32-key blocks.
  static constexpr bool kEightWarps = kHeadDim > 128 && forward_shared_bytes(kHeadDim, 128, 64, 2) <= kSharedBudget;
  static constexpr int kWarps = kEightWarps ? 8 : 4;
  static constexpr int kMTiles = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kBlockM = 16 * kMTiles * kWarps;
  static constexpr int kBlockN = kHeadDim <= 64 ? 128 : (kHeadDim <= 160 || kEightWarps ? 64 : 32);
  static constexpr int kMinBlocksPerSm = kEightWarps ? 1 : 2;
  static constexpr int kStages = kHeadDim <= 32 ? 3 : 2;
  static constexpr bool kQInRegisters = kHeadDim <= 32;
  static constexpr int kRowStride = kHeadDim + kSharedRowPadding;
  static constexpr int kSharedBytes = forward_shared_bytes(kHeadDim, kBlockM, kBlockN, kStages);
};

// One block per (query block, head, batch); with a causal mask the query blocks run last-first
// (kernels/common/grid_order.hpp: grid_position), so the blocks that see the most keys start first.
constexpr bool forward_reverses_query_blocks(bool causal) { return causal; }

// The padded head dims the kernel is instantiated for (one instance file each), and the one a
// head dim runs on.
inline constexpr int kForwardHeadDims[] = {32, 64, 96, 128, 160, 192, 224, 256};
constexpr int forward_padded_head_dim(int head_dim) { return round_up(head_dim, kHeadDimStep); }

// The tilings are chosen for a Hopper's and an A100's shared memory per block. Whether the
// tiling of `kBudget` is its own instance (a budget that gives the Hopper tiling again shares
// its kernel).
template <int kHeadDim, int kBudget>
constexpr bool forward_budget_instantiated() {
  return kBudget == kHopperSharedBytes ||
         ForwardTiling<kHeadDim, kBudget>::kEightWarps != ForwardTiling<kHeadDim, kHopperSharedBytes>::kEightWarps;
}

// The budget whose tiling a device allowing `shared_limit` bytes per block runs: the widest that
// fits (0: none does, the head dim is refused there).
template <int kHeadDim>
constexpr int forward_budget_for(int shared_limit) {
  if (ForwardTiling<kHeadDim, kHopperSharedBytes>::kSharedBytes <= shared_limit) return kHopperSharedBytes;
  if (forward_budget_instantiated<kHeadDim, kAmpereSharedBytes>() &&
      ForwardTiling<kHeadDim, kAmpereSharedBytes>::kSharedBytes <= shared_limit) {
    return kAmpereSharedBytes;
  }
  return 0;
}

}  // namespace flashlab::kernels::fa2
