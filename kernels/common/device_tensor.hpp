// The one tensor type of the host API and of every kernel's parameters: a tensor in device memory
// (HBM) as a pointer and three strides. Plain C++, so code built without CUDA can include it.
#pragma once

#include <cstdint>

#include "algorithms/host_device.hpp"

namespace flashlab::kernels {

// Q, K, V, O, dO, dQ, dK, dV (in the problem's dtype) or LSE (fp32, one column). Element
// (b, position, head, col) is at
//   data[b * batch_stride + position * row_stride + head * head_stride + col]
// in elements (the last dimension is contiguous). For variable-length batches position is the
// packed row (cu_seqlens[b] + i) and batch_stride is ignored.
struct DeviceTensor {
  void* data = nullptr;
  std::int64_t batch_stride = 0;  // elements; ignored for varlen problems
  std::int64_t row_stride = 0;    // elements between consecutive positions of a sequence
  std::int64_t head_stride = 0;   // elements between consecutive heads

  template <typename T>
  FLASHLAB_HOST_DEVICE T* as() const {
    return static_cast<T*>(data);
  }
  // The offset of element (batch, first_position + position, head, 0).
  FLASHLAB_HOST_DEVICE std::int64_t offset(std::int64_t batch, std::int64_t first_position, int position, int head) const {
    return batch * batch_stride + (first_position + position) * row_stride + head * head_stride;
  }
};

}  // namespace flashlab::kernels
