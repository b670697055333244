// The launchers behind launch_decode<T, kHeadDim> and decode_blocks_per_sm<T, kHeadDim>: included
// only by the instance files (decode_instances/, one per padded head dim, both types).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/04_decode_sm80/decode_kernel.cuh"
#include "kernels/attention_api.hpp"

namespace flashlab::kernels::decode {

template <typename T, int kHeadDim>
void launch_decode(const DecodeParams& params, bool stream_only, cudaStream_t stream) {
  using Tile = DecodeTiling<kHeadDim>;
  if (params.seqlen_new > 0 && !stream_only) {  // the new keys into the cache first
    const std::int64_t threads = static_cast<std::int64_t>(params.batch) * params.seqlen_new * params.heads_kv *
                                 (params.head_dim / kChunkElements);
    constexpr int kAppendThreads = 256;
    decode_append_kernel<T><<<static_cast<unsigned>((threads + kAppendThreads - 1) / kAppendThreads), kAppendThreads, 0,
                              stream>>>(params);
    check_cuda(cudaGetLastError(), "decode append launch");
  }
  auto* kernel = stream_only ? &decode_kernel<T, kHeadDim, true> : &decode_kernel<T, kHeadDim, false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "decode: cudaFuncSetAttribute(shared memory)");
  const dim3 grid(params.splits, params.heads_kv * params.row_tiles, params.batch);
  kernel<<<grid, Tile::kThreads, Tile::kSharedBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "decode kernel launch");
}

template <typename T, int kHeadDim>
int decode_blocks_per_sm() {
  using Tile = DecodeTiling<kHeadDim>;
  auto* kernel = &decode_kernel<T, kHeadDim, false>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "decode: cudaFuncSetAttribute(shared memory)");
  int blocks = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Tile::kThreads, Tile::kSharedBytes),
             "decode: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return blocks;
}

}  // namespace flashlab::kernels::decode

#define FLASHLAB_DECODE_INSTANCE(kHeadDim)                                                                              \
  template void flashlab::kernels::decode::launch_decode<__half, kHeadDim>(const flashlab::kernels::decode::DecodeParams&, \
                                                                           bool, cudaStream_t);                          \
  template void flashlab::kernels::decode::launch_decode<__nv_bfloat16, kHeadDim>(                                     \
      const flashlab::kernels::decode::DecodeParams&, bool, cudaStream_t);                                               \
  template int flashlab::kernels::decode::decode_blocks_per_sm<__half, kHeadDim>();                                     \
  template int flashlab::kernels::decode::decode_blocks_per_sm<__nv_bfloat16, kHeadDim>();
