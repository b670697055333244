// The FA1 rung's forward tiling: plain C++ (no CUDA), read by the kernel, its host dispatch and
// the exported tile list (kernels/tilings.hpp).
#pragma once

#include <iterator>

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa1 {

// FA1 Algorithm 1 with fixed blocks: B_r = 64 query rows (16 per warp), B_c = 64 keys, one
// thread block per (batch, head). Shared memory holds one Q block and one K/V block (no
// pipelining: Turing has no cp.async).
template <int kHeadDim_>
struct ForwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kWarps = 4;
  static constexpr int kRowsPerWarp = 16;  // one m16 row tile per warp
  static constexpr int kBlockM = kWarps * kRowsPerWarp;
  static constexpr int kBlockN = 64;
  static constexpr int kStages = 1;
  static constexpr int kRowStride = kHeadDim + kSharedRowPadding;
  static constexpr int kSharedBytes = (kBlockM + 2 * kStages * kBlockN) * kRowStride * kElementBytes;
  static_assert(kSharedBytes <= kTuringSharedBytes, "the sm_75 rung fits a Turing block's shared memory");
};

// The padded head dims the kernel is instantiated for, and the one a head dim runs on.
inline constexpr int kForwardHeadDims[] = {64, 128};
inline constexpr int kForwardMaxHeadDim = kForwardHeadDims[std::size(kForwardHeadDims) - 1];
constexpr int forward_padded_head_dim(int head_dim) { return head_dim <= 64 ? 64 : 128; }

}  // namespace flashlab::kernels::fa1
