// FA2-generation forward: the host side. Checks what the kernel can do, fills its parameters
// from the Problem and the device tensors, and dispatches to the instance for the padded head
// dim (32, 64, ..., 256) and the dtype, which picks its tiling for the shared-memory limit. The
// kernel is in 02_fa2_forward_kernel.cuh.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/02_fa2_forward_kernel.cuh"
#include "kernels/attention_api.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa2_forward";

template <typename T>
void dispatch_head_dim(int padded_head_dim, const Fa2ForwardParams& params, int batch, int shared_bytes_limit,
                       cudaStream_t stream) {
  switch (padded_head_dim) {
    case 32: return launch_fa2_forward<T, 32>(params, batch, shared_bytes_limit, stream);
    case 64: return launch_fa2_forward<T, 64>(params, batch, shared_bytes_limit, stream);
    case 96: return launch_fa2_forward<T, 96>(params, batch, shared_bytes_limit, stream);
    case 128: return launch_fa2_forward<T, 128>(params, batch, shared_bytes_limit, stream);
    case 160: return launch_fa2_forward<T, 160>(params, batch, shared_bytes_limit, stream);
    case 192: return launch_fa2_forward<T, 192>(params, batch, shared_bytes_limit, stream);
    case 224: return launch_fa2_forward<T, 224>(params, batch, shared_bytes_limit, stream);
    case 256: return launch_fa2_forward<T, 256>(params, batch, shared_bytes_limit, stream);
  }
  throw std::logic_error("fa2_forward: no instance for padded head dim " + std::to_string(padded_head_dim));
}

}  // namespace

void fa2_forward(const Problem& problem, const ForwardArgs& args) {
  fa2_forward_within(problem, args, std::numeric_limits<int>::max());  // the device's own limit
}

void fa2_forward_within(const Problem& problem, const ForwardArgs& args, int shared_bytes_limit) {
  require_kernel_supported(problem, kName);
  if (problem.head_dim < 32 || problem.head_dim > 256 || problem.head_dim % 8 != 0) {
    throw std::invalid_argument(std::string(kName) + ": head_dim = " + std::to_string(problem.head_dim) +
                                " is not supported; allowed: multiples of 8 in [32, 256]");
  }
  require_compute_capability(8, 0, kName);
  // cp.async moves 16 bytes: pointers 16-byte aligned, strides multiples of 8 elements.
  require_forward_args(problem, args, kName, 16, 8);

  Fa2ForwardParams params{};
  params.q = args.q.data, params.k = args.k.data, params.v = args.v.data, params.o = args.o.data;
  params.lse = static_cast<float*>(args.lse.data);
  params.q_batch_stride = args.q.batch_stride, params.q_row_stride = args.q.row_stride, params.q_head_stride = args.q.head_stride;
  params.k_batch_stride = args.k.batch_stride, params.k_row_stride = args.k.row_stride, params.k_head_stride = args.k.head_stride;
  params.v_batch_stride = args.v.batch_stride, params.v_row_stride = args.v.row_stride, params.v_head_stride = args.v.head_stride;
  params.o_batch_stride = args.o.batch_stride, params.o_row_stride = args.o.row_stride, params.o_head_stride = args.o.head_stride;
  params.lse_batch_stride = args.lse.batch_stride, params.lse_row_stride = args.lse.row_stride;
  params.lse_head_stride = args.lse.head_stride;
  params.cu_seqlens_q = problem.varlen() ? args.cu_seqlens_q : nullptr;
  params.cu_seqlens_k = problem.varlen() ? args.cu_seqlens_k : nullptr;
  params.seqlen_q = problem.seqlen_q, params.seqlen_k = problem.seqlen_k;
  params.heads_q = problem.heads_q, params.group_size = problem.group_size();
  params.head_dim = problem.head_dim;
  params.scale_log2 = static_cast<float>(problem.scale() * M_LOG2E);
  params.bottom_right = problem.mask.alignment == CausalAlignment::bottom_right ? 1 : 0;
  params.window_left = problem.mask.window_left;
  params.window_right = problem.mask.effective_window_right();
  params.reverse_blocks = problem.mask.causal ? 1 : 0;

  const int padded_head_dim = (problem.head_dim + 31) / 32 * 32;
  const int limit = std::min(shared_bytes_limit, max_shared_bytes_per_block());
  if (problem.dtype == DType::bf16) {
    dispatch_head_dim<__nv_bfloat16>(padded_head_dim, params, problem.batch, limit, args.stream);
  } else {
    dispatch_head_dim<__half>(padded_head_dim, params, problem.batch, limit, args.stream);
  }
}

}  // namespace flashlab::kernels
