// Host entry points of the Hopper primitive tests (primitive_kernels.cu, built for sm_90a only);
// test_sm90_primitives.cpp checks what they return. CUDA errors throw std::runtime_error.
#pragma once

#include <cstdint>
#include <vector>

#include "algorithms/problem.hpp"

namespace flashlab::sm90_tests {

// A kRows x kColumns tensor of 16-bit patterns that are never NaN: element (r, c) = r * 256 + c.
constexpr int kTensorRows = 100, kTensorColumns = 72, kBoxRows = 64;
inline std::uint16_t pattern(int r, int c) { return static_cast<std::uint16_t>(r * 256 + c); }

// One TMA load of the 64-column x kBoxRows box at (column0, row0) of the pattern tensor, with the
// 128-byte swizzle: the box's shared-memory bytes as 16-bit words.
std::vector<std::uint16_t> tma_load_box(int column0, int row0);
// One TMA store of a kBoxRows x 64 tile whose element (r, c) = r * 256 + c + 1, written to shared
// memory at swizzled_offset(r, c), to (column0, row0) of a zeroed tensor: the tensor afterwards.
std::vector<std::uint16_t> tma_store_box(int column0, int row0);

// max |D - D_ref| / max |D_ref| of one warpgroup's D = A B^T (ss: A 64 x k, B n x k, both K-major)
// or D = A B (rs: A 64 x k in registers, B k x n MN-major), random inputs, against fp64 on the CPU.
// The (n, k) pairs instantiated are those test_sm90_primitives.cpp uses.
double wgmma_ss_error(DType dtype, int n, int k, std::uint64_t seed);
double wgmma_rs_error(DType dtype, int n, int k, std::uint64_t seed);

// A three-stage ring (one TMA producer thread, two consumer warpgroups): tile i * 7 % 64 goes
// through stage i % 3; consumers check 2 elements per thread per tile.
struct RingResult {
  unsigned long long checked = 0;
  int wrong = 0;
};
RingResult run_ring(int iterations);
constexpr int kRingConsumerThreads = 256;

}  // namespace flashlab::sm90_tests
