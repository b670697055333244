// FA3-generation forward: the host side. Checks what the kernel can do (refusing any device that
// is not compute capability 9.0), describes Q, K, V and O to TMA, fills the kernel's parameters
// from the Problem and dispatches to the instance for the padded head dim and the dtype. The
// kernel is in forward_kernel.cuh.
#include <algorithm>
#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/03_fa3_sm90/forward_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/dispatch.hpp"
#include "kernels/common/tma_host.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa3_forward";

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument(std::string(kName) + ": " + message); }

#ifdef FLASHLAB_HAVE_SM90A
template <typename T>
void dispatch(int padded, const fa3::ForwardParams& params, const Fa3Steps& steps, cudaStream_t stream) {
  const bool launched = dispatch_head_dim<fa3::kForwardHeadDims>(padded, [&]<int kHeadDim>() {
    fa3::launch_fa3_forward<T, kHeadDim>(params, steps, stream);
  });
  if (!launched) throw std::logic_error("fa3_forward: no instance for padded head dim " + std::to_string(padded));
}
#endif

// The step sets forward_launch.cuh instantiates: the default everywhere, the ablation's four
// others at head_dim 128 in bf16 (its launch refuses any other set too, as a backstop).
bool steps_instantiated(int padded_head_dim, DType dtype, const Fa3Steps& steps) {
  constexpr Fa3Steps kAblationSteps[] = {{false, false, false}, {true, false, false}, {true, true, true}, {false, true, false}};
  if (steps == Fa3Steps{}) return true;
  if (padded_head_dim != 128 || dtype != DType::bf16) return false;
  return std::find(std::begin(kAblationSteps), std::end(kAblationSteps), steps) != std::end(kAblationSteps);
}

}  // namespace

void fa3_forward(const Problem& problem, const ForwardArgs& args) { fa3_forward_steps(problem, args, Fa3Steps{}); }

std::size_t fa3_forward_workspace_bytes(const Problem&) { return 16; }

void fa3_forward_steps(const Problem& problem, const ForwardArgs& args, const Fa3Steps& steps) {
  require_kernel_supported(problem, kName);
  constexpr int kMaxHeadDim = fa3::kForwardHeadDims[std::size(fa3::kForwardHeadDims) - 1];
  if (problem.head_dim < kChunkElements || problem.head_dim > kMaxHeadDim || problem.head_dim % kChunkElements != 0) {
    refuse("head_dim = " + std::to_string(problem.head_dim) + " is not supported; allowed: multiples of " +
           std::to_string(kChunkElements) + " in [" + std::to_string(kChunkElements) + ", " + std::to_string(kMaxHeadDim) + "]");
  }
  // TMA: 16-byte aligned tensors, strides in multiples of 16 bytes.
  require_forward_args(problem, args, kName, 16, kChunkElements);
  const int padded = fa3::forward_padded_head_dim(problem.head_dim);
  int block_m = 0, block_n = 0;
  dispatch_head_dim<fa3::kForwardHeadDims>(padded, [&]<int kHeadDim>() {
    block_m = fa3::ForwardTiling<kHeadDim>::kBlockM, block_n = fa3::ForwardTiling<kHeadDim>::kBlockN;
  });
  const long long m_blocks = (static_cast<long long>(problem.seqlen_q) + block_m - 1) / block_m;
  const int tiles = require_int_blocks(kName, "batch x heads_q x query blocks", m_blocks, problem.heads_q, problem.batch);
  if (!steps_instantiated(padded, problem.dtype, steps)) {
    throw std::invalid_argument(
        "fa3_forward_steps: steps {ping_pong " + std::to_string(steps.ping_pong) + ", intra_warpgroup_overlap " +
        std::to_string(steps.intra_warpgroup_overlap) + ", persistent " + std::to_string(steps.persistent) +
        "} are not instantiated for this head dim and dtype; allowed: the default {1,1,0}, or at head_dim 128 in "
        "bf16 the ablation's {0,0,0}, {1,0,0}, {1,1,1} and {0,1,0}");
  }
  if (args.workspace != nullptr && args.workspace_bytes < fa3_forward_workspace_bytes(problem)) {
    refuse("workspace_bytes = " + std::to_string(args.workspace_bytes) +
           "; allowed: >= fa3_forward_workspace_bytes() = " + std::to_string(fa3_forward_workspace_bytes(problem)));
  }
  require_attention_tma_tensors(problem, {{&args.q, problem.heads_q, true, "fa3_forward: q"},
                                          {&args.k, problem.heads_kv, false, "fa3_forward: k"},
                                          {&args.v, problem.heads_kv, false, "fa3_forward: v"},
                                          {&args.o, problem.heads_q, true, "fa3_forward: o"}});
#ifndef FLASHLAB_HAVE_SM90A
  refuse("this build has no sm_90a code; allowed: a build whose CMAKE_CUDA_ARCHITECTURES include 90a");
#endif
  require_compute_capability_exactly(9, 0, kName);  // the device last: a refused argument makes no CUDA call

  fa3::ForwardParams params{};
  static_cast<AttentionParams&>(params) = make_attention_params(problem, args);
  params.q_map = make_tma_map(attention_tma_tensor(args.q, problem, problem.heads_q, true), problem.dtype, 64, 64, "fa3_forward: q");
  params.k_map = make_tma_map(attention_tma_tensor(args.k, problem, problem.heads_kv, false), problem.dtype, 64, block_n,
                              "fa3_forward: k");
  params.v_map = make_tma_map(attention_tma_tensor(args.v, problem, problem.heads_kv, false), problem.dtype, 64, block_n,
                              "fa3_forward: v");
  params.o_map = make_tma_map(attention_tma_tensor(args.o, problem, problem.heads_q, true), problem.dtype, 64, 64, "fa3_forward: o");
  params.order = fa3::forward_tile_order(problem.seqlen_q, problem.seqlen_k, problem.head_dim, problem.heads_q,
                                         problem.heads_kv, problem.batch, problem.mask.causal, block_m);
  params.tiles = tiles;

  // The dynamic scheduler's counter: the caller's workspace or stream-ordered memory, zeroed.
  void* workspace = args.workspace;
  if (workspace == nullptr) {
    check_cuda(cudaMallocAsync(&workspace, fa3_forward_workspace_bytes(problem), args.stream), "fa3_forward: cudaMallocAsync");
  }
  check_cuda(cudaMemsetAsync(workspace, 0, sizeof(int), args.stream), "fa3_forward: cudaMemsetAsync");
  params.tile_counter = static_cast<int*>(workspace);

#ifdef FLASHLAB_HAVE_SM90A
  try {
    if (problem.dtype == DType::bf16) {
      dispatch<__nv_bfloat16>(padded, params, steps, args.stream);
    } else {
      dispatch<__half>(padded, params, steps, args.stream);
    }
  } catch (...) {
    if (args.workspace == nullptr) cudaFreeAsync(workspace, args.stream);
    throw;
  }
  if (args.workspace == nullptr) check_cuda(cudaFreeAsync(workspace, args.stream), "fa3_forward: cudaFreeAsync");
#endif
}

}  // namespace flashlab::kernels
