// The launcher behind launch_fa2_forward<T, kHeadDim>, included only by the instance files
// (forward_instances/): it launches the tiling of the widest budget that fits the device's shared
// memory (forward_budget_for), or refuses the head dim.
#pragma once

#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/02_fa2_sm80/forward_kernel.cuh"
#include "kernels/attention_api.hpp"

namespace flashlab::kernels::fa2 {

template <typename T, int kHeadDim, int kSharedBudget>
void launch_forward_tiled(const ForwardParams& params, int batch, cudaStream_t stream) {
  using Tile = ForwardTiling<kHeadDim, kSharedBudget>;
  auto* kernel = &fa2_forward_kernel<T, kHeadDim, kSharedBudget>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "fa2_forward: cudaFuncSetAttribute(shared memory)");
  const dim3 grid((params.seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM, params.heads_q, batch);
  kernel<<<grid, Tile::kWarps * kWarpSize, Tile::kSharedBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fa2_forward kernel launch");
}

template <typename T, int kHeadDim>
void launch_fa2_forward(const ForwardParams& params, int batch, int shared_bytes_limit, cudaStream_t stream) {
  const int budget = forward_budget_for<kHeadDim>(shared_bytes_limit);
  if (budget == kHopperSharedBytes) return launch_forward_tiled<T, kHeadDim, kHopperSharedBytes>(params, batch, stream);
  // Head dims whose tiling is the same under both budgets compile one kernel.
  if constexpr (forward_budget_instantiated<kHeadDim, kAmpereSharedBytes>()) {
    if (budget == kAmpereSharedBytes) return launch_forward_tiled<T, kHeadDim, kAmpereSharedBytes>(params, batch, stream);
  }
  using Hopper = ForwardTiling<kHeadDim, kHopperSharedBytes>;
  using Ampere = ForwardTiling<kHeadDim, kAmpereSharedBytes>;
  throw std::invalid_argument("fa2_forward: head_dim = " + std::to_string(params.head_dim) + " needs " +
                              std::to_string(std::min(Hopper::kSharedBytes, Ampere::kSharedBytes)) +
                              " bytes of shared memory per block; allowed: head dims whose tiles fit the device's " +
                              std::to_string(shared_bytes_limit) + " bytes");
}

}  // namespace flashlab::kernels::fa2

// One instance file per padded head dim of kForwardHeadDims: both element types.
#define FLASHLAB_FA2_FORWARD_INSTANCE(kHeadDim)                                                                  \
  static_assert(std::ranges::find(flashlab::kernels::fa2::kForwardHeadDims, kHeadDim) !=                         \
                    std::end(flashlab::kernels::fa2::kForwardHeadDims),                                          \
                "an instance of a head dim the host dispatches");                                                \
  template void flashlab::kernels::fa2::launch_fa2_forward<__half, kHeadDim>(const flashlab::kernels::fa2::ForwardParams&, \
                                                                            int, int, cudaStream_t);               \
  template void flashlab::kernels::fa2::launch_fa2_forward<__nv_bfloat16, kHeadDim>(                             \
      const flashlab::kernels::fa2::ForwardParams&, int, int, cudaStream_t);
