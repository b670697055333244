// Host side: from a runtime head dim to the kernel instance compiled for it, over a rung's list
// of padded head dims (its *_tiling.hpp), so the list the kernels are instantiated from is the
// one the host dispatches on and the tile export reports.
#pragma once

#include <cstddef>
#include <iterator>
#include <utility>

namespace flashlab::kernels {

// Calls launch.template operator()<kHeadDims[i]>() for the i with kHeadDims[i] == head_dim;
// returns false when the list has no such head dim.
template <const auto& kHeadDims, typename Launch>
bool dispatch_head_dim(int head_dim, Launch&& launch) {
  return [&]<std::size_t... kIndex>(std::index_sequence<kIndex...>) {
    return ((head_dim == kHeadDims[kIndex] && (launch.template operator()<kHeadDims[kIndex]>(), true)) || ...);
  }(std::make_index_sequence<std::size(kHeadDims)>());
}

}  // namespace flashlab::kernels
