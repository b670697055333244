// FLASHLAB_HOST_DEVICE marks an inline function that both the CPU code and the CUDA kernels call:
// the plain C++ rules the two sides share (the dropout RNG, the mask rule, tensor addressing) are
// written once and compiled for both.
#pragma once

#if defined(__CUDACC__)
#define FLASHLAB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASHLAB_HOST_DEVICE inline
#endif
