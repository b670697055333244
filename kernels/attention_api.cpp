// What every rung's host side shares (see attention_api.hpp): the checks, and the one
// flattening of a Problem and the host API's tensors into the kernels' AttentionParams.
#include "kernels/attention_api.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "algorithms/checked_math.hpp"
#include "kernels/common/attention_params.hpp"
#include "kernels/common/constants.hpp"

namespace flashlab::kernels {

namespace {

AttentionParams flatten(const Problem& problem, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                        const DeviceTensor& o, const DeviceTensor& lse, const int* cu_seqlens_q,
                        const int* cu_seqlens_k) {
  AttentionParams params{};
  params.q = q, params.k = k, params.v = v, params.o = o, params.lse = lse;
  params.cu_seqlens_q = problem.varlen() ? cu_seqlens_q : nullptr;
  params.cu_seqlens_k = problem.varlen() ? cu_seqlens_k : nullptr;
  params.seqlen_q = problem.seqlen_q, params.seqlen_k = problem.seqlen_k;
  params.heads_q = problem.heads_q, params.group_size = problem.group_size();
  params.head_dim = problem.head_dim;
  params.scale_log2 = static_cast<float>(problem.scale() * kLog2e);
  params.bottom_right = problem.mask.alignment == CausalAlignment::bottom_right ? 1 : 0;
  params.window_left = problem.mask.window_left;
  params.window_right = problem.mask.effective_window_right();
  return params;
}

}  // namespace

AttentionParams make_attention_params(const Problem& problem, const ForwardArgs& args) {
  return flatten(problem, args.q, args.k, args.v, args.o, args.lse, args.cu_seqlens_q, args.cu_seqlens_k);
}

AttentionParams make_attention_params(const Problem& problem, const BackwardArgs& args) {
  return flatten(problem, args.q, args.k, args.v, args.o, args.lse, args.cu_seqlens_q, args.cu_seqlens_k);
}

DeviceTensor flash_layout(void* data, const Problem& problem, int heads, int dim, bool is_query_side) {
  DeviceTensor tensor;
  tensor.data = data;
  tensor.head_stride = dim;
  tensor.row_stride = checked_mul(heads, dim, "flash layout: row stride (heads x dim)");
  const int seqlen = is_query_side ? problem.seqlen_q : problem.seqlen_k;
  tensor.batch_stride =
      problem.varlen() ? 0 : checked_product("flash layout: batch stride (seqlen x heads x dim)", seqlen, heads, dim);
  return tensor;
}

namespace {
[[noreturn]] void refuse(const char* kernel_name, const std::string& message) {
  throw std::invalid_argument(std::string(kernel_name) + ": " + message);
}
}  // namespace

void require_kernel_supported(const Problem& problem, const char* kernel_name) {
  problem.validate();
  if (!problem.alibi_slopes.empty()) refuse(kernel_name, "alibi_slopes are not supported; allowed: empty");
  if (problem.softcap != 0.0f) refuse(kernel_name, "softcap = " + std::to_string(problem.softcap) + " is not supported; allowed: 0");
  if (problem.block_sparsity.enabled()) refuse(kernel_name, "block_sparsity is not supported; allowed: disabled");
  if (problem.dropout.probability != 0.0f) {
    refuse(kernel_name, "dropout probability = " + std::to_string(problem.dropout.probability) + " is not supported; allowed: 0");
  }
  if (problem.value_dim() != problem.head_dim) {
    refuse(kernel_name, "head_dim_v = " + std::to_string(problem.value_dim()) +
                            " differs from head_dim = " + std::to_string(problem.head_dim) + "; allowed: equal");
  }
  if (problem.dtype == DType::fp32) refuse(kernel_name, "dtype fp32 is not supported; allowed: fp16, bf16");
}

namespace {
// The current device's compute capability as major * 10 + minor, and as text.
std::pair<int, std::string> device_compute_capability() {
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute");
  return {major * 10 + minor, std::to_string(major) + "." + std::to_string(minor)};
}
}  // namespace

void require_compute_capability(int major, int minor, const char* kernel_name) {
  const auto [have, text] = device_compute_capability();
  if (have < major * 10 + minor) {
    refuse(kernel_name, "device compute capability " + text + " is not supported; allowed: >= " + std::to_string(major) +
                            "." + std::to_string(minor));
  }
}

void require_compute_capability_exactly(int major, int minor, const char* kernel_name) {
  const auto [have, text] = device_compute_capability();
  if (have != major * 10 + minor) {
    refuse(kernel_name, "device compute capability " + text + " is not supported; allowed: exactly " +
                            std::to_string(major) + "." + std::to_string(minor));
  }
}

int max_shared_bytes_per_block() {
  int device = 0, bytes = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  return bytes;
}

void require_tensor(const DeviceTensor& tensor, const char* tensor_name, const char* kernel_name,
                    std::size_t alignment_bytes, int stride_multiple) {
  if (tensor.data == nullptr) refuse(kernel_name, std::string(tensor_name) + " is null; allowed: a device pointer");
  if (reinterpret_cast<std::uintptr_t>(tensor.data) % alignment_bytes != 0) {
    refuse(kernel_name, std::string(tensor_name) + " is not " + std::to_string(alignment_bytes) +
                            "-byte aligned; allowed: aligned pointers");
  }
  const std::int64_t strides[3] = {tensor.batch_stride, tensor.row_stride, tensor.head_stride};
  const char* names[3] = {"batch_stride", "row_stride", "head_stride"};
  for (int i = 0; i < 3; ++i) {
    if (strides[i] < 0 || strides[i] % stride_multiple != 0) {
      refuse(kernel_name, std::string(tensor_name) + "." + names[i] + " = " + std::to_string(strides[i]) +
                              "; allowed: a non-negative multiple of " + std::to_string(stride_multiple) + " elements");
    }
  }
}

void require_varlen_offsets(const Problem& problem, const int* cu_seqlens_q, const int* cu_seqlens_k,
                            const char* kernel_name) {
  if (problem.varlen() && (cu_seqlens_q == nullptr || cu_seqlens_k == nullptr)) {
    refuse(kernel_name, "cu_seqlens_q / cu_seqlens_k are null for a varlen problem; allowed: device copies of the offsets");
  }
}

void require_forward_args(const Problem& problem, const ForwardArgs& args, const char* kernel_name,
                          std::size_t alignment_bytes, int stride_multiple) {
  require_tensor(args.q, "q", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.k, "k", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.v, "v", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.o, "o", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.lse, "lse", kernel_name, 4, 1);
  require_varlen_offsets(problem, args.cu_seqlens_q, args.cu_seqlens_k, kernel_name);
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
  }
}

}  // namespace flashlab::kernels
