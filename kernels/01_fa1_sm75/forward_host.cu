// The FA1 rung's forward, host side: checks what the kernel can do, fills its parameters and
// the HBM state of Algorithm 1, and launches the instance for the padded head dim.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "algorithms/checked_math.hpp"
#include "kernels/01_fa1_sm75/forward_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/dispatch.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa1_forward";

template <int kHeadDim>
void launch(const fa1::ForwardParams& params, int batch, int heads, cudaStream_t stream) {
  using Tile = fa1::ForwardTiling<kHeadDim>;
  auto* kernel = &fa1::fa1_forward_kernel<kHeadDim>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "fa1_forward: cudaFuncSetAttribute(shared memory)");
  kernel<<<dim3(heads, batch), Tile::kWarps * kWarpSize, Tile::kSharedBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "fa1_forward kernel launch");
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

}  // namespace

std::size_t fa1_forward_workspace_bytes(const Problem& problem) {
  // O, m and l of every row and head in fp32; checked, so a size past int64 is refused, not wrapped.
  constexpr const char* kWhat = "fa1_forward: workspace bytes (rows x heads_q x (head_dim + 2) x 4)";
  return checked_size(checked_product(kWhat, problem.total_rows_q(), problem.heads_q, problem.head_dim + 2, sizeof(float)),
                      kWhat);
}

void fa1_forward(const Problem& problem, const ForwardArgs& args) {
  require_kernel_supported(problem, kName);
  if (problem.dtype != DType::fp16) {
    throw std::invalid_argument(std::string(kName) + ": dtype " + to_string(problem.dtype) + " is not supported; allowed: fp16");
  }
  if (problem.head_dim > fa1::kForwardMaxHeadDim) {
    throw std::invalid_argument(std::string(kName) + ": head_dim = " + std::to_string(problem.head_dim) +
                                " is not supported; allowed: [1, " + std::to_string(fa1::kForwardMaxHeadDim) + "]");
  }
  require_forward_args(problem, args, kName, 2, 1);
  require_grid(kName, {problem.heads_q, "heads_q"}, {problem.batch, "batch"}, {1, "unused"});
  const std::size_t workspace_bytes = fa1_forward_workspace_bytes(problem);
  if (args.workspace != nullptr && args.workspace_bytes < workspace_bytes) {
    throw std::invalid_argument(std::string(kName) + ": workspace_bytes = " + std::to_string(args.workspace_bytes) +
                                "; allowed: >= fa1_forward_workspace_bytes() = " + std::to_string(workspace_bytes));
  }
  require_compute_capability(7, 5, kName);  // the device last: a refused argument makes no CUDA call

  fa1::ForwardParams params{};
  static_cast<AttentionParams&>(params) = make_attention_params(problem, args);
  bool vector_loads = problem.head_dim % kChunkElements == 0;
  for (const DeviceTensor* tensor : {&args.q, &args.k, &args.v}) {
    vector_loads = vector_loads && aligned16(tensor->data) && tensor->row_stride % kChunkElements == 0 &&
                   tensor->head_stride % kChunkElements == 0 && tensor->batch_stride % kChunkElements == 0;
  }
  params.vector_loads = vector_loads ? 1 : 0;

  void* workspace = args.workspace;
  if (workspace == nullptr) check_cuda(cudaMallocAsync(&workspace, workspace_bytes, args.stream), "fa1_forward: cudaMallocAsync");
  const std::size_t rows = static_cast<std::size_t>(problem.total_rows_q()) * problem.heads_q;
  params.o_state = static_cast<float*>(workspace);
  params.m_state = params.o_state + rows * problem.head_dim;
  params.l_state = params.m_state + rows;

  const int padded_head_dim = fa1::forward_padded_head_dim(problem.head_dim);
  const bool launched = dispatch_head_dim<fa1::kForwardHeadDims>(padded_head_dim, [&]<int kHeadDim>() {
    launch<kHeadDim>(params, problem.batch, problem.heads_q, args.stream);
  });
  if (!launched) throw std::logic_error("fa1_forward: no instance for padded head dim " + std::to_string(padded_head_dim));
  if (args.workspace == nullptr) check_cuda(cudaFreeAsync(workspace, args.stream), "fa1_forward: cudaFreeAsync");
}

}  // namespace flashlab::kernels
