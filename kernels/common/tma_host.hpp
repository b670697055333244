// Host side of TMA: CUtensorMap descriptors for 4-D tensors of 16-bit elements, made with the
// driver's cuTensorMapEncodeTiled reached through the runtime's versioned entry point (so nothing
// links the driver library at build time).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <initializer_list>

#include "algorithms/problem.hpp"
#include "kernels/common/device_tensor.hpp"

namespace flashlab::kernels {

// A tensor of 16-bit elements addressed as base[c + row * row_stride + head * head_stride +
// batch * batch_stride] (strides in elements), with extents columns x rows x heads x batches.
struct TmaTensor {
  const void* base = nullptr;
  std::int64_t columns = 0, rows = 0, heads = 0, batches = 0;
  std::int64_t row_stride = 0, head_stride = 0, batch_stride = 0;
};

// Q, K, V, O (or their gradients) of an attention problem as a 4-D TMA tensor (column, row, head,
// batch): query_side tensors have seqlen_q rows, the others seqlen_k; varlen problems are one
// batch of packed rows.
TmaTensor attention_tma_tensor(const DeviceTensor& tensor, const Problem& problem, int heads, bool query_side);

// TMA's rules on a tensor, checked without a device: 16-byte aligned base, strides non-negative
// multiples of 16 bytes below 2^40 bytes, extents in [1, 2^32] (cuTensorMapEncodeTiled's limits).
// Throws std::invalid_argument naming `name`.
void require_tma_tensor(const TmaTensor& tensor, DType dtype, const char* name);

// require_tma_tensor on each attention operand a kernel reads or writes by TMA, in order.
struct AttentionTmaOperand {
  const DeviceTensor* tensor;
  int heads;
  bool query_side;  // seqlen_q rows (Q, O, dO), else seqlen_k (K, V)
  const char* name;
};
void require_attention_tma_tensors(const Problem& problem, std::initializer_list<AttentionTmaOperand> operands);

// A tensor map whose box is box_columns x box_rows x 1 x 1 with the 128-byte swizzle (box_columns
// * 2 <= 128). Loads of elements outside the extents read zeros; stores there are dropped.
// Throws std::invalid_argument naming `name` when the tensor does not meet TMA's rules
// (require_tma_tensor), std::runtime_error when the driver refuses.
CUtensorMap make_tma_map(const TmaTensor& tensor, DType dtype, int box_columns, int box_rows, const char* name);

// A 2-D tensor map over per-row floats of every head, base[row + head * rows_pitch] (the backward's
// LSE and D), whose box is box_rows x 1 without swizzle; rows at or past rows_pitch read zeros. The
// base must be 16-byte aligned and rows_pitch a multiple of 4 (std::logic_error otherwise: the
// workspace layout guarantees both); a box's first row must be a multiple of 4 (TMA's innermost
// coordinate is 16-byte aligned).
CUtensorMap make_tma_rows_map(const float* base, std::int64_t rows_pitch, int heads, int box_rows, const char* name);

}  // namespace flashlab::kernels
