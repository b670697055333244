// Host side: compile-time loops over a rung's list of padded head dims (its *_tiling.hpp), so the
// list the kernels are instantiated from is the one the host dispatches on and the tile export
// (kernels/tilings.cpp) reports. Plain C++.
#pragma once

#include <cstddef>
#include <iterator>
#include <utility>

namespace flashlab::kernels {

// Calls visit.template operator()<kHeadDims[i]>() for every i, in order.
template <const auto& kHeadDims, typename Visit>
void for_each_head_dim(Visit&& visit) {
  [&]<std::size_t... kIndex>(std::index_sequence<kIndex...>) {
    (visit.template operator()<kHeadDims[kIndex]>(), ...);
  }(std::make_index_sequence<std::size(kHeadDims)>());
}

// Calls launch.template operator()<head_dim>() if the list has head_dim; returns whether it did.
template <const auto& kHeadDims, typename Launch>
bool dispatch_head_dim(int head_dim, Launch&& launch) {
  bool launched = false;
  for_each_head_dim<kHeadDims>([&]<int kHeadDim>() {
    if (!launched && head_dim == kHeadDim) {
      launch.template operator()<kHeadDim>();
      launched = true;
    }
  });
  return launched;
}

}  // namespace flashlab::kernels
