// The FA3 rung's forward tiling: plain C++ (no CUDA), read by the kernel, its launcher and the
// exported tile list (kernels/tilings.hpp). One consumer warpgroup owns 64 query rows; kBlockM = 64 x consumer warpgroups. K and V
// blocks of kBlockN keys go through a kStages-deep ring. Shared memory holds Q, the K and V rings
// and O (aliased onto Q where the budget has no room for it: each consumer warpgroup then writes
// its O rows over its own Q rows once its last S = Q K^T is done).
#pragma once

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa3 {

template <int kHeadDim_>
struct ForwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static_assert(kHeadDim % 32 == 0 && kHeadDim >= 64 && kHeadDim <= 256, "padded head dims 64, 96, ..., 256");
  static constexpr int kConsumerWarpgroups = kHeadDim <= 64 ? 3 : 2;
  static constexpr int kBlockM = 64 * kConsumerWarpgroups;
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : (kHeadDim <= 192 ? 112 : 80);
  static constexpr int kStages = 2;
  static constexpr int kPanels = (kHeadDim + 63) / 64;  // 64-column panels of the 128-byte swizzle
  // Every kExp2OnFmaEvery-th group of 8 keys takes its exponentials on the FMA pipes (0: none).
  static constexpr int kExp2OnFmaEvery = 0;
  static constexpr int kThreads = 128 * (kConsumerWarpgroups + 1);
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kMinBlocksPerSm = 1;  // one block per SM: setmaxnreg shares out its 65536 registers
  // setmaxnreg: the producer gives its registers to the consumers (65536 per SM, one block).
  static constexpr int kProducerRegisters = kConsumerWarpgroups == 3 ? 32 : 24;
  static constexpr int kConsumerRegisters = kConsumerWarpgroups == 3 ? 160 : 240;

  static constexpr int kQBytes = kBlockM * kPanels * 128;
  static constexpr int kKVStageBytes = kBlockN * kPanels * 128;
  static constexpr int kBudgetBytes = kHopperSharedBytes;
  static constexpr int kBarrierBytes = 2048;  // the mbarriers, and up to 1024 bytes to align the tiles
  static constexpr bool kOAliasesQ = kQBytes * 2 + 2 * kStages * kKVStageBytes + kBarrierBytes > kBudgetBytes;
  static constexpr int kSharedBytes = kQBytes * (kOAliasesQ ? 1 : 2) + 2 * kStages * kKVStageBytes + kBarrierBytes;
  static_assert(kSharedBytes <= kBudgetBytes, "the tiles must fit a Hopper block's shared memory");
  static_assert(kBlockN % 16 == 0 && kKVStageBytes % 1024 == 0, "key blocks of whole k16 steps and 1024-byte stages");
};

// The padded head dims the kernel is instantiated for (one instance file each), and the one a
// head dim (a multiple of 8 up to 256) runs on: TMA reads zeros past the real head dim.
inline constexpr int kForwardHeadDims[] = {64, 96, 128, 192, 256};
constexpr int forward_padded_head_dim(int head_dim) {
  for (const int padded : kForwardHeadDims) {
    if (head_dim <= padded) return padded;
  }
  return 0;
}

}  // namespace flashlab::kernels::fa3
