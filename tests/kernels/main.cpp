// The GPU tests' main: exit code 77 (ctest SKIP_RETURN_CODE) when no CUDA device is usable, so
// machines without a GPU (CI) skip them cleanly; otherwise Catch2 (2 or 3) runs them.
#include <cstdio>

#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include "reference/device_attention.hpp"

int main(int argc, char** argv) {
  if (!flashlab::reference::cuda_device_available()) {
    std::printf("no CUDA device: GPU tests skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
