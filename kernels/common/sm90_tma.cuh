// Hopper (sm_90) TMA: the copy engine moves a box of a tensor described by a CUtensorMap (made on
// the host by kernels/common/tma_host.hpp) between global and shared memory. Loads complete on an
// mbarrier (transaction bytes); stores are tracked in bulk groups of the issuing thread. Written
// over CCCL's cuda::ptx. The tensor maps here are 4-D: (column, row, head, batch), innermost first.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only: nothing here links the driver library)
#include <cuda/ptx>

#include <cstdint>

#include "kernels/common/sm90_sync.cuh"
#include "kernels/common/swizzle.hpp"

namespace flashlab::kernels::sm90 {

// Box at (column, row, head, batch) of `map` into shared memory; completes `bytes` on `barrier`.
__device__ __forceinline__ void tma_load(void* shared_destination, const CUtensorMap& map, int column, int row, int head,
                                         int batch, Mbarrier* barrier) {
  const std::int32_t coordinates[4] = {column, row, head, batch};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, shared_destination, &map,
                                  coordinates, barrier);
}

// Box at (row, head) of a 2-D `map` (make_tma_rows_map) into shared memory; completes on `barrier`.
__device__ __forceinline__ void tma_load_rows(void* shared_destination, const CUtensorMap& map, int row, int head,
                                              Mbarrier* barrier) {
  const std::int32_t coordinates[2] = {row, head};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, shared_destination, &map,
                                  coordinates, barrier);
}

// Box of shared memory to (column, row, head, batch) of `map`; elements outside the tensor's
// extent are not written. The source must be visible to the async proxy first
// (fence_shared_to_async_proxy in every thread that wrote it, then a barrier).
__device__ __forceinline__ void tma_store(const CUtensorMap& map, int column, int row, int head, int batch,
                                          const void* shared_source) {
  const std::int32_t coordinates[4] = {column, row, head, batch};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, &map, coordinates, shared_source);
}
__device__ __forceinline__ void tma_store_commit() { cuda::ptx::cp_async_bulk_commit_group(); }
// Waits until this thread's committed stores have read their shared source (it may be rewritten).
__device__ __forceinline__ void tma_store_wait_read() { cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{}); }
// Waits until this thread's committed stores are complete in global memory.
__device__ __forceinline__ void tma_store_wait_all() { cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{}); }

// Fetches a tensor map into the descriptor cache ahead of its first use.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap& map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(&map) : "memory");
}

using kernels::swizzled_offset;  // kernels/common/swizzle.hpp

}  // namespace flashlab::kernels::sm90
