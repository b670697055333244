// The FA2 rung's backward, host side: checks, the workspace layout, the parameters, and the three
// kernels of backward_kernel.cuh launched for the padded head dim's tiling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>

#include "algorithms/checked_math.hpp"
#include "kernels/02_fa2_sm80/backward_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/backward_workspace.hpp"
#include "kernels/common/dispatch.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa2_backward";
constexpr int kMaxSupportedHeadDim = fa2::kBackwardHeadDims[std::size(fa2::kBackwardHeadDims) - 1];

// The workspace (kernels/common/backward_workspace.hpp); the deterministic counters per query block
// of the smallest tiling's rows.
BackwardWorkspaceLayout workspace_layout(const Problem& problem, bool deterministic) {
  return backward_workspace_layout(problem, fa2::backward_padded_head_dim(problem.head_dim), fa2::kDqRowPadding,
                                   fa2::kMinBackwardBlockM, deterministic, kName);
}

// The shared memory one block of the main kernel takes at this head dim on a device of this
// compute capability: the kernel stages dQ for bulk reductions exactly when built for sm_90 or newer.
template <int kHeadDim>
std::size_t backward_shared_bytes(int compute_major) {
  using Tiling = fa2::BackwardTilingFor<kHeadDim>;
  return Tiling::smem_bytes(Tiling::kBulkDq && compute_major >= 9);
}

template <typename Element, int kHeadDim>
void launch_backward(fa2::BackwardParams params, std::size_t smem_bytes, cudaStream_t stream) {
  using Tiling = fa2::BackwardTilingFor<kHeadDim>;
  params.query_blocks = (params.seqlen_q + Tiling::kBlockM - 1) / Tiling::kBlockM;
  {
    const std::int64_t threads = checked_product("fa2_backward: preprocess threads", params.total_rows_q, params.heads_q,
                                                 fa2::kPreprocessLanesPerRow);
    const int blocks = static_cast<int>((threads + fa2::kBackwardAuxThreads - 1) / fa2::kBackwardAuxThreads);
    fa2::backward_preprocess_kernel<Element, kHeadDim><<<blocks, fa2::kBackwardAuxThreads, 0, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa2_backward preprocess launch");
  }
  {
    auto kernel = fa2::backward_main_kernel<Element, Tiling>;
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes)),
               "fa2_backward cudaFuncSetAttribute");
    const dim3 grid((params.seqlen_k + Tiling::kBlockN - 1) / Tiling::kBlockN, params.heads_kv, params.batch);
    kernel<<<grid, Tiling::kThreads, smem_bytes, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa2_backward main launch");
  }
  {
    const dim3 grid(params.query_blocks, params.heads_q, params.batch);
    fa2::backward_convert_dq_kernel<Element, Tiling><<<grid, fa2::kBackwardAuxThreads, 0, stream>>>(params);
    check_cuda(cudaGetLastError(), "fa2_backward convert launch");
  }
}

template <typename Element>
void dispatch(const fa2::BackwardParams& params, std::size_t smem_bytes, cudaStream_t stream) {
  const bool launched = dispatch_head_dim<fa2::kBackwardHeadDims>(
      fa2::backward_padded_head_dim(params.head_dim),
      [&]<int kHeadDim>() { launch_backward<Element, kHeadDim>(params, smem_bytes, stream); });
  if (!launched) {
    throw std::invalid_argument("fa2_backward: head_dim = " + std::to_string(params.head_dim) +
                                " is not supported; allowed: multiples of 8 up to " +
                                std::to_string(kMaxSupportedHeadDim));
  }
}

[[noreturn]] void refuse_backward(const std::string& message) {
  throw std::invalid_argument(std::string(kName) + ": " + message);
}

}  // namespace

std::size_t fa2_backward_workspace_bytes(const Problem& problem, bool deterministic) {
  return workspace_layout(problem, deterministic).total;
}

