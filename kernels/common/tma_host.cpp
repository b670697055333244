#include "kernels/common/tma_host.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

#include "kernels/common/constants.hpp"

namespace flashlab::kernels {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found);
    if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || function == nullptr) {
      throw std::runtime_error("cuTensorMapEncodeTiled is not available from the driver (" +
                               std::string(cudaGetErrorString(status)) + ")");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  return encode;
}

// cuTensorMapEncodeTiled over `rank` dimensions, no interleave, no OOB NaN fill (out-of-bounds
// elements read zeros); std::runtime_error naming `name` and `shape` when the driver refuses.
CUtensorMap encode_tiled(const char* name, const std::string& shape, CUtensorMapDataType type, cuuint32_t rank,
                         const void* base, const cuuint64_t* extents, const cuuint64_t* byte_strides,
                         const cuuint32_t* box, const cuuint32_t* element_strides, CUtensorMapSwizzle swizzle,
                         CUtensorMapL2promotion promotion) {
  CUtensorMap map{};
  const CUresult result = encode_function()(&map, type, rank, const_cast<void*>(base), extents, byte_strides, box,
                                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, promotion,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error(std::string(name) + ": cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(static_cast<int>(result)) + " (" + shape + ")");
  }
  return map;
}

[[noreturn]] void refuse(const char* name, const std::string& message) {
  throw std::invalid_argument(std::string(name) + ": " + message);
}

}  // namespace

// cuTensorMapEncodeTiled's limits (CUDA Driver API): strides below 2^40 bytes, extents up to 2^32.
constexpr std::int64_t kMaxTmaStrideBytes = 1LL << 40;
constexpr std::int64_t kMaxTmaExtent = 1LL << 32;

void require_tma_tensor(const TmaTensor& tensor, DType dtype, const char* name) {
  if (dtype != DType::bf16 && dtype != DType::fp16) refuse(name, "TMA tensors here hold bf16 or fp16");
  if (reinterpret_cast<std::uintptr_t>(tensor.base) % 16 != 0) {
    refuse(name, "the base pointer is not 16-byte aligned; allowed: 16-byte aligned pointers (TMA)");
  }
  const std::int64_t strides[3] = {tensor.row_stride, tensor.head_stride, tensor.batch_stride};
  const char* stride_names[3] = {"row_stride", "head_stride", "batch_stride"};
  for (int i = 0; i < 3; ++i) {
    if (strides[i] % 8 != 0 || strides[i] < 0 || strides[i] >= kMaxTmaStrideBytes / kElementBytes) {
      refuse(name, std::string(stride_names[i]) + " = " + std::to_string(strides[i]) +
                       "; allowed: a non-negative multiple of 8 elements (TMA strides are multiples of 16 bytes) below " +
                       std::to_string(kMaxTmaStrideBytes / kElementBytes));
    }
  }
  const std::int64_t extents[4] = {tensor.columns, tensor.rows, tensor.heads, tensor.batches};
  const char* extent_names[4] = {"columns", "rows", "heads", "batches"};
  for (int i = 0; i < 4; ++i) {
    if (extents[i] < 1 || extents[i] > kMaxTmaExtent) {
      refuse(name, std::string(extent_names[i]) + " = " + std::to_string(extents[i]) + "; allowed: [1, " +
                       std::to_string(kMaxTmaExtent) + "] (TMA)");
    }
  }
}

void require_attention_tma_tensors(const Problem& problem, std::initializer_list<AttentionTmaOperand> operands) {
  for (const AttentionTmaOperand& operand : operands) {
    require_tma_tensor(attention_tma_tensor(*operand.tensor, problem, operand.heads, operand.query_side), problem.dtype,
                       operand.name);
  }
}

CUtensorMap make_tma_map(const TmaTensor& tensor, DType dtype, int box_columns, int box_rows, const char* name) {
  require_tma_tensor(tensor, dtype, name);
  if (box_columns * 2 > 128 || box_rows > 256) throw std::logic_error("make_tma_map: box too large for the 128-byte swizzle");
  // TMA wants every stride positive; an extent of 1 makes its stride irrelevant.
  auto positive = [](std::int64_t stride) { return static_cast<cuuint64_t>(stride > 0 ? stride * 2 : 16); };
  const cuuint64_t extents[4] = {static_cast<cuuint64_t>(tensor.columns), static_cast<cuuint64_t>(tensor.rows),
                                 static_cast<cuuint64_t>(tensor.heads), static_cast<cuuint64_t>(tensor.batches)};
  const cuuint64_t byte_strides[3] = {positive(tensor.row_stride), positive(tensor.head_stride),
                                      positive(tensor.batch_stride)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_columns), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const std::string shape = "extents " + std::to_string(tensor.columns) + " x " + std::to_string(tensor.rows) + " x " +
                            std::to_string(tensor.heads) + " x " + std::to_string(tensor.batches);
  return encode_tiled(name, shape, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                      4, tensor.base, extents, byte_strides, box, element_strides, CU_TENSOR_MAP_SWIZZLE_128B,
                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

CUtensorMap make_tma_rows_map(const float* base, std::int64_t rows_pitch, int heads, int box_rows, const char* name) {
  if (reinterpret_cast<std::uintptr_t>(base) % 16 != 0 || rows_pitch % 4 != 0 || rows_pitch < 1 ||
      rows_pitch > kMaxTmaExtent || heads < 1 || box_rows < 1 || box_rows > 256) {
    throw std::logic_error(std::string(name) + ": make_tma_rows_map needs a 16-byte aligned base, a pitch of whole 16 bytes, "
                           "a pitch in [1, 2^32] rows and a box of at most 256 rows");
  }
  const cuuint64_t extents[2] = {static_cast<cuuint64_t>(rows_pitch), static_cast<cuuint64_t>(heads)};
  const cuuint64_t byte_strides[1] = {static_cast<cuuint64_t>(rows_pitch * sizeof(float))};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[2] = {1, 1};
  const std::string shape = "rows " + std::to_string(rows_pitch) + ", heads " + std::to_string(heads);
  return encode_tiled(name, shape, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, extents, byte_strides, box, element_strides,
                      CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE);
}

TmaTensor attention_tma_tensor(const DeviceTensor& tensor, const Problem& problem, int heads, bool query_side) {
  TmaTensor t;
  t.base = tensor.data;
  t.columns = problem.head_dim;
  t.rows = problem.varlen() ? (query_side ? problem.total_rows_q() : problem.total_rows_k())
                            : (query_side ? problem.seqlen_q : problem.seqlen_k);
  t.heads = heads;
  t.batches = problem.varlen() ? 1 : problem.batch;
  t.row_stride = tensor.row_stride, t.head_stride = tensor.head_stride;
  t.batch_stride = problem.varlen() ? 0 : tensor.batch_stride;
  return t;
}

}  // namespace flashlab::kernels
