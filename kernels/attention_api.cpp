// What every rung's host side shares (see attention_api.hpp): the checks, and the one
// flattening of a Problem and the host API's tensors into the kernels' AttentionParams.
#include "kernels/attention_api.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

// ---------------------------------------------------------------------------------------------
// Layouts and aliasing. A tensor argument is a set of elements at data + element_bytes *
// (sum of index * stride over its dimensions), the columns being the dimension of stride 1.

namespace {

struct Dimension {
  std::int64_t stride, extent;
  const char* name;
  constexpr bool operator==(const Dimension& other) const { return stride == other.stride && extent == other.extent; }
};

// The dimensions that address more than one element, in increasing stride (columns first).
std::vector<Dimension> addressed_dimensions(const TensorArgument& argument) {
  std::vector<Dimension> dimensions;
  const Dimension all[] = {{1, argument.columns, "columns"},
                           {argument.tensor.row_stride, argument.rows, "row_stride"},
                           {argument.tensor.head_stride, argument.heads, "head_stride"},
                           {argument.tensor.batch_stride, argument.batches, "batch_stride"}};
  for (const Dimension& dimension : all) {
    if (dimension.extent > 1) dimensions.push_back(dimension);
  }
  std::stable_sort(dimensions.begin(), dimensions.end(),
                   [](const Dimension& a, const Dimension& b) { return a.stride < b.stride; });
  return dimensions;
}

// The first and last byte an argument touches; nullopt when an offset passes int64 or the address
// space.
struct ByteRange {
  std::uintptr_t first, last;
};
std::optional<ByteRange> byte_range(const TensorArgument& argument) {
  std::int64_t highest = 0;
  for (const Dimension& dimension : addressed_dimensions(argument)) {
    std::int64_t term = 0;
    if (__builtin_mul_overflow(dimension.extent - 1, dimension.stride, &term) ||
        __builtin_add_overflow(highest, term, &highest)) {
      return std::nullopt;
    }
  }
  std::int64_t last_byte = 0;
  if (__builtin_mul_overflow(highest, static_cast<std::int64_t>(argument.element_bytes), &last_byte) ||
      __builtin_add_overflow(last_byte, argument.element_bytes - 1, &last_byte)) {
    return std::nullopt;
  }
  const auto first = reinterpret_cast<std::uintptr_t>(argument.tensor.data);
  std::uintptr_t last = 0;
  if (__builtin_add_overflow(first, static_cast<std::uintptr_t>(last_byte), &last)) return std::nullopt;
  return ByteRange{first, last};
}

// No two elements share an address when every stride passes the highest offset the smaller
// strides reach (the index is then a mixed-radix number); the layouts of PyTorch and of
// flash_layout are all so. Returns the first dimension that breaks it, or nullptr.
const Dimension* first_overlapping_dimension(const std::vector<Dimension>& dimensions) {
  std::int64_t reached = 0;  // fits: byte_range checked the sum
  for (const Dimension& dimension : dimensions) {
    if (dimension.stride <= reached) return &dimension;
    reached += (dimension.extent - 1) * dimension.stride;
  }
  return nullptr;
}

// Whether delta = sum of d_k * stride_k has a solution with |d_k| < extent_k over dimensions
// [0, count), whose strides each exceed the reach of the smaller ones: each level leaves at
// most two candidates, so the search visits at most 2^4 leaves.
bool offset_reachable(const std::vector<Dimension>& dimensions, std::size_t count, std::int64_t delta) {
  if (count == 0) return delta == 0;
  const Dimension& top = dimensions[count - 1];
  std::int64_t inner_reach = 0;
  for (std::size_t k = 0; k + 1 < count; ++k) inner_reach += (dimensions[k].extent - 1) * dimensions[k].stride;
  std::int64_t low = 0, high = 0;
  if (__builtin_sub_overflow(delta, inner_reach, &low) || __builtin_add_overflow(delta, inner_reach, &high)) return true;
  auto floor_div = [](std::int64_t a, std::int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); };
  const std::int64_t first = std::max(-(top.extent - 1), -floor_div(-low, top.stride));  // ceil(low / stride)
  const std::int64_t last = std::min(top.extent - 1, floor_div(high, top.stride));
  for (std::int64_t digit = first; digit <= last; ++digit) {
    if (offset_reachable(dimensions, count - 1, delta - digit * top.stride)) return true;
  }
  return false;
}

