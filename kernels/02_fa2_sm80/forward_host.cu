// The FA2 rung's forward, host side: checks what the kernel can do, fills its parameters and
// dispatches to the instance for the padded head dim and the dtype, which picks its tiling for
// the device's shared memory (forward_launch.cuh).
#include <algorithm>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/02_fa2_sm80/forward_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/dispatch.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "fa2_forward";

template <typename T>
void dispatch(const fa2::ForwardParams& params, int batch, int shared_bytes_limit, cudaStream_t stream) {
  const int padded_head_dim = fa2::forward_padded_head_dim(params.head_dim);
  const bool launched = dispatch_head_dim<fa2::kForwardHeadDims>(padded_head_dim, [&]<int kHeadDim>() {
    fa2::launch_fa2_forward<T, kHeadDim>(params, batch, shared_bytes_limit, stream);
  });
  if (!launched) throw std::logic_error("fa2_forward: no instance for padded head dim " + std::to_string(padded_head_dim));
}

}  // namespace

void fa2_forward(const Problem& problem, const ForwardArgs& args) {
  fa2_forward_within(problem, args, std::numeric_limits<int>::max());  // the device's own limit
}

void fa2_forward_within(const Problem& problem, const ForwardArgs& args, int shared_bytes_limit) {
  require_kernel_supported(problem, kName);
  constexpr int kMinHeadDim = fa2::kForwardHeadDims[0];
  constexpr int kMaxHeadDim = fa2::kForwardHeadDims[std::size(fa2::kForwardHeadDims) - 1];
  if (problem.head_dim < kMinHeadDim || problem.head_dim > kMaxHeadDim || problem.head_dim % kChunkElements != 0) {
    throw std::invalid_argument(std::string(kName) + ": head_dim = " + std::to_string(problem.head_dim) +
                                " is not supported; allowed: multiples of " + std::to_string(kChunkElements) + " in [" +
                                std::to_string(kMinHeadDim) + ", " + std::to_string(kMaxHeadDim) + "]");
  }
  // cp.async moves 16 bytes: pointers 16-byte aligned, strides multiples of 8 elements.
  require_forward_args(problem, args, kName, 16, kChunkElements);
  require_grid(kName, {problem.seqlen_q, "seqlen_q (query blocks at most)"}, {problem.heads_q, "heads_q"},
               {problem.batch, "batch"});
  require_compute_capability(8, 0, kName);  // the device last: a refused argument makes no CUDA call

  fa2::ForwardParams params{};
  static_cast<AttentionParams&>(params) = make_attention_params(problem, args);
  params.reverse_blocks = fa2::forward_reverses_query_blocks(problem.mask.causal) ? 1 : 0;

  const int limit = std::min(shared_bytes_limit, max_shared_bytes_per_block());
  if (problem.dtype == DType::bf16) {
    dispatch<__nv_bfloat16>(params, problem.batch, limit, args.stream);
  } else {
    dispatch<__half>(params, problem.batch, limit, args.stream);
  }
}

}  // namespace flashlab::kernels
