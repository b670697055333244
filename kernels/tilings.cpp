// The exported tile list (tilings.hpp), built from the rungs' tiling headers over the same lists
// of head dims the host dispatch uses, so it holds exactly the tilings the kernels compile with.
#include "kernels/tilings.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/01_fa1_sm75/forward_tiling.hpp"
#include "kernels/02_fa2_sm80/backward_tiling.hpp"
#include "kernels/02_fa2_sm80/forward_tiling.hpp"
#include "kernels/03_fa3_sm90/backward_tiling.hpp"
#include "kernels/03_fa3_sm90/forward_tiling.hpp"
#include "kernels/03_fa3_sm90/tile_order.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/grid_order.hpp"

namespace flashlab::kernels {

namespace {

// The launch bounds' blocks per SM, where the kernel declares them (the FA1 rung does not).
template <class Tile>
constexpr int min_blocks_per_sm() {
  if constexpr (requires { Tile::kMinBlocksPerSm; }) {
    return Tile::kMinBlocksPerSm;
  } else {
    return 0;
  }
}

// A forward tiling runs wherever its shared memory fits.
template <class Tile>
KernelTiling forward_row(const char* generation, int shared_budget) {
  return {generation,    "forward",     Tile::kHeadDim, shared_budget,      Tile::kBlockM,
          Tile::kBlockN, Tile::kWarps,  Tile::kStages,  Tile::kSharedBytes, Tile::kSharedBytes,
          min_blocks_per_sm<Tile>(), 0};
}

// The backward on sm_80 (an A100's budget, no dQ staging) and on sm_90 (with the staging tile
// where kBulkDq), each on the devices of its budget.
// The FA2 rung's cp.async tiles start on 32-byte boundaries of shared memory (the three-level model
// takes a tile's first row as sector-aligned): whole tiles of padded rows, one after another.
constexpr int kSectorBytes = 32;

template <class Tile>
void add_backward_rows(std::vector<KernelTiling>& rows) {
  static_assert(Tile::kKvBytes % kSectorBytes == 0 && Tile::kQBytes % kSectorBytes == 0 && Tile::kRowsOffset % kSectorBytes == 0,
                "K, V, Q, dO and the LSE/D rows start on sector boundaries");
  for (const int budget : {kHopperSharedBytes, kAmpereSharedBytes}) {
    const int bytes = static_cast<int>(Tile::smem_bytes(budget == kHopperSharedBytes && Tile::kBulkDq));
    if (bytes > budget) continue;  // refused there
    rows.push_back({"fa2", "backward", Tile::kHeadDim, budget, Tile::kBlockM, Tile::kBlockN, Tile::kWarps,
                    Tile::kStages, bytes, budget, Tile::kMinBlocksPerSm, Tile::kStride * kElementBytes});
  }
}

template <class Tile>
KernelTiling fa2_forward_row(int shared_budget) {
  static_assert((Tile::kBlockM * Tile::kRowStride * kElementBytes) % kSectorBytes == 0 &&
                    (Tile::kBlockN * Tile::kRowStride * kElementBytes) % kSectorBytes == 0,
                "the Q tile and each K/V stage start on sector boundaries");
  KernelTiling row = forward_row<Tile>("fa2", shared_budget);
  row.async_copy_row_bytes = Tile::kRowStride * kElementBytes;
  return row;
}

template <int kHeadDim>
void add_fa2_forward_rows(std::vector<KernelTiling>& rows) {
  rows.push_back(fa2_forward_row<fa2::ForwardTiling<kHeadDim, kHopperSharedBytes>>(kHopperSharedBytes));
  rows.push_back(fa2_forward_row<fa2::ForwardTiling<kHeadDim, kAmpereSharedBytes>>(kAmpereSharedBytes));
}

}  // namespace

std::vector<KernelTiling> dispatched_tilings() {
  std::vector<KernelTiling> rows;
  for_each_head_dim<fa1::kForwardHeadDims>([&]<int kHeadDim>() {
    rows.push_back(forward_row<fa1::ForwardTiling<kHeadDim>>("fa1", kTuringSharedBytes));
  });
  for_each_head_dim<fa2::kForwardHeadDims>([&]<int kHeadDim>() { add_fa2_forward_rows<kHeadDim>(rows); });
  for_each_head_dim<fa2::kBackwardHeadDims>([&]<int kHeadDim>() {
    add_backward_rows<fa2::BackwardTilingFor<kHeadDim>>(rows);
  });
  // The Hopper rung runs on compute capability 9.0 alone: only a Hopper's budget admits it.
  for_each_head_dim<fa3::kForwardHeadDims>([&]<int kHeadDim>() {
    KernelTiling row = forward_row<fa3::ForwardTiling<kHeadDim>>("fa3", kHopperSharedBytes);
    row.min_shared_limit = kHopperSharedBytes;
    rows.push_back(row);
  });
  fa3::for_each_backward_instance([&]<int kHeadDim, bool kMaskedVariant>() {
    using Tile = fa3::BackwardTiling<kHeadDim, kMaskedVariant>;
    rows.push_back({"fa3", "backward", kHeadDim, kHopperSharedBytes, Tile::kBlockM, Tile::kBlockN, Tile::kWarps,
                    Tile::kStages, Tile::kSharedBytes, kHopperSharedBytes, Tile::kMinBlocksPerSm, 0, kMaskedVariant});
  });
  return rows;
}

bool takes_masked_variant(const std::string& generation, const std::string& direction, int padded_head_dim, bool causal,
                          int window_left, int window_right, int seqlen_q) {
  return generation == "fa3" && direction == "backward" &&
         fa3::backward_masked_variant(padded_head_dim, causal, window_left, window_right, seqlen_q);
}

std::vector<KernelTiling> tilings_for_shared_limit(int shared_limit) {
  std::vector<KernelTiling> picked;
  for (const KernelTiling& row : dispatched_tilings()) {
    if (row.min_shared_limit > shared_limit) continue;
    auto same_instance = [&](const KernelTiling& other) {
      return other.generation == row.generation && other.direction == row.direction && other.head_dim == row.head_dim &&
             other.masked_variant == row.masked_variant;
    };
    const auto existing = std::find_if(picked.begin(), picked.end(), same_instance);
    if (existing == picked.end()) {
      picked.push_back(row);
    } else if (row.shared_budget > existing->shared_budget) {
      *existing = row;
    }
  }
  return picked;
}

std::vector<ThreadBlockWork> launch_order(const KernelTiling& tiling, const LaunchShape& shape, std::int64_t max_blocks) {
  const bool forward = tiling.direction == "forward";
  // The grid of each rung's launcher: FA1 (heads_q, batch); the FA2 and FA3 forward (query blocks,
  // heads_q, batch); the backward rungs (key blocks, heads_kv, batch). The FA3 rung's blocks walk
  // its tile orders (tile_order.hpp).
  const int rows = forward ? shape.seqlen_q : shape.seqlen_k, block = forward ? tiling.block_rows : tiling.block_cols;
  const std::int64_t blocks = tiling.generation == "fa1" ? 1 : (static_cast<std::int64_t>(rows) + block - 1) / block;
  const int heads = forward ? shape.heads_q : shape.heads_kv;
  const std::int64_t total = blocks * heads * shape.batch;
  if (total > max_blocks) {
    throw std::invalid_argument(tiling.generation + " " + tiling.direction + " launches " + std::to_string(total) +
                                " thread blocks (blocks x heads x batch); allowed: at most " + std::to_string(max_blocks));
  }
  std::vector<ThreadBlockWork> order;
  order.reserve(static_cast<std::size_t>(total));
  if (tiling.generation == "fa3") {
    const fa3::TileOrder tiles =
        forward ? fa3::forward_tile_order(shape.seqlen_q, shape.seqlen_k, shape.head_dim, shape.heads_q, shape.heads_kv,
                                          shape.batch, shape.causal, tiling.block_rows, shape.fa3_l2_section_bytes)
                : fa3::backward_tile_order(shape.seqlen_q, shape.seqlen_k, shape.head_dim, shape.heads_q, shape.heads_kv,
                                           shape.batch, shape.causal, shape.deterministic, tiling.block_cols,
                                           shape.fa3_l2_section_bytes);
    for (int tile = 0; tile < tiles.tiles(); ++tile) {
      const fa3::TileCoordinates c = tiles.coordinates(tile);
      order.push_back({c.m_block, c.head, c.batch});
    }
    return order;
  }
  const bool reversed = forward ? fa2::forward_reverses_query_blocks(shape.causal) : shape.deterministic;
  const int grid_x = static_cast<int>(blocks);
  for (int batch = 0; batch < shape.batch; ++batch)
    for (int head = 0; head < heads; ++head)
      for (int x = 0; x < grid_x; ++x) order.push_back({grid_position(x, grid_x, reversed), head, batch});
  return order;
}

}  // namespace flashlab::kernels
