// The 128-byte swizzle of TMA boxes and wgmma operands, as an address function that host code (the
// tests) and device code share.
#pragma once

#include <cstdint>

namespace flashlab::kernels {

#if defined(__CUDACC__)
#define FLASHLAB_SWIZZLE_FUNCTION __host__ __device__ constexpr
#else
#define FLASHLAB_SWIZZLE_FUNCTION constexpr
#endif

// Shared-memory byte offset of element (row, column) of a tile of 16-bit elements stored the way a
// TMA box with the 128-byte swizzle stores it: column panels of 64 elements, each panel `rows`
// rows of 128 bytes; within each 1024-byte group of 8 rows, 16-byte chunk c of row r sits at
// chunk c ^ (r % 8). The tile must start 1024-byte aligned.
FLASHLAB_SWIZZLE_FUNCTION std::uint32_t swizzled_offset(int row, int column, int rows) {
  const int panel = column / 64, in_panel = column % 64;
  const int chunk = (in_panel / 8) ^ (row % 8);
  return static_cast<std::uint32_t>((panel * rows + row) * 128 + chunk * 16 + (in_panel % 8) * 2);
}

#undef FLASHLAB_SWIZZLE_FUNCTION

}  // namespace flashlab::kernels
