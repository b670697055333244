// FA3-generation backward: the host side. Checks what the kernel can do (refusing any device that
// is not compute capability 9.0), lays out the workspace, describes Q, K, V and dO to TMA, fills
// the parameters and dispatches to the instance for the padded head dim, the mask (d 128's masked
// variant) and the dtype. The kernels are in backward_kernel.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/03_fa3_sm90/backward_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/backward_workspace.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/tma_host.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa3_backward";
constexpr int kMaxHeadDim = fa3::kBackwardHeadDims[std::size(fa3::kBackwardHeadDims) - 1];

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument(std::string(kName) + ": " + message); }

// The instance a problem runs on (its padded head dim and, at d 128, whether its mask takes the
// masked variant) and that instance's block: query rows (the deterministic counters' blocks, the
// Q, dO, LSE and D boxes), keys (the grid, the K and V boxes), and whether blocks walk key blocks.
struct BlockShape {
  int padded_head_dim;
  bool masked_variant;
  int rows, keys;
  bool persistent;
};
BlockShape block_shape(const Problem& problem) {
  const int padded = fa3::backward_padded_head_dim(problem.head_dim);
  const Mask& mask = problem.mask;
  BlockShape shape{padded,
                   fa3::backward_masked_variant(padded, mask.causal, mask.window_left, mask.window_right, problem.seqlen_q), 0,
                   0, false};
  fa3::visit_backward_instance(shape.padded_head_dim, shape.masked_variant, [&]<int kHeadDim, bool kMaskedVariant>() {
    using Tile = fa3::BackwardTiling<kHeadDim, kMaskedVariant>;
    shape.rows = Tile::kBlockM, shape.keys = Tile::kBlockN, shape.persistent = Tile::kPersistent;
  });
  return shape;
}

// The workspace (kernels/common/backward_workspace.hpp); the deterministic counters per query
// block, and the tile counter where the main kernel is persistent.
BackwardWorkspaceLayout workspace_layout(const Problem& problem, bool deterministic) {
  const BlockShape block = block_shape(problem);
  return backward_workspace_layout(problem, block.padded_head_dim, fa2::kDqRowPadding, block.rows, deterministic, kName,
                                   block.persistent ? 1 : 0);
}

#ifdef FLASHLAB_HAVE_SM90A
template <typename T>
void dispatch(const BlockShape& block, const fa3::BackwardParams& params, cudaStream_t stream) {
  const bool launched = fa3::visit_backward_instance(block.padded_head_dim, block.masked_variant,
                                                     [&]<int kHeadDim, bool kMaskedVariant>() {
                                                       fa3::launch_fa3_backward<T, kHeadDim, kMaskedVariant>(params, stream);
                                                     });
  if (!launched) throw std::logic_error("fa3_backward: no instance for padded head dim " + std::to_string(block.padded_head_dim));
}
#endif

}  // namespace

std::size_t fa3_backward_workspace_bytes(const Problem& problem, bool deterministic) {
  if (fa3::backward_padded_head_dim(problem.head_dim) == 0) return 0;
  return workspace_layout(problem, deterministic).total;
}

