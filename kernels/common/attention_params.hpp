// The parameters every kernel of every rung reads, flattened once from a Problem and the host
// API's tensors (make_attention_params), and the per-sequence view a thread block takes of them.
// Each rung's parameter struct derives from AttentionParams and adds its own fields.
#pragma once

#include <cstdint>

#include "algorithms/host_device.hpp"
#include "algorithms/mask_rule.hpp"
#include "kernels/common/device_tensor.hpp"

namespace flashlab {
struct Problem;
}

namespace flashlab::kernels {

struct ForwardArgs;
struct BackwardArgs;

struct AttentionParams {
  DeviceTensor q, k, v, o;
  DeviceTensor lse;               // fp32, one column
  const int* cu_seqlens_q;        // device offsets, batch + 1 each; null unless varlen
  const int* cu_seqlens_k;
  int seqlen_q, seqlen_k;         // fixed lengths (varlen: the maxima)
  int heads_q, group_size;        // query head h reads K/V head h / group_size
  int head_dim;                   // the real head dim (the kernels pad it)
  float scale_log2;               // softmax scale * log2(e)
  int bottom_right;               // causal / window alignment: 1 bottom-right, 0 top-left
  int window_left, window_right;  // -1: unbounded; causal already folded into window_right
};

// Problem -> AttentionParams (defined with the host API, attention_api.cpp): the tensors, the
// varlen offsets (null unless varlen), the shapes, the scale in base 2 and the mask bounds.
AttentionParams make_attention_params(const Problem& problem, const ForwardArgs& args);
AttentionParams make_attention_params(const Problem& problem, const BackwardArgs& args);

// Sequence b of the batch, as a thread block sees it (FA1 Algorithm 1 and FA2 Algorithms 1 and 2
// work on one sequence and head), for fixed-length and varlen batches alike: its lengths and
// where it starts, in two equivalent forms. *_start is the element offset of its position 0
// (head 0) in each of AttentionParams' tensors: b * batch_stride, or its first packed row *
// row_stride for varlen (the forward kernels' addressing). (batch, position_q / position_k) is
// the index pair DeviceTensor::offset takes, for any tensor (the backward's addressing, also of
// the gradients it adds). Each kernel keeps the arithmetic it was tuned with.
struct SequenceView {
  int seqlen_q, seqlen_k;
  std::int64_t first_row_q;  // its first row in [rows, heads] workspaces: b * seqlen_q or packed
  std::int64_t position_q;   // position of the first query: its packed row for varlen, else 0
  std::int64_t position_k;   // the same for the keys
  std::int64_t batch;        // b, or 0 for varlen (packed rows)
  std::int64_t q_start, k_start, v_start, o_start, lse_start;  // offset of position 0, head 0
};

FLASHLAB_HOST_DEVICE SequenceView sequence_view(const AttentionParams& p, int b) {
  SequenceView s;
  // A fixed-length batch ...
  s.seqlen_q = p.seqlen_q, s.seqlen_k = p.seqlen_k;
  s.q_start = b * p.q.batch_stride, s.k_start = b * p.k.batch_stride, s.v_start = b * p.v.batch_stride;
  s.o_start = b * p.o.batch_stride, s.lse_start = b * p.lse.batch_stride;
  s.first_row_q = static_cast<std::int64_t>(b) * p.seqlen_q;
  s.position_q = s.position_k = 0;
  s.batch = b;
  // ... or a varlen one.
  if (p.cu_seqlens_q != nullptr) {
    const int first_q = p.cu_seqlens_q[b], first_k = p.cu_seqlens_k[b];
    s.seqlen_q = p.cu_seqlens_q[b + 1] - first_q;
    s.seqlen_k = p.cu_seqlens_k[b + 1] - first_k;
    s.q_start = first_q * p.q.row_stride, s.o_start = first_q * p.o.row_stride;
    s.lse_start = first_q * p.lse.row_stride;
    s.k_start = first_k * p.k.row_stride, s.v_start = first_k * p.v.row_stride;
    s.first_row_q = first_q;
    s.position_q = first_q;
    s.position_k = first_k;
    s.batch = 0;
  }
  return s;
}

// The causal / window rule within one sequence.
FLASHLAB_HOST_DEVICE MaskRule mask_rule(const AttentionParams& p, const SequenceView& s) {
  return make_mask_rule(p.bottom_right != 0, p.window_left, p.window_right, s.seqlen_q, s.seqlen_k);
}

}  // namespace flashlab::kernels
