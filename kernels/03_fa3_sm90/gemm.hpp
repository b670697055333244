// The rung's warp-specialized GEMM (gemm_kernel.cuh): C = A B^T in bf16 with fp32 accumulation,
// A [m, k], B [n, k], C [m, n], all row-major and contiguous on the device. It exists to show the
// Hopper primitives reach the tensor cores' speed (scripts/bench_kernels.py --gemm times it
// beside torch's matmul). Refuses, by name: k or n not multiples of 8, pointers not 16-byte
// aligned, a device that is not compute capability 9.0, a build without sm_90a code.
#pragma once

#include <cuda_runtime_api.h>

namespace flashlab::kernels {

void sm90_gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, cudaStream_t stream);

}  // namespace flashlab::kernels
