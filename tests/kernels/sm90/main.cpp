// The Hopper tests' main: exit code 77 (ctest SKIP_RETURN_CODE) unless a compute capability 9.0
// device is usable (sm_90a code runs there only); otherwise Catch2 (2 or 3) runs them.
#include <cuda_runtime.h>

#include <cstdio>

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char** argv) {
  int count = 0, major = 0, minor = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("no CUDA device: Hopper tests skipped\n");
    return 77;
  }
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0) {
    std::printf("device compute capability %d.%d, not 9.0: Hopper tests skipped\n", major, minor);
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