void fa2_backward(const Problem& problem, const BackwardArgs& args) {
  require_kernel_supported(problem, kName);
  if (problem.head_dim % kChunkElements != 0 || problem.head_dim > kMaxSupportedHeadDim) {
    refuse_backward("head_dim = " + std::to_string(problem.head_dim) + " is not supported; allowed: multiples of " +
                    std::to_string(kChunkElements) + " up to " + std::to_string(kMaxSupportedHeadDim));
  }
  // 16-byte loads: pointers 16-byte aligned, strides multiples of 8 elements.
  require_backward_args(problem, args, kName, 16, kChunkElements);
  const std::int64_t preprocess_threads =
      static_cast<std::int64_t>(problem.total_rows_q()) * problem.heads_q * fa2::kPreprocessLanesPerRow;
  require_grid(kName, {(preprocess_threads + fa2::kBackwardAuxThreads - 1) / fa2::kBackwardAuxThreads, "rows x heads_q"},
               {problem.heads_q, "heads_q"}, {problem.batch, "batch"});

  const bool deterministic = args.deterministic;
  const BackwardWorkspaceLayout layout = workspace_layout(problem, deterministic);
  if (args.workspace != nullptr && args.workspace_bytes < layout.total) {
    refuse_backward("workspace_bytes = " + std::to_string(args.workspace_bytes) +
                    "; allowed: at least fa2_backward_workspace_bytes() = " + std::to_string(layout.total));
  }
  // The device last: a refused argument makes no CUDA call.
  require_compute_capability(8, 0, kName);
  int device = 0, smem_limit = 0, major = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&smem_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute");
  std::size_t smem_bytes = 0;
  dispatch_head_dim<fa2::kBackwardHeadDims>(fa2::backward_padded_head_dim(problem.head_dim),
                                            [&]<int kHeadDim>() { smem_bytes = backward_shared_bytes<kHeadDim>(major); });
  if (static_cast<std::size_t>(smem_limit) < smem_bytes) {
    refuse_backward("head_dim = " + std::to_string(problem.head_dim) + " needs " + std::to_string(smem_bytes) +
                    " bytes of shared memory per block; this device allows " + std::to_string(smem_limit) +
                    " (allowed: head_dim <= 128 here)");
  }
  cudaStream_t stream = args.stream;
  void* workspace = args.workspace;
  const bool owns_workspace = workspace == nullptr;
  if (owns_workspace) check_cuda(cudaMallocAsync(&workspace, layout.total, stream), "fa2_backward cudaMallocAsync");
  auto* bytes = static_cast<unsigned char*>(workspace);

  fa2::BackwardParams p{};
  static_cast<AttentionParams&>(p) = make_attention_params(problem, args);
  p.d_o = args.d_o, p.dq = args.dq, p.dk = args.dk, p.dv = args.dv;
  p.batch = problem.batch;
  p.heads_kv = problem.heads_kv;
  p.padded_head_dim = fa2::backward_padded_head_dim(problem.head_dim);
  p.total_rows_q = problem.total_rows_q();
  p.rows_pitch = layout.rows_pitch;
  p.scale = static_cast<float>(problem.scale());
  p.deterministic = deterministic;
  p.lse_log2 = reinterpret_cast<float*>(bytes);  // LSE at offset 0
  p.delta = reinterpret_cast<float*>(bytes + layout.delta_offset);
  p.dq_accum = reinterpret_cast<float*>(bytes + layout.dq_offset);
  p.dq_rows = layout.dq_rows;
  p.dq_counters = reinterpret_cast<int*>(bytes + layout.counters_offset);

  if (p.total_rows_q > 0) {
    // The dQ accumulator and the deterministic counters start at zero.
    check_cuda(cudaMemsetAsync(p.dq_accum, 0, layout.total - layout.dq_offset, stream), "fa2_backward workspace memset");
    if (problem.dtype == DType::bf16) {
      dispatch<__nv_bfloat16>(p, smem_bytes, stream);
    } else {
      dispatch<__half>(p, smem_bytes, stream);
    }
  }
  if (owns_workspace) check_cuda(cudaFreeAsync(workspace, stream), "fa2_backward cudaFreeAsync");
}

}  // namespace flashlab::kernels