// Whether two arguments may touch a common byte: exact when their address ranges meet and both
// have one mixed-radix layout, conservative (true) for any other layouts whose ranges meet.
bool may_share_memory(const TensorArgument& a, const ByteRange& a_range, const TensorArgument& b,
                      const ByteRange& b_range) {
  if (a_range.last < b_range.first || b_range.last < a_range.first) return false;
  const std::vector<Dimension> dimensions = addressed_dimensions(a);
  if (a.element_bytes != b.element_bytes || dimensions != addressed_dimensions(b) ||
      first_overlapping_dimension(dimensions) != nullptr) {
    return true;
  }
  const auto delta_bytes = static_cast<std::int64_t>(b_range.first - a_range.first);  // ranges meet: fits
  if (delta_bytes % a.element_bytes != 0) return true;
  return offset_reachable(dimensions, dimensions.size(), delta_bytes / a.element_bytes);
}

std::string strides_text(const DeviceTensor& tensor) {
  return "(batch_stride " + std::to_string(tensor.batch_stride) + ", row_stride " + std::to_string(tensor.row_stride) +
         ", head_stride " + std::to_string(tensor.head_stride) + ")";
}

}  // namespace

void require_tensor_arguments(const TensorArgument* arguments, std::size_t count, const char* kernel_name) {
  std::vector<ByteRange> ranges;
  for (std::size_t i = 0; i < count; ++i) {
    const TensorArgument& argument = arguments[i];
    const std::string name = argument.name;
    const std::pair<std::int64_t, const char*> extents[] = {
        {argument.rows, "rows"}, {argument.heads, "heads"}, {argument.batches, "batches"}};
    const std::int64_t strides[] = {argument.tensor.row_stride, argument.tensor.head_stride, argument.tensor.batch_stride};
    const char* stride_names[] = {"row_stride", "head_stride", "batch_stride"};
    for (int k = 0; k < 3; ++k) {
      if (extents[k].first > 1 && strides[k] <= 0) {
        refuse(kernel_name, name + "." + stride_names[k] + " = " + std::to_string(strides[k]) + " with " +
                                std::to_string(extents[k].first) + " " + extents[k].second +
                                "; allowed: > 0 when there is more than one (materialise a broadcast tensor)");
      }
    }
    const std::optional<ByteRange> range = byte_range(argument);
    if (!range) {
      refuse(kernel_name, name + ": strides " + strides_text(argument.tensor) +
                              " put its last element past 2^63 - 1 bytes or the end of the address space; allowed: "
                              "strides whose byte offsets fit in int64");
    }
    ranges.push_back(*range);
    if (argument.output) {
      const std::vector<Dimension> dimensions = addressed_dimensions(argument);
      if (const Dimension* overlapping = first_overlapping_dimension(dimensions)) {
        refuse(kernel_name, name + "." + overlapping->name + " = " + std::to_string(overlapping->stride) +
                                " makes elements of the output share memory, strides " + strides_text(argument.tensor) +
                                "; allowed: strides under which every element of an output has its own memory");
      }
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (!arguments[i].output) continue;
    for (std::size_t j = 0; j < count; ++j) {
      if (j == i || (arguments[j].output && j < i)) continue;  // each pair of outputs once
      if (may_share_memory(arguments[i], ranges[i], arguments[j], ranges[j])) {
        refuse(kernel_name, std::string(arguments[i].name) + " shares memory with " + arguments[j].name +
                                "; allowed: an output in memory that no other argument uses");
      }
    }
  }
}

namespace {

// The extents a call addresses in a query-side (q, o, lse, d_o, dq) or key-side (k, v, dk, dv)
// tensor: one batch of packed rows for varlen problems.
TensorArgument argument(const char* name, const DeviceTensor& tensor, const Problem& problem, bool query_side,
                        int columns, int element_bytes, bool output) {
  const bool varlen = problem.varlen();
  const std::int64_t rows = varlen ? (query_side ? problem.cu_seqlens_q.back() : problem.cu_seqlens_k.back())
                                   : (query_side ? problem.seqlen_q : problem.seqlen_k);
  const int heads = query_side ? problem.heads_q : problem.heads_kv;
  return {name, tensor, varlen ? 1 : problem.batch, rows, heads, columns, element_bytes, output};
}

// A varlen problem's device offsets as read-only arguments of batch + 1 ints.
void append_offsets(std::vector<TensorArgument>& arguments, const Problem& problem, const int* cu_seqlens_q,
                    const int* cu_seqlens_k) {
  if (!problem.varlen()) return;
  for (const auto& [name, data] : {std::pair{"cu_seqlens_q", cu_seqlens_q}, std::pair{"cu_seqlens_k", cu_seqlens_k}}) {
    DeviceTensor offsets;
    offsets.data = const_cast<int*>(data);
    offsets.row_stride = 1;
    arguments.push_back({name, offsets, 1, problem.batch + 1LL, 1, 1, static_cast<int>(sizeof(int)), false});
  }
}

constexpr int kLseBytes = static_cast<int>(sizeof(float));

}  // namespace

void require_forward_args(const Problem& problem, const ForwardArgs& args, const char* kernel_name,
                          std::size_t alignment_bytes, int stride_multiple) {
  require_tensor(args.q, "q", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.k, "k", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.v, "v", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.o, "o", kernel_name, alignment_bytes, stride_multiple);
  require_tensor(args.lse, "lse", kernel_name, kLseBytes, 1);
  require_varlen_offsets(problem, args.cu_seqlens_q, args.cu_seqlens_k, kernel_name);
  const int d = problem.head_dim;
  std::vector<TensorArgument> arguments = {
      argument("q", args.q, problem, true, d, kElementBytes, false),
      argument("k", args.k, problem, false, d, kElementBytes, false),
      argument("v", args.v, problem, false, d, kElementBytes, false),
      argument("o", args.o, problem, true, d, kElementBytes, true),
      argument("lse", args.lse, problem, true, 1, kLseBytes, true)};
  append_offsets(arguments, problem, args.cu_seqlens_q, args.cu_seqlens_k);
  require_tensor_arguments(arguments.data(), arguments.size(), kernel_name);
}

void require_backward_args(const Problem& problem, const BackwardArgs& args, const char* kernel_name,
                           std::size_t alignment_bytes, int stride_multiple) {
  const struct {
    const DeviceTensor* tensor;
    const char* name;
    bool query_side, output;
  } tensors[] = {{&args.q, "q", true, false},  {&args.k, "k", false, false}, {&args.v, "v", false, false},
                 {&args.o, "o", true, false},  {&args.d_o, "d_o", true, false}, {&args.dq, "dq", true, true},
                 {&args.dk, "dk", false, true}, {&args.dv, "dv", false, true}};
  std::vector<TensorArgument> arguments;
  for (const auto& entry : tensors) {
    require_tensor(*entry.tensor, entry.name, kernel_name, alignment_bytes, stride_multiple);
    arguments.push_back(
        argument(entry.name, *entry.tensor, problem, entry.query_side, problem.head_dim, kElementBytes, entry.output));
  }
  require_tensor(args.lse, "lse", kernel_name, kLseBytes, 1);
  arguments.push_back(argument("lse", args.lse, problem, true, 1, kLseBytes, false));
  require_varlen_offsets(problem, args.cu_seqlens_q, args.cu_seqlens_k, kernel_name);
  append_offsets(arguments, problem, args.cu_seqlens_q, args.cu_seqlens_k);
  require_tensor_arguments(arguments.data(), arguments.size(), kernel_name);
}

void require_grid(const char* kernel_name, GridDimension x, GridDimension y, GridDimension z) {
  // CUDA C++ Programming Guide, technical specifications: grid dimensions x, y, z.
  constexpr std::int64_t kMaxGridX = (1LL << 31) - 1, kMaxGridYZ = 65535;
  const std::pair<GridDimension, std::int64_t> dimensions[] = {{x, kMaxGridX}, {y, kMaxGridYZ}, {z, kMaxGridYZ}};
  const char* axis_names[] = {"x", "y", "z"};
  for (int axis = 0; axis < 3; ++axis) {
    const auto& [dimension, limit] = dimensions[axis];
    if (dimension.blocks > limit) {
      refuse(kernel_name, std::string(dimension.counts) + " = " + std::to_string(dimension.blocks) + " (grid dimension " +
                              axis_names[axis] + "); allowed: at most " + std::to_string(limit) + " for this kernel");
    }
  }
}

int require_int_blocks(const char* kernel_name, const char* counts, std::int64_t x, std::int64_t y, std::int64_t z) {
  const std::int64_t blocks = checked_product((std::string(kernel_name) + ": " + counts).c_str(), x, y, z);
  if (blocks > INT_MAX) {
    refuse(kernel_name, std::string(counts) + " = " + std::to_string(blocks) + "; allowed: at most " + std::to_string(INT_MAX));
  }
  return static_cast<int>(blocks);
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
  }
}

int current_device_sm_count() {
  int device = 0, sm_count = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return sm_count;
}

}  // namespace flashlab::kernels
