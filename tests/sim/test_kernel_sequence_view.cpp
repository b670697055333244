// The kernels' per-sequence view (kernels/common/attention_params.hpp) on the CPU: its two forms
// of a sequence's start (element offsets, and the (batch, position) pair) agree with each other
// and with the Problem's rows, for fixed-length and varlen batches, and its mask rule is the
// CPU schedules' (HeadProblem::mask_rule).
#include <vector>

#include "algorithms/problem.hpp"
#include "catch.hpp"
#include "kernels/common/attention_params.hpp"

using namespace flashlab;
using kernels::AttentionParams;
using kernels::DeviceTensor;
using kernels::SequenceView;

namespace {

// The flash-attention layout [rows, heads, dim] of a problem's query or key side.
DeviceTensor layout(const Problem& problem, int heads, int dim, bool query_side) {
  const int seqlen = query_side ? problem.seqlen_q : problem.seqlen_k;
  return {nullptr, problem.varlen() ? 0 : static_cast<std::int64_t>(seqlen) * heads * dim,
          static_cast<std::int64_t>(heads) * dim, dim};
}

AttentionParams params_of(const Problem& problem) {
  AttentionParams p{};
  p.q = layout(problem, problem.heads_q, problem.head_dim, true);
  p.o = p.q;
  p.lse = layout(problem, problem.heads_q, 1, true);
  p.k = layout(problem, problem.heads_kv, problem.head_dim, false);
  p.v = p.k;
  p.cu_seqlens_q = problem.varlen() ? problem.cu_seqlens_q.data() : nullptr;
  p.cu_seqlens_k = problem.varlen() ? problem.cu_seqlens_k.data() : nullptr;
  p.seqlen_q = problem.seqlen_q, p.seqlen_k = problem.seqlen_k;
  p.heads_q = problem.heads_q, p.group_size = problem.group_size(), p.head_dim = problem.head_dim;
  p.bottom_right = problem.mask.alignment == CausalAlignment::bottom_right ? 1 : 0;
  p.window_left = problem.mask.window_left;
  p.window_right = problem.mask.effective_window_right();
  return p;
}

void check_sequences(const Problem& problem) {
  const AttentionParams p = params_of(problem);
  for (int b = 0; b < problem.batch; ++b) {
    INFO("sequence " << b << (problem.varlen() ? " (varlen)" : ""));
    const SequenceView s = kernels::sequence_view(p, b);
    CHECK(s.seqlen_q == problem.seqlen_q_of(b));
    CHECK(s.seqlen_k == problem.seqlen_k_of(b));
    CHECK(s.first_row_q == problem.first_row_q(b));
    // Position 0 of the sequence is packed row first_row_q(b) of the [rows, heads, dim] layout.
    const std::int64_t q_row = static_cast<std::int64_t>(problem.first_row_q(b)) * p.q.row_stride;
    const std::int64_t k_row = static_cast<std::int64_t>(problem.first_row_k(b)) * p.k.row_stride;
    CHECK(s.q_start == q_row);
    CHECK(s.k_start == k_row);
    CHECK(s.lse_start == static_cast<std::int64_t>(problem.first_row_q(b)) * p.lse.row_stride);
    CHECK(p.q.offset(s.batch, s.position_q, 3, 1) == s.q_start + 3 * p.q.row_stride + p.q.head_stride);
    CHECK(p.k.offset(s.batch, s.position_k, 2, 0) == s.k_start + 2 * p.k.row_stride);
    const MaskRule rule = kernels::mask_rule(p, s);
    const MaskRule expected = head_problem(problem, b, 0).mask_rule();
    CHECK(rule.offset == expected.offset);
    CHECK(rule.left == expected.left);
    CHECK(rule.right == expected.right);
    CHECK(rule.seqlen_q == expected.seqlen_q);
    CHECK(rule.seqlen_k == expected.seqlen_k);
  }
}

}  // namespace

TEST_CASE("kernel sequence view: fixed-length and varlen sequences start where the Problem's rows do",
          "[sim][kernel_params]") {
  Problem problem;
  problem.batch = 3, problem.heads_q = 4, problem.heads_kv = 2, problem.head_dim = 40;
  problem.seqlen_q = 37, problem.seqlen_k = 53;
  problem.mask.causal = true;
  problem.mask.window_left = 5;
  problem.validate();
  check_sequences(problem);

  set_varlen(problem, {7, 1, 30}, {12, 9, 2});
  problem.mask.alignment = CausalAlignment::top_left;
  problem.validate();
  check_sequences(problem);
}
