// FA3-generation forward: the host side. Checks what the kernel can do (refusing any device that
// is not compute capability 9.0), describes Q, K, V and O to TMA, fills the kernel's parameters
// from the Problem and dispatches to the instance for the padded head dim and the dtype. The
// kernel is in forward_kernel.cuh.
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/03_fa3_sm90/forward_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/tma_host.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa3_forward";

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument(std::string(kName) + ": " + message); }

// The padded head dims with an instance (forward_instances/).
int padded_head_dim(int head_dim) {
  for (const int padded : {64, 96, 128, 192, 256}) {
    if (head_dim <= padded) return padded;
  }
  refuse("head_dim = " + std::to_string(head_dim) + " is not supported; allowed: multiples of 8 in [8, 256]");
}

#ifdef FLASHLAB_HAVE_SM90A
template <typename T>
void dispatch_head_dim(int padded, const Fa3ForwardParams& params, const Fa3Steps& steps, cudaStream_t stream) {
  switch (padded) {
    case 64: return launch_fa3_forward<T, 64>(params, steps, stream);
    case 96: return launch_fa3_forward<T, 96>(params, steps, stream);
    case 128: return launch_fa3_forward<T, 128>(params, steps, stream);
    case 192: return launch_fa3_forward<T, 192>(params, steps, stream);
    case 256: return launch_fa3_forward<T, 256>(params, steps, stream);
  }
  throw std::logic_error("fa3_forward: no instance for padded head dim " + std::to_string(padded));
}
#endif

// Q, K, V or O as a 4-D TMA tensor (column, row, head, batch); varlen: one batch of packed rows.
TmaTensor tma_tensor(const DeviceTensor& tensor, const Problem& problem, int heads, bool query_side) {
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

}  // namespace

void fa3_forward(const Problem& problem, const ForwardArgs& args) { fa3_forward_steps(problem, args, Fa3Steps{}); }

std::size_t fa3_forward_workspace_bytes(const Problem&) { return 16; }

void fa3_forward_steps(const Problem& problem, const ForwardArgs& args, const Fa3Steps& steps) {
  require_kernel_supported(problem, kName);
  if (problem.head_dim < 8 || problem.head_dim > 256 || problem.head_dim % 8 != 0) {
    refuse("head_dim = " + std::to_string(problem.head_dim) + " is not supported; allowed: multiples of 8 in [8, 256]");
  }
  require_compute_capability_exactly(9, 0, kName);
  // TMA: 16-byte aligned tensors, strides in multiples of 16 bytes.
  require_forward_args(problem, args, kName, 16, 8);
  const int padded = padded_head_dim(problem.head_dim);
  const Fa3TileShape shape = fa3_forward_tile_shape(padded);
  const long long m_blocks = (static_cast<long long>(problem.seqlen_q) + shape.block_m - 1) / shape.block_m;
  const long long tiles = m_blocks * problem.heads_q * problem.batch;
  if (tiles > INT_MAX) {
    refuse("batch x heads_q x query blocks = " + std::to_string(tiles) + "; allowed: at most " + std::to_string(INT_MAX));
  }

  Fa3ForwardParams params{};
  params.q_map = make_tma_map(tma_tensor(args.q, problem, problem.heads_q, true), problem.dtype, 64, 64, "fa3_forward: q");
  params.k_map = make_tma_map(tma_tensor(args.k, problem, problem.heads_kv, false), problem.dtype, 64, shape.block_n,
                              "fa3_forward: k");
  params.v_map = make_tma_map(tma_tensor(args.v, problem, problem.heads_kv, false), problem.dtype, 64, shape.block_n,
                              "fa3_forward: v");
  params.o_map = make_tma_map(tma_tensor(args.o, problem, problem.heads_q, true), problem.dtype, 64, 64, "fa3_forward: o");
  params.o = args.o.data;
  params.o_row_stride = args.o.row_stride, params.o_head_stride = args.o.head_stride;
  params.o_batch_stride = problem.varlen() ? 0 : args.o.batch_stride;
  params.lse = static_cast<float*>(args.lse.data);
  params.lse_row_stride = args.lse.row_stride, params.lse_head_stride = args.lse.head_stride;
  params.lse_batch_stride = problem.varlen() ? 0 : args.lse.batch_stride;
  params.cu_seqlens_q = problem.varlen() ? args.cu_seqlens_q : nullptr;
  params.cu_seqlens_k = problem.varlen() ? args.cu_seqlens_k : nullptr;
  params.batch = problem.batch, params.heads_q = problem.heads_q, params.group_size = problem.group_size();
  params.seqlen_q = problem.seqlen_q, params.seqlen_k = problem.seqlen_k, params.head_dim = problem.head_dim;
  params.scale_log2 = static_cast<float>(problem.scale() * M_LOG2E);
  params.bottom_right = problem.mask.alignment == CausalAlignment::bottom_right ? 1 : 0;
  params.window_left = problem.mask.window_left;
  params.window_right = problem.mask.effective_window_right();
  params.m_blocks = static_cast<int>(m_blocks);
  params.tiles = static_cast<int>(tiles);
  params.heaviest_first = problem.mask.causal ? 1 : 0;

  // The dynamic scheduler's counter: the caller's workspace or stream-ordered memory, zeroed.
  if (args.workspace != nullptr && args.workspace_bytes < fa3_forward_workspace_bytes(problem)) {
    refuse("workspace_bytes = " + std::to_string(args.workspace_bytes) +
           "; allowed: >= fa3_forward_workspace_bytes() = " + std::to_string(fa3_forward_workspace_bytes(problem)));
  }
  void* workspace = args.workspace;
  if (workspace == nullptr) {
    check_cuda(cudaMallocAsync(&workspace, fa3_forward_workspace_bytes(problem), args.stream), "fa3_forward: cudaMallocAsync");
  }
  check_cuda(cudaMemsetAsync(workspace, 0, sizeof(int), args.stream), "fa3_forward: cudaMemsetAsync");
  params.tile_counter = static_cast<int*>(workspace);

#ifdef FLASHLAB_HAVE_SM90A
  try {
    if (problem.dtype == DType::bf16) {
      dispatch_head_dim<__nv_bfloat16>(padded, params, steps, args.stream);
    } else {
      dispatch_head_dim<__half>(padded, params, steps, args.stream);
    }
  } catch (...) {
    if (args.workspace == nullptr) cudaFreeAsync(workspace, args.stream);
    throw;
  }
  if (args.workspace == nullptr) check_cuda(cudaFreeAsync(workspace, args.stream), "fa3_forward: cudaFreeAsync");
#else
  (void)steps;
  refuse("this build has no sm_90a code; allowed: a build whose CMAKE_CUDA_ARCHITECTURES include 90a");
#endif
}

}  // namespace flashlab::kernels