void fa3_backward(const Problem& problem, const BackwardArgs& args) {
  require_kernel_supported(problem, kName);
  if (problem.head_dim % kChunkElements != 0 || problem.head_dim > kMaxHeadDim) {
    refuse("head_dim = " + std::to_string(problem.head_dim) + " is not supported; allowed: multiples of " +
           std::to_string(kChunkElements) + " up to " + std::to_string(kMaxHeadDim));
  }
  // TMA: 16-byte aligned tensors, strides in multiples of 16 bytes.
  require_backward_args(problem, args, kName, 16, kChunkElements);
  const BlockShape block = block_shape(problem);
  const std::int64_t preprocess_threads =
      static_cast<std::int64_t>(problem.total_rows_q()) * problem.heads_q * fa2::kPreprocessLanesPerRow;
  const std::int64_t key_blocks = (std::int64_t(problem.seqlen_k) + block.keys - 1) / block.keys;
  require_grid(kName, {key_blocks, "key blocks"}, {problem.heads_kv, "heads_kv"}, {problem.batch, "batch"});
  require_grid(kName, {(preprocess_threads + fa2::kBackwardAuxThreads - 1) / fa2::kBackwardAuxThreads, "rows x heads_q"},
               {problem.heads_q, "heads_q"}, {problem.batch, "batch"});
  require_int_blocks(kName, "batch x heads_kv x key blocks", key_blocks, problem.heads_kv, problem.batch);
  require_attention_tma_tensors(problem, {{&args.q, problem.heads_q, true, "fa3_backward: q"},
                                          {&args.k, problem.heads_kv, false, "fa3_backward: k"},
                                          {&args.v, problem.heads_kv, false, "fa3_backward: v"},
                                          {&args.d_o, problem.heads_q, true, "fa3_backward: d_o"}});
  const bool deterministic = args.deterministic;
  const BackwardWorkspaceLayout layout = workspace_layout(problem, deterministic);
  if (args.workspace != nullptr && args.workspace_bytes < layout.total) {
    refuse("workspace_bytes = " + std::to_string(args.workspace_bytes) +
           "; allowed: at least fa3_backward_workspace_bytes() = " + std::to_string(layout.total));
  }
#ifndef FLASHLAB_HAVE_SM90A
  refuse("this build has no sm_90a code; allowed: a build whose CMAKE_CUDA_ARCHITECTURES include 90a");
#else
  require_compute_capability_exactly(9, 0, kName);  // the device last: a refused argument makes no CUDA call

  cudaStream_t stream = args.stream;
  void* workspace = args.workspace;
  const bool owns_workspace = workspace == nullptr;
  if (owns_workspace) check_cuda(cudaMallocAsync(&workspace, layout.total, stream), "fa3_backward cudaMallocAsync");
  auto* bytes = static_cast<unsigned char*>(workspace);

  fa3::BackwardParams p{};
  static_cast<AttentionParams&>(p) = make_attention_params(problem, args);
  p.d_o = args.d_o, p.dq = args.dq, p.dk = args.dk, p.dv = args.dv;
  p.batch = problem.batch;
  p.heads_kv = problem.heads_kv;
  p.padded_head_dim = block.padded_head_dim;
  p.total_rows_q = problem.total_rows_q();
  p.rows_pitch = layout.rows_pitch;
  p.scale = static_cast<float>(problem.scale());
  p.deterministic = deterministic;
  p.query_blocks = layout.query_blocks;
  p.lse_log2 = reinterpret_cast<float*>(bytes);
  p.delta = reinterpret_cast<float*>(bytes + layout.delta_offset);
  p.dq_accum = reinterpret_cast<float*>(bytes + layout.dq_offset);
  p.dq_rows = layout.dq_rows;
  p.dq_counters = reinterpret_cast<int*>(bytes + layout.counters_offset);
  p.tile_counter = block.persistent ? reinterpret_cast<int*>(bytes + layout.scheduler_offset) : nullptr;
  p.preprocess_zeroes_dq_accum = true;
  p.q_map = make_tma_map(attention_tma_tensor(args.q, problem, problem.heads_q, true), problem.dtype, 64, block.rows,
                         "fa3_backward: q");
  p.do_map = make_tma_map(attention_tma_tensor(args.d_o, problem, problem.heads_q, true), problem.dtype, 64, block.rows,
                          "fa3_backward: d_o");
  p.k_map = make_tma_map(attention_tma_tensor(args.k, problem, problem.heads_kv, false), problem.dtype, 64, block.keys,
                         "fa3_backward: k");
  p.v_map = make_tma_map(attention_tma_tensor(args.v, problem, problem.heads_kv, false), problem.dtype, 64, block.keys,
                         "fa3_backward: v");
  p.order = fa3::backward_tile_order(problem.seqlen_q, problem.seqlen_k, problem.head_dim, problem.heads_q, problem.heads_kv,
                                     problem.batch, problem.mask.causal, deterministic, block.keys);
  try {
    if (p.total_rows_q > 0) {
      p.lse_map = make_tma_rows_map(p.lse_log2, p.rows_pitch, problem.heads_q, block.rows, "fa3_backward: lse");
      p.delta_map = make_tma_rows_map(p.delta, p.rows_pitch, problem.heads_q, block.rows, "fa3_backward: delta");
      // The workspace starts at zero: the LSE and D rows between sequences, which the boxes of a
      // sequence's last query block read, the deterministic counters and the tile counter, by
      // memsets; the dQ accumulator, the bulk of it, by the preprocess as it reads O and dO.
      check_cuda(cudaMemsetAsync(workspace, 0, layout.dq_offset, stream), "fa3_backward workspace memset (rows)");
      if (layout.total > layout.counters_offset) {
        check_cuda(cudaMemsetAsync(bytes + layout.counters_offset, 0, layout.total - layout.counters_offset, stream),
                   "fa3_backward workspace memset (counters)");
      }
      if (problem.dtype == DType::bf16) {
        dispatch<__nv_bfloat16>(block, p, stream);
      } else {
        dispatch<__half>(block, p, stream);
      }
    }
  } catch (...) {
    if (owns_workspace) cudaFreeAsync(workspace, stream);
    throw;
  }
  if (owns_workspace) check_cuda(cudaFreeAsync(workspace, stream), "fa3_backward cudaFreeAsync");
#endif
}

}  // namespace flashlab::kernels
