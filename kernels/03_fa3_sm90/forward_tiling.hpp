// Tiles of the FA3-generation forward (plain C++: the host, the simulator and the tests read
// them too). One consumer warpgroup owns 64 query rows; kBlockM = 64 x consumer warpgroups. K and V
// blocks of kBlockN keys go through a kStages-deep ring. Shared memory holds Q, the K and V rings
// and O (aliased onto Q where the budget has no room for it: each consumer warpgroup then writes
// its O rows over its own Q rows once its last S = Q K^T is done).
#pragma once

namespace flashlab::kernels {

template <int kHeadDim>
struct Fa3ForwardTile {
  static_assert(kHeadDim % 32 == 0 && kHeadDim >= 64 && kHeadDim <= 256, "padded head dims 64, 96, ..., 256");
  static constexpr int kConsumerWarpgroups = kHeadDim <= 64 ? 3 : 2;
  static constexpr int kBlockM = 64 * kConsumerWarpgroups;
  static constexpr int kBlockN = kHeadDim <= 64 ? 112 : kHeadDim <= 128 ? 128 : (kHeadDim <= 192 ? 112 : 80);
  static constexpr int kStages = 2;
  static constexpr int kPanels = (kHeadDim + 63) / 64;  // 64-column panels of the 128-byte swizzle
  // Every kExp2OnFmaEvery-th group of 8 keys takes its exponentials on the FMA pipes (0: none).
  static constexpr int kExp2OnFmaEvery = 0;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);
  // setmaxnreg: the producer gives its registers to the consumers (65536 per SM, one block).
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 3 ? 32 : 24;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 3 ? 160 : 240;

  static constexpr int kQBytes = kBlockM * kPanels * 128;
  static constexpr int kKVStageBytes = kBlockN * kPanels * 128;
  static constexpr int kBudgetBytes = 227 * 1024;
  static constexpr int kBarrierBytes = 2048;  // the mbarriers, and up to 1024 bytes to align the tiles
  static constexpr bool kOAliasesQ = kQBytes * 2 + 2 * kStages * kKVStageBytes + kBarrierBytes > kBudgetBytes;
  static constexpr int kSharedBytes = kQBytes * (kOAliasesQ ? 1 : 2) + 2 * kStages * kKVStageBytes + kBarrierBytes;
  static_assert(kSharedBytes <= kBudgetBytes, "the tiles must fit a Hopper block's shared memory");
  static_assert(kBlockN % 16 == 0 && kKVStageBytes % 1024 == 0, "key blocks of whole k16 steps and 1024-byte stages");
};

// (block_m, block_n) of the instance for a padded head dim, for the host and the simulator.
struct Fa3TileShape {
  int block_m, block_n;
};
constexpr Fa3TileShape fa3_forward_tile_shape(int padded_head_dim) {
  switch (padded_head_dim) {
    case 64: return {Fa3ForwardTile<64>::kBlockM, Fa3ForwardTile<64>::kBlockN};
    case 96: return {Fa3ForwardTile<96>::kBlockM, Fa3ForwardTile<96>::kBlockN};
    case 128: return {Fa3ForwardTile<128>::kBlockM, Fa3ForwardTile<128>::kBlockN};
    case 192: return {Fa3ForwardTile<192>::kBlockM, Fa3ForwardTile<192>::kBlockN};
    default: return {Fa3ForwardTile<256>::kBlockM, Fa3ForwardTile<256>::kBlockN};
  }
}

}  // namespace flashlab::kernels
