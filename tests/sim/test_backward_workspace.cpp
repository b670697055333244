// The backward rungs' workspace layout (kernels/common/backward_workspace.hpp) on the CPU: every
// sequence's LSE and D rows start on 16 bytes (the FA3 rung loads them by TMA, whose innermost
// coordinate must be 16-byte aligned), no two sequences overlap, the last ends within the pitch,
// and the parts start on 256 bytes.
#include <random>
#include <vector>

#include "algorithms/problem.hpp"
#include "catch.hpp"
#include "kernels/common/backward_workspace.hpp"

using flashlab::DType;
using flashlab::Problem;
using flashlab::kernels::backward_rows_first_row;
using flashlab::kernels::backward_workspace_layout;

namespace {

// The sequences' first packed rows and lengths, fixed-length or varlen.
void check_rows(const Problem& problem) {
  const auto layout = backward_workspace_layout(problem, 64, 64, 64, true, "test");
  INFO("batch " << problem.batch << ", total rows " << problem.total_rows_q() << ", pitch " << layout.rows_pitch);
  CHECK(layout.rows_pitch % 4 == 0);
  CHECK(layout.delta_offset % 256 == 0);
  CHECK(layout.dq_offset % 256 == 0);
  CHECK(layout.delta_offset >= static_cast<std::size_t>(layout.rows_pitch * problem.heads_q) * sizeof(float));
  std::int64_t previous_end = 0;
  for (int b = 0; b < problem.batch; ++b) {
    const std::int64_t first = problem.varlen() ? problem.cu_seqlens_q[b] : std::int64_t{b} * problem.seqlen_q;
    const std::int64_t length = problem.varlen() ? problem.cu_seqlens_q[b + 1] - first : problem.seqlen_q;
    const std::int64_t start = backward_rows_first_row(first, b);
    INFO("sequence " << b << " of " << length << " rows at packed row " << first << " starts at " << start);
    CHECK(start % 4 == 0);
    CHECK(start >= previous_end);
    previous_end = start + length;
  }
  CHECK(previous_end <= layout.rows_pitch);
}

}  // namespace

TEST_CASE("backward workspace: sequences of odd lengths start their LSE and D rows on 16 bytes", "[backward_workspace]") {
  Problem p;
  p.dtype = DType::bf16, p.heads_q = 2, p.heads_kv = 1, p.head_dim = 64, p.seqlen_k = 203;
  for (const int seqlen_q : {1, 2, 3, 113, 640}) {
    for (const int batch : {1, 2, 7}) {
      p.batch = batch, p.seqlen_q = seqlen_q;
      check_rows(p);
    }
  }
  // Two sequences of 113 rows: the second starts at packed row 113, in the workspace at 116.
  p.batch = 2, p.seqlen_q = 113;
  CHECK(backward_rows_first_row(113, 1) == 116);
}

TEST_CASE("backward workspace: varlen batches, single-row sequences among them", "[backward_workspace]") {
  std::mt19937 rng(20261202u);
  std::uniform_int_distribution<int> length(1, 300), batch(1, 24), single(0, 3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int> seqlens_q(batch(rng)), seqlens_k;
    for (int& q : seqlens_q) q = single(rng) == 0 ? 1 : length(rng);
    for (std::size_t i = 0; i < seqlens_q.size(); ++i) seqlens_k.push_back(length(rng));
    Problem p;
    p.dtype = DType::bf16, p.heads_q = 3, p.heads_kv = 1, p.head_dim = 64;
    set_varlen(p, seqlens_q, seqlens_k);
    check_rows(p);
  }
}

TEST_CASE("backward workspace: a persistent kernel's scheduler ints follow the counters, cleared with them", "[backward_workspace]") {
  Problem p;
  p.dtype = DType::bf16, p.batch = 3, p.heads_q = 4, p.heads_kv = 2, p.head_dim = 128, p.seqlen_q = 1000, p.seqlen_k = 700;
  for (const bool deterministic : {false, true}) {
    INFO("deterministic " << deterministic);
    const auto without = backward_workspace_layout(p, 128, 128, 64, deterministic, "test");
    const auto with = backward_workspace_layout(p, 128, 128, 64, deterministic, "test", 1);
    // Nothing before them moves; the counters (16 query blocks x 4 heads x 3 sequences when
    // deterministic) end before them, and the caller's clear of [counters_offset, total) covers them.
    CHECK(with.counters_offset == without.counters_offset);
    CHECK(with.scheduler_offset == without.total);
    CHECK(with.scheduler_offset % 256 == 0);
    CHECK(with.scheduler_offset >= with.counters_offset + (deterministic ? 16u * 4 * 3 * sizeof(int) : 0u));
    CHECK(with.total == with.scheduler_offset + 256);
    CHECK(without.scheduler_offset == without.total);
  }
}
