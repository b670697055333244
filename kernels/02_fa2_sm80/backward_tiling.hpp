// The FA2 rung's backward tiling: plain C++ (no CUDA), read by the three backward kernels, their
// launcher and the exported tile list (kernels/tilings.hpp).
#pragma once

#include <cstddef>

#include "kernels/common/constants.hpp"

namespace flashlab::kernels::fa2 {

// Rows of padding after each sequence in the dQ accumulator (at least every tiling's query block),
// so the last, partial query block of a sequence adds its whole tile without a bounds test.
inline constexpr int kDqRowPadding = 128;

// kHeadDim is head_dim rounded up (the extra columns are zero-filled in shared memory and never
// stored); kBlockN keys per thread block (K_j, V_j), kBlockM query rows per inner iteration (Q_i,
// dO_i), 8 warps. Each GEMM has its own warp grid (warps along rows x warps along columns),
// chosen so that each warp's tile reuses every fragment it loads from shared memory several times:
//   S = Q_i K_j^T and dP = dO_i V_j^T (kBlockM x kBlockN): kBlockM/32 x ... warps of 32 x kSCols;
//   dV_j += P^T dO_i and dK_j += dS^T Q_i (kBlockN x kHeadDim): kBlockN/32 x ... warps of 32 x
//     kKvCols, the accumulators stay in registers for the whole loop;
//   dQ_i += dS K_j (kBlockM x kHeadDim): 2 x 4 warps of 32 x kHeadDim/4 (4 x 2 of 16 x kHeadDim/2
//     when kHeadDim/4 is not a multiple of 16).
// P and dS go through shared memory (rounded to the dtype, as the tensor cores read them).
template <int kHeadDim_, int kBlockN_, int kBlockM_>
struct BackwardTiling {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * kWarpSize;
  static constexpr int kStages = 2;  // Q_i, dO_i, LSE_i and D_i of the next query block load during this one
  static constexpr int kMinBlocksPerSm = 1;  // the launch bounds: all 255 registers a thread may have
  static constexpr int kStride = kHeadDim + kSharedRowPadding;
  static constexpr int kPStride = kBlockN + kSharedRowPadding;
  // P and dS stored with stmatrix (sm_90) where the registers allow: at d = 128 its row address
  // register makes the loop spill.
  static constexpr bool kStmatrix = kHeadDim <= 64;
  // S and dP.
  static constexpr int kSWarpsM = kBlockM / 32, kSWarpsN = kWarps / kSWarpsM;
  static constexpr int kSRows = 32, kSCols = kBlockN / kSWarpsN;
  // dV and dK.
  static constexpr int kKvWarpsN = kBlockN / 32, kKvWarpsD = kWarps / kKvWarpsN;
  static constexpr int kKvRows = 32, kKvCols = kHeadDim / kKvWarpsD;
  // dQ.
  static constexpr int kQRows = (kHeadDim / (kWarps / (kBlockM / 32))) % 16 == 0 ? 32 : 16;
  static constexpr int kQWarpsM = kBlockM / kQRows, kQWarpsD = kWarps / kQWarpsM;
  static constexpr int kQCols = kHeadDim / kQWarpsD;
  static constexpr int kQM = kQRows / 16, kQN = kQCols / 8;  // mma tiles per warp
  static_assert(kSRows % 16 == 0 && kKvRows % 16 == 0 && kQRows % 16 == 0, "row tiles of 16");
  static_assert(kSWarpsM * kSWarpsN == kWarps && kSCols % 16 == 0, "S warp grid");
  static_assert(kKvWarpsN * kKvWarpsD == kWarps && kKvCols % 16 == 0, "dK/dV warp grid");
  static_assert(kQWarpsM * kQWarpsD == kWarps && kQCols % 16 == 0, "dQ warp grid");
  // Shared memory, in bytes: K, V, then kStages stages each of Q and dO, P, dS, then kStages
  // stages of the LSE and D rows (floats).
  static constexpr int kKvBytes = kBlockN * kStride * kElementBytes;  // each of K and V
  static constexpr int kQBytes = kBlockM * kStride * kElementBytes;   // each of Q and dO, per stage
  static constexpr int kPBytes = kBlockM * kPStride * kElementBytes;  // each of P and dS
  static constexpr int kKOffset = 0, kVOffset = kKvBytes, kQOffset = 2 * kKvBytes;
  static constexpr int kdOOffset = kQOffset + kStages * kQBytes, kPOffset = kdOOffset + kStages * kQBytes;
  static constexpr int kdSOffset = kPOffset + kPBytes, kRowsOffset = kdSOffset + kPBytes;
  static constexpr std::size_t kSmemBytes = kRowsOffset + 2 * kStages * kBlockM * sizeof(float);
  // The dQ accumulator's tile order: query block i's kBlockM x kHeadDim tile is stored as the
  // warps' mma C fragments, fragment (warp, m, n) at ((warp * kQM + m) * kQN + n) * 128 floats and
  // lane l's four values (rows g and g + 8, columns 2t and 2t + 1) at 4 l within it.
  static constexpr int kDqWarpFloats = kQM * kQN * 128;
  static_assert(kBlockM <= kDqRowPadding, "a sequence's last query block must fit its padding");
  // sm_90: each warp's fragments staged in shared memory for one bulk reduction, where the tile
  // fits next to the rest (up to d = 128).
  static constexpr std::size_t kDqStageOffset = kSmemBytes;
  static constexpr std::size_t kDqStageBytes = static_cast<std::size_t>(kBlockM) * kHeadDim * sizeof(float);
  static constexpr bool kBulkDq = kSmemBytes + kDqStageBytes <= kHopperSharedBytes;
  static constexpr std::size_t smem_bytes(bool bulk_dq) { return kSmemBytes + (bulk_dq ? kDqStageBytes : 0); }
};

// The padded head dims the kernels are instantiated for, and the one a head dim runs on (the
// padded columns are zero in shared memory and never stored): one instance per range keeps the
// build short.
inline constexpr int kBackwardHeadDims[] = {32, 64, 96, 128, 192, 256};
constexpr int backward_padded_head_dim(int head_dim) {
  if (head_dim > 128) return head_dim <= 192 ? 192 : 256;
  return round_up(head_dim, kHeadDimStep);
}

// Tiles (keys x query rows): 128 x 64, but 128 x 128 at d = 64. Above 128, blocks of 64 keys, so
// the dK/dV accumulators (32 keys x head_dim/4 per warp) still fit the registers; about 217 KB of
// shared memory at d = 256 (sm_90; an A100 allows 163 KB).
constexpr int backward_block_n(int head_dim) { return head_dim <= 128 ? 128 : 64; }
constexpr int backward_block_m(int head_dim) { return head_dim == 64 ? 128 : 64; }
template <int kHeadDim>
using BackwardTilingFor = BackwardTiling<kHeadDim, backward_block_n(kHeadDim), backward_block_m(kHeadDim)>;

// At most the query block of every tiling: sizes the deterministic counters, one per block of
// this many rows.
inline constexpr int kMinBackwardBlockM = 32;

}  // namespace flashlab::kernels::fa2
