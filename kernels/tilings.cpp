// The exported tile list (tilings.hpp), built from the rungs' tiling headers over the same lists
// of head dims the host dispatch uses, so it holds exactly the tilings the kernels compile with.
#include "kernels/tilings.hpp"

#include <algorithm>

#include "kernels/01_fa1_sm75/forward_tiling.hpp"
#include "kernels/02_fa2_sm80/backward_tiling.hpp"
#include "kernels/02_fa2_sm80/forward_tiling.hpp"
#include "kernels/03_fa3_sm90/backward_tiling.hpp"
#include "kernels/03_fa3_sm90/forward_tiling.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/dispatch.hpp"

namespace flashlab::kernels {

namespace {

// A forward tiling runs wherever its shared memory fits.
template <class Tile>
KernelTiling forward_row(const char* generation, int shared_budget) {
  return {generation,    "forward",     Tile::kHeadDim, shared_budget,      Tile::kBlockM,
          Tile::kBlockN, Tile::kWarps,  Tile::kStages,  Tile::kSharedBytes, Tile::kSharedBytes};
}

// The backward on sm_80 (an A100's budget, no dQ staging) and on sm_90 (with the staging tile
// where kBulkDq), each on the devices of its budget.
template <class Tile>
void add_backward_rows(std::vector<KernelTiling>& rows) {
  for (const int budget : {kHopperSharedBytes, kAmpereSharedBytes}) {
    const int bytes = static_cast<int>(Tile::smem_bytes(budget == kHopperSharedBytes && Tile::kBulkDq));
    if (bytes > budget) continue;  // refused there
    rows.push_back({"fa2", "backward", Tile::kHeadDim, budget, Tile::kBlockM, Tile::kBlockN, Tile::kWarps,
                    Tile::kStages, bytes, budget});
  }
}

template <int kHeadDim>
void add_fa2_forward_rows(std::vector<KernelTiling>& rows) {
  rows.push_back(forward_row<fa2::ForwardTiling<kHeadDim, kHopperSharedBytes>>("fa2", kHopperSharedBytes));
  rows.push_back(forward_row<fa2::ForwardTiling<kHeadDim, kAmpereSharedBytes>>("fa2", kAmpereSharedBytes));
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
  for_each_head_dim<fa3::kBackwardHeadDims>([&]<int kHeadDim>() {
    using Tile = fa3::BackwardTiling<kHeadDim>;
    rows.push_back({"fa3", "backward", kHeadDim, kHopperSharedBytes, Tile::kBlockM, Tile::kBlockN, Tile::kWarps,
                    Tile::kStages, Tile::kSharedBytes, kHopperSharedBytes});
  });
  return rows;
}

std::vector<KernelTiling> tilings_for_shared_limit(int shared_limit) {
  std::vector<KernelTiling> picked;
  for (const KernelTiling& row : dispatched_tilings()) {
    if (row.min_shared_limit > shared_limit) continue;
    auto same_instance = [&](const KernelTiling& other) {
      return other.generation == row.generation && other.direction == row.direction && other.head_dim == row.head_dim;
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

}  // namespace flashlab::kernels
