// The decode rung's tiling: plain C++ (no CUDA), read by the kernel, its launcher and the exported
// tile list (kernels/tilings.hpp).
//
// Decoding is one or a few query tokens against a long KV cache: a matrix-vector product bound by
// streaming K and V from HBM. One block owns a chunk of one sequence's keys for one KV head and a
// tile of 16 query rows, the query heads of the KV head's group times the query tokens packed
// together (so K and V are read once for the whole group). Its four warps split every key block
// into four 16-key slices, each with its own online softmax state, merged when the chunk ends;
// K and V blocks stream through a ring of cp.async stages deep enough to keep the bytes in flight
// that HBM's latency asks for.
#pragma once

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::decode {

template <int kHeadDim_>
struct DecodeTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockRows = 16;  // packed query rows (query heads of a group x query tokens)
  static constexpr int kBlockN = 64;     // keys per block
  static constexpr int kWarps = 4;       // each takes 16 keys of every block
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kRowStride = kHeadDim + kSharedRowPadding;                   // elements
  static constexpr int kStageBytes = 2 * kBlockN * kRowStride * kElementBytes;     // K and V
  // Stages: 4 of 18 KB at d 64 (3 blocks per SM), 3 of 34 KB at d 128 (2 per SM), 3 of 66 KB at
  // d 256 (1 per SM): 64-132 KB of each SM's loads in flight.
  static constexpr int kStages = kHeadDim <= 64 ? 4 : 3;
  static constexpr int kQBytes = kBlockRows * kRowStride * kElementBytes;
  static constexpr int kSharedBytes = kStages * kStageBytes + kQBytes;
  // The chunk's end: each warp's O (fp32, 16 rows of kHeadDim + 4 padded floats), m and l, merged
  // through the stages.
  static constexpr int kMergeRowFloats = kHeadDim + 4;
  static constexpr int kMergeBytes = kWarps * kBlockRows * (kMergeRowFloats + 2) * 4;
  static_assert(kMergeBytes <= kStages * kStageBytes, "the warps' states fit the K/V ring");
  static_assert(kSharedBytes <= kHopperSharedBytes, "the tiles fit a Hopper block's shared memory");
};

// The padded head dims the kernel is instantiated for (one instance file each).
inline constexpr int kDecodeHeadDims[] = {64, 128, 256};
constexpr int decode_padded_head_dim(int head_dim) {
  for (const int padded : kDecodeHeadDims) {
    if (head_dim <= padded) return padded;
  }
  return 0;
}

// Query tokens per call (speculative decoding verifies up to this many at once).
inline constexpr int kMaxQueryTokens = 16;
// Page sizes of a paged KV cache: multiples of 16 that divide the 64-key block or that it divides.
constexpr bool decode_page_size_allowed(int page_size) {
  return page_size >= 16 && page_size <= 256 && page_size % 16 == 0 && (64 % page_size == 0 || page_size % 64 == 0);
}

}  // namespace flashlab::kernels::decode
