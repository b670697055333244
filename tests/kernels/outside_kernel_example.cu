// docs/reference_tests.md's example of an outside kernel (test_reference_example.cpp checks it). The kernel is deliberately simple (one thread per query row and
// head, two passes over the keys, fp32 math); it supports causal masks in both alignments,
// GQA/MQA and varlen, and refuses sliding windows by name. A copy with an off-by-one planted in
// the causal mask (query i also sees key i + offset + 1) must fail with a readable report.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <type_traits>
#include <stdexcept>
#include <string>

#include "kernels/attention_api.hpp"
#include "outside_kernel_example.hpp"

namespace flashlab::example {

namespace {

constexpr int kMaxHeadDim = 256;

template <typename T>
__device__ float load(const void* base, std::int64_t index) {
  if constexpr (sizeof(T) == 2 && std::is_same_v<T, __half>) {
    return __half2float(static_cast<const __half*>(base)[index]);
  } else {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  }
}

template <typename T>
__device__ void store(void* base, std::int64_t index, float value) {
  if constexpr (std::is_same_v<T, __half>) {
    static_cast<__half*>(base)[index] = __float2half_rn(value);
  } else {
    static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
  }
}

struct NaiveParams {
  kernels::ForwardArgs args;
  int seqlen_q, seqlen_k, heads_q, group_size, head_dim;
  float scale;
  bool causal, bottom_right;
  int planted_off_by_one;  // 0: correct; 1: the causal mask lets each query see one key too many
};

template <typename T>
__global__ void naive_attention_kernel(const NaiveParams p) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x, head = blockIdx.y, batch = blockIdx.z;
  int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
  std::int64_t q_row0 = 0, k_row0 = 0;  // the sequence's first row (varlen) ...
  std::int64_t q_batch = batch * p.args.q.batch_stride, k_batch = batch * p.args.k.batch_stride;
  std::int64_t v_batch = batch * p.args.v.batch_stride, o_batch = batch * p.args.o.batch_stride;
  std::int64_t lse_batch = batch * p.args.lse.batch_stride;
  if (p.args.cu_seqlens_q != nullptr) {
    q_row0 = p.args.cu_seqlens_q[batch], k_row0 = p.args.cu_seqlens_k[batch];
    seqlen_q = p.args.cu_seqlens_q[batch + 1] - q_row0, seqlen_k = p.args.cu_seqlens_k[batch + 1] - k_row0;
    q_batch = k_batch = v_batch = o_batch = lse_batch = 0;
  }
  if (row >= seqlen_q) return;
  const int kv_head = head / p.group_size;
  const std::int64_t q_at = q_batch + (q_row0 + row) * p.args.q.row_stride + head * p.args.q.head_stride;
  const int offset = p.bottom_right ? seqlen_k - seqlen_q : 0;
  auto visible = [&](int key) { return !p.causal || key <= row + offset + p.planted_off_by_one; };
  auto score = [&](int key) {
    const std::int64_t k_at = k_batch + (k_row0 + key) * p.args.k.row_stride + kv_head * p.args.k.head_stride;
    float dot = 0.f;
    for (int c = 0; c < p.head_dim; ++c) dot += load<T>(p.args.q.data, q_at + c) * load<T>(p.args.k.data, k_at + c);
    return dot * p.scale;
  };
  float row_max = -INFINITY;
  for (int key = 0; key < seqlen_k; ++key)
    if (visible(key)) row_max = fmaxf(row_max, score(key));
  float sum = 0.f, acc[kMaxHeadDim] = {};
  for (int key = 0; key < seqlen_k; ++key) {
    if (!visible(key)) continue;
    const float weight = __expf(score(key) - row_max);
    sum += weight;
    const std::int64_t v_at = v_batch + (k_row0 + key) * p.args.v.row_stride + kv_head * p.args.v.head_stride;
    for (int c = 0; c < p.head_dim; ++c) acc[c] += weight * load<T>(p.args.v.data, v_at + c);
  }
  const std::int64_t o_at = o_batch + (q_row0 + row) * p.args.o.row_stride + head * p.args.o.head_stride;
  for (int c = 0; c < p.head_dim; ++c) store<T>(p.args.o.data, o_at + c, sum > 0 ? acc[c] / sum : 0.f);
  static_cast<float*>(p.args.lse.data)[lse_batch + (q_row0 + row) * p.args.lse.row_stride + head * p.args.lse.head_stride] =
      sum > 0 ? row_max + logf(sum) : -INFINITY;
}

}  // namespace

void naive_attention(const Problem& problem, const kernels::ForwardArgs& args, int planted_off_by_one) {
  if (problem.mask.window_left >= 0 || problem.mask.window_right >= 0) {
    throw std::invalid_argument("naive_attention: sliding windows are not supported; allowed: window_left = window_right = -1");
  }
  if (problem.head_dim > kMaxHeadDim) {
    throw std::invalid_argument("naive_attention: head_dim = " + std::to_string(problem.head_dim) + "; allowed: <= 256");
  }
  NaiveParams params{args, problem.seqlen_q, problem.seqlen_k, problem.heads_q, problem.group_size(), problem.head_dim,
                     static_cast<float>(problem.scale()), problem.mask.causal,
                     problem.mask.alignment == CausalAlignment::bottom_right, planted_off_by_one};
  const dim3 grid((problem.seqlen_q + 127) / 128, problem.heads_q, problem.batch);
  if (problem.dtype == DType::bf16) {
    naive_attention_kernel<__nv_bfloat16><<<grid, 128, 0, args.stream>>>(params);
  } else {
    naive_attention_kernel<__half><<<grid, 128, 0, args.stream>>>(params);
  }
}

}  // namespace flashlab::example
