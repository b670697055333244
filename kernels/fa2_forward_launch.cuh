// The launcher behind launch_fa2_forward<T, kHeadDim>: included only by the instance files.
#pragma once

#include "kernels/02_fa2_forward_kernel.cuh"
#include "kernels/attention_api.hpp"

namespace flashlab::kernels {

template <typename T, int kHeadDim>
void launch_fa2_forward(const Fa2ForwardParams& params, int batch, cudaStream_t stream) {
  using Tile = Fa2Tile<kHeadDim>;
  auto* kernel = &fa2_forward_kernel<T, kHeadDim>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "fa2_forward: cudaFuncSetAttribute(shared memory)");
  const dim3 grid((params.seqlen_q + Tile::kBlockM - 1) / Tile::kBlockM, params.heads_q, batch);
  kernel<<<grid, Tile::kWarps * 32, Tile::kSharedBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fa2_forward kernel launch");
}

}  // namespace flashlab::kernels

#define FLASHLAB_FA2_FORWARD_INSTANCE(kHeadDim)                                                                   \
  template void flashlab::kernels::launch_fa2_forward<__half, kHeadDim>(const flashlab::kernels::Fa2ForwardParams&, \
                                                                        int, cudaStream_t);                         \
  template void flashlab::kernels::launch_fa2_forward<__nv_bfloat16, kHeadDim>(                                      \
      const flashlab::kernels::Fa2ForwardParams&, int, cudaStream_t);
