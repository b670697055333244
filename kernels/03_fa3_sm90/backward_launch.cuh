// The launcher behind launch_fa3_backward<T, kHeadDim, kMaskedVariant>: included only by the
// instance files (backward_instances/, one per instance of kBackwardInstances, both types).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "algorithms/checked_math.hpp"
#include "kernels/03_fa3_sm90/backward_kernel.cuh"
#include "kernels/attention_api.hpp"

namespace flashlab::kernels::fa3 {

// Launches `kernel` as the programmatic dependent of the kernel before it on `stream` (PDL): its
// blocks may start while that kernel finishes, and wait for it where they read its output
// (device::wait_for_previous_grid).
inline void launch_dependent(void (*kernel)(BackwardParams), dim3 grid, int threads, int shared_bytes, cudaStream_t stream,
                             const BackwardParams& params, const char* what) {
  cudaLaunchAttribute dependent{};
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = dim3(threads), config.dynamicSmemBytes = shared_bytes, config.stream = stream;
  config.attrs = &dependent, config.numAttrs = 1;
  check_cuda(cudaLaunchKernelEx(&config, kernel, params), what);
}

template <typename T, int kHeadDim, bool kMaskedVariant>
void launch_fa3_backward(const BackwardParams& params, cudaStream_t stream) {
  using Tile = BackwardTiling<kHeadDim, kMaskedVariant>;
  {  // D = rowsum(dO * O) and LSE in base 2 (the FA2 rung's preprocess)
    const std::int64_t threads = checked_product("fa3_backward: preprocess threads", params.total_rows_q, params.heads_q,
                                                 fa2::kPreprocessLanesPerRow);
    const int blocks = static_cast<int>((threads + fa2::kBackwardAuxThreads - 1) / fa2::kBackwardAuxThreads);
    fa2::backward_preprocess_kernel<T, kHeadDim><<<blocks, fa2::kBackwardAuxThreads, 0, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa3_backward preprocess launch");
  }
  {
    auto* kernel = &fa3_backward_kernel<T, kHeadDim, kMaskedVariant>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
               "fa3_backward: cudaFuncSetAttribute(shared memory)");
    // Persistent: a block per SM, or per key block when there are fewer (backward_pipeline.cuh).
    int blocks = params.order.tiles();
    if constexpr (Tile::kPersistent) blocks = std::min(blocks, current_device_sm_count());
    launch_dependent(kernel, dim3(blocks), Tile::kThreads, Tile::kSharedBytes, stream, params, "fa3_backward main launch");
  }
  {
    const dim3 grid(params.query_blocks * Tile::kDqSlices, params.heads_q, params.batch);
    launch_dependent(&fa3_backward_convert_dq_kernel<T, kHeadDim, kMaskedVariant>, grid, kConvertThreads, 0, stream, params,
                     "fa3_backward convert launch");
  }
}

}  // namespace flashlab::kernels::fa3

#define FLASHLAB_FA3_BACKWARD_INSTANCE(kHeadDim, kMaskedVariant)                                                       \
  template void flashlab::kernels::fa3::launch_fa3_backward<__half, kHeadDim, kMaskedVariant>(                         \
      const flashlab::kernels::fa3::BackwardParams&, cudaStream_t);                                                    \
  template void flashlab::kernels::fa3::launch_fa3_backward<__nv_bfloat16, kHeadDim, kMaskedVariant>(                  \
      const flashlab::kernels::fa3::BackwardParams&, cudaStream_t);
