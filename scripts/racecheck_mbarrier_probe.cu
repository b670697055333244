// Does compute-sanitizer's racecheck see an mbarrier handoff of plain shared-memory data? Thread 0
// writes a shared word and arrives (release); warp 1 waits (acquire) and reads it, then arrives
// on a second barrier, which thread 0 waits for before writing the next value: the pattern of the
// FA3 backward's persistent walk (docs/kernels.md), ordered by the PTX memory model. Every lane of
// warp 1 keeps what it read (so no read is dead code); the program prints how many of those 128
// reads were not 0, 10, 20, 30 in turn and exits 1 if any.
//   nvcc -std=c++20 -arch=sm_90a -I. -o /tmp/mbarrier_probe scripts/racecheck_mbarrier_probe.cu
//   compute-sanitizer --tool racecheck /tmp/mbarrier_probe
#include <cuda_runtime.h>

#include <cstdio>

#include "kernels/common/sm90_sync.cuh"

using namespace flashlab::kernels::sm90;

__global__ void handoff(int* out) {
  __shared__ Mbarrier full, empty;
  __shared__ int slot;
  if (threadIdx.x == 0) {
    mbarrier_init(&full, 1), mbarrier_init(&empty, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  for (int k = 0; k < 4; ++k) {
    if (threadIdx.x == 0) {
      if (k > 0) mbarrier_wait(&empty, (k - 1) & 1);
      slot = 10 * k;
      mbarrier_arrive(&full);
    } else if (threadIdx.x >= 32) {
      mbarrier_wait(&full, k & 1);
      out[4 * (threadIdx.x - 32) + k] = slot;  // every lane's read is used
      __syncwarp();
      if (threadIdx.x == 32) mbarrier_arrive(&empty);
    }
  }
}

int main() {
  int* out = nullptr;
  if (cudaMalloc(&out, 32 * 4 * sizeof(int)) != cudaSuccess) return 2;
  handoff<<<1, 64>>>(out);
  int read[32 * 4];
  cudaMemcpy(read, out, sizeof(read), cudaMemcpyDeviceToHost);
  int wrong = 0;
  for (int lane = 0; lane < 32; ++lane)
    for (int k = 0; k < 4; ++k) wrong += read[4 * lane + k] != 10 * k;
  std::printf("warp 1's 32 lanes read 0 10 20 30: %d wrong (%s)\n", wrong, cudaGetErrorString(cudaGetLastError()));
  return wrong == 0 ? 0 : 1;
}
