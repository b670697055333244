// The launcher behind launch_fa3_forward<T, kHeadDim>: included only by the instance files. The
// default steps (Fa3Steps{}) are instantiated for every head dim and both types; the ablation's
// other step sets (docs/kernels.md) only at head dim 128 in bf16.
#pragma once

#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/03_fa3_sm90/forward_kernel.cuh"
#include "kernels/attention_api.hpp"

namespace flashlab::kernels::fa3 {

template <typename T, int kHeadDim, class Steps>
void launch_fa3_forward_steps(const ForwardParams& params, cudaStream_t stream) {
  using Tile = ForwardTiling<kHeadDim>;
  auto* kernel = &fa3_forward_kernel<T, kHeadDim, Steps>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "fa3_forward: cudaFuncSetAttribute(shared memory)");
  int blocks = params.tiles;
  if constexpr (Steps::kPersistent) blocks = std::min(blocks, current_device_sm_count());
  kernel<<<blocks, Tile::kThreads, Tile::kSharedBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fa3_forward kernel launch");
}

template <typename T, int kHeadDim>
void launch_fa3_forward(const ForwardParams& params, const Fa3Steps& steps, cudaStream_t stream) {
  if (steps == Fa3Steps{}) return launch_fa3_forward_steps<T, kHeadDim, Fa3StepSet<true, true, false>>(params, stream);
  if constexpr (kHeadDim == 128 && std::is_same_v<T, __nv_bfloat16>) {
    const bool ping_pong = steps.ping_pong, overlap = steps.intra_warpgroup_overlap;
    if (!steps.persistent && !ping_pong && !overlap) {
      return launch_fa3_forward_steps<T, kHeadDim, Fa3StepSet<false, false, false>>(params, stream);
    }
    if (!steps.persistent && ping_pong && !overlap) {
      return launch_fa3_forward_steps<T, kHeadDim, Fa3StepSet<true, false, false>>(params, stream);
    }
    if (steps.persistent && ping_pong && overlap) {
      return launch_fa3_forward_steps<T, kHeadDim, Fa3StepSet<true, true, true>>(params, stream);
    }
    if (!steps.persistent && !ping_pong && overlap) {
      return launch_fa3_forward_steps<T, kHeadDim, Fa3StepSet<false, true, false>>(params, stream);
    }
  }
  throw std::invalid_argument(
      "fa3_forward_steps: steps {ping_pong " + std::to_string(steps.ping_pong) + ", intra_warpgroup_overlap " +
      std::to_string(steps.intra_warpgroup_overlap) + ", persistent " + std::to_string(steps.persistent) +
      "} are not instantiated for this head dim and dtype; allowed: the default {1,1,0}, or at head_dim 128 in bf16 "
      "the ablation's {0,0,0}, {1,0,0}, {1,1,1} and {0,1,0}");
}

}  // namespace flashlab::kernels::fa3

#define FLASHLAB_FA3_FORWARD_INSTANCE(kHeadDim)                                                                \
  template void flashlab::kernels::fa3::launch_fa3_forward<__half, kHeadDim>(                                  \
      const flashlab::kernels::fa3::ForwardParams&, const flashlab::kernels::Fa3Steps&, cudaStream_t);        \
  template void flashlab::kernels::fa3::launch_fa3_forward<__nv_bfloat16, kHeadDim>(                           \
      const flashlab::kernels::fa3::ForwardParams&, const flashlab::kernels::Fa3Steps&, cudaStream_t);
