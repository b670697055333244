// The launcher behind launch_fa2_forward<T, kHeadDim>: included only by the instance files. It
// launches the widest tiling that fits the device's shared memory, or refuses the head dim.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/02_fa2_forward_kernel.cuh"
#include "kernels/attention_api.hpp"

namespace flashlab::kernels {

template <typename T, int kHeadDim, int kSharedBudget>
void launch_fa2_forward_tiled(const Fa2ForwardParams& params, int batch, cudaStream_t stream) {
  using Tile = Fa2Tile<kHeadDim, kSharedBudget>;
  auto* kernel = &fa2_forward_kernel<T, kHeadDim, kSharedBudget>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "fa2_forward: cudaFuncSetAttribute(shared memory)");
  const dim3 grid((params.seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM, params.heads_q, batch);
  kernel<<<grid, Tile::kWarps * 32, Tile::kSharedBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fa2_forward kernel launch");
}

template <typename T, int kHeadDim>
void launch_fa2_forward(const Fa2ForwardParams& params, int batch, int shared_bytes_limit, cudaStream_t stream) {
  using Hopper = Fa2Tile<kHeadDim, kHopperSharedBytes>;
  using Ampere = Fa2Tile<kHeadDim, kAmpereSharedBytes>;
  if (Hopper::kSharedBytes <= shared_bytes_limit) {
    return launch_fa2_forward_tiled<T, kHeadDim, kHopperSharedBytes>(params, batch, stream);
  }
  // Head dims whose tiling is the same under both budgets compile one kernel.
  if constexpr (Hopper::kEightWarps != Ampere::kEightWarps) {
    if (Ampere::kSharedBytes <= shared_bytes_limit) {
      return launch_fa2_forward_tiled<T, kHeadDim, kAmpereSharedBytes>(params, batch, stream);
    }
  }
  throw std::invalid_argument("fa2_forward: head_dim = " + std::to_string(params.head_dim) + " needs " +
                              std::to_string(std::min(Hopper::kSharedBytes, Ampere::kSharedBytes)) +
                              " bytes of shared memory per block; allowed: head dims whose tiles fit the device's " +
                              std::to_string(shared_bytes_limit) + " bytes");
}

}  // namespace flashlab::kernels

#define FLASHLAB_FA2_FORWARD_INSTANCE(kHeadDim)                                                                   \
  template void flashlab::kernels::launch_fa2_forward<__half, kHeadDim>(const flashlab::kernels::Fa2ForwardParams&, \
                                                                        int, int, cudaStream_t);                    \
  template void flashlab::kernels::launch_fa2_forward<__nv_bfloat16, kHeadDim>(                                      \
      const flashlab::kernels::Fa2ForwardParams&, int, int, cudaStream_t);
