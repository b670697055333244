// The model's choices where the papers and the kernels differ, each counted by hand: FA1 with
// causal blocks masked (the paper) or skipped (the kernel), the FA2 backward's dQ by
// read-modify-write (the paper) or atomics (the kernel), and the lower bound held to the
// compulsory traffic with a warning outside the theorem's range of M.
#include <algorithm>
#include <cmath>
#include <string>

#include "catch.hpp"
#include "sim/bounds.hpp"
#include "sim/closed_forms.hpp"
#include "sim/schedules.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

// One head, N = 256, d = 32, fp32, blocks 64 x 64: Tr = Tc = 4.
Problem square_problem(bool causal) {
  Problem p;
  p.seqlen_q = 256;
  p.seqlen_k = 256;
  p.head_dim = 32;
  p.mask.causal = causal;
  return p;
}

double max_difference(const HostTensor& a, const HostTensor& b) {
  REQUIRE(a.values.size() == b.values.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.values.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::abs(a.values[i] - b.values[i])));
  return worst;
}

}  // namespace

TEST_CASE("FA1 as the paper writes it masks causal blocks; fa1_skip skips them as the kernel does", "[sim][fa1][causal]") {
  RunOptions options;
  options.blocks = {64, 64};
  const Counters paper = run_schedule("fa1", square_problem(true), options).counters;
  const Counters skip = run_schedule("fa1_skip", square_problem(true), options).counters;
  // Causal 4 x 4 blocks: the 10 on or below the diagonal hold a visible score. The paper's
  // schedule visits all 16 (pairs i, j), the skipping one 10; each visit reads Q_i (64 x 32) and
  // the fp32 O_i (64 x 32). Every key block has a visible query block, so K is read once.
  const std::int64_t tile = 64 * 32;
  CHECK(paper[TensorId::Q].hbm_read_elements == 16 * tile);
  CHECK(skip[TensorId::Q].hbm_read_elements == 10 * tile);
  CHECK(paper[TensorId::O].hbm_read_elements == 16 * tile);
  CHECK(skip[TensorId::O].hbm_read_elements == 10 * tile);
  CHECK(skip[TensorId::K].hbm_read_elements == 256 * 32);
  CHECK(skip.matmul_flops == 10 * 2LL * 64 * 64 * (32 + 32));
  // Unmasked, nothing is hidden: the two count the same.
  CHECK(run_schedule("fa1_skip", square_problem(false), options).counters ==
        run_schedule("fa1", square_problem(false), options).counters);
  // And the skipping schedule computes attention: FA2's output, in data runs.
  options.memory = MemoryKind::data;
  const RunResult skipped = run_schedule("fa1_skip", square_problem(true), options);
  const RunResult fa2 = run_schedule("fa2", square_problem(true), options);
  CHECK(max_difference(skipped.tensors.O, fa2.tensors.O) < 1e-5);
}

TEST_CASE("the FA2 backward's dQ: read-modify-write in HBM, or atomic adds that never read it", "[sim][fa2_backward][dq]") {
  RunOptions options;
  options.blocks = {64, 64};
  const Problem problem = square_problem(false);
  const Counters rmw = run_schedule("fa2_backward", problem, options).counters;
  const Counters atomic = run_schedule("fa2_backward_atomic", problem, options).counters;
  // fp32, so dQ is its own accumulator (no conversion pass): zeroed once (Nq d written), then
  // each of the Tc = 4 key blocks adds to every query block. Read-modify-write reads and writes
  // 4 Nq d; atomics only write it.
  const std::int64_t nq_d = 256 * 32;
  CHECK(rmw[TensorId::dQ].hbm_read_elements == 4 * nq_d);
  CHECK(rmw[TensorId::dQ].hbm_write_elements == 5 * nq_d);
  CHECK(atomic[TensorId::dQ].hbm_read_elements == 0);
  CHECK(atomic[TensorId::dQ].hbm_write_elements == 5 * nq_d);
  CHECK(rmw.hbm_bytes() - atomic.hbm_bytes() == 4 * nq_d * 4);  // nothing else changes
  // Same gradients, in data runs on the same inputs.
  options.memory = MemoryKind::data;
  const RunResult a = run_schedule("fa2_backward", problem, options);
  const RunResult b = run_schedule("fa2_backward_atomic", problem, options);
  CHECK(max_difference(a.tensors.dQ, b.tensors.dQ) < 1e-5);
  CHECK(max_difference(a.tensors.dK, b.tensors.dK) == 0);
}

TEST_CASE("the lower bound never undercuts the compulsory traffic, and M outside d..N d is warned of", "[sim][bounds]") {
  Problem problem;
  problem.seqlen_q = problem.seqlen_k = 1024;
  problem.head_dim = 64;
  problem.dtype = DType::bf16;
  const double compulsory = 4.0 * 1024 * 64;  // Q, K, V read, O written: 4 N d = 262144 elements
  // M = 2 N d elements (256 KiB of bf16): N^2 d^2 / M = N d / 2 = 32768, below the compulsory 4 N d.
  const std::int64_t large = 2LL * 1024 * 64 * 2;
  const Bound above = lower_bound(problem, large);
  CHECK(above.elements == compulsory);
  CHECK(above.warning.find("above N d") != std::string::npos);
  CHECK(schedule_bound("fa2", problem, large).warning == above.warning);
  // A counted run stays at or above it.
  RunOptions options;
  options.sram_bytes = large;
  CHECK(static_cast<double>(run_schedule("fa2", problem, options).counters.hbm_bytes()) / 2 >= above.elements);
  // M = 96 KiB = 48K elements, inside [d, N d]: N^2 d^2 / M = 87381.3 is still below 4 N d, so
  // the compulsory traffic is the bound, with no warning.
  const Bound inside = lower_bound(problem, 96 * 1024);
  CHECK(inside.elements == compulsory);
  CHECK(inside.warning.empty());
  CHECK(schedule_bound("fa2", problem, 96 * 1024).warning.empty());
  // M = 16 KiB = 8192 elements (d^2 <= M < N d / 4): N^2 d^2 / M = 524288 is above it and stands.
  CHECK(lower_bound(problem, 16 * 1024).elements == 1024.0 * 1024 * 64 * 64 / 8192);
  // M = 32 elements < d = 64: below the range.
  CHECK(lower_bound(problem, 64).warning.find("below d") != std::string::npos);
  CHECK(schedule_bound("standard", problem, 64).warning.empty());  // standard's bound holds for every M
}

TEST_CASE("block sizes: the paper's rule as written, or the fitting rule, and a run says which", "[sim][tiling][block_rule]") {
  Problem problem;
  problem.seqlen_q = problem.seqlen_k = 2048;
  problem.head_dim = 128;
  problem.dtype = DType::bf16;
  const std::int64_t m_bytes = 228 * 1024;  // 116736 bf16 elements
  // FA1 Algorithm 1, line 1: Bc = ceil(116736 / (4 x 128)) = 228, Br = min(228, 128) = 128.
  CHECK(derive_blocks("fa1", problem, m_bytes, BlockRule::paper) == BlockSizes{128, 228, 0});
  // Fitting: the working set 2 (b 256 + r 128 + 2 r b + r 128) + 4 r 128 + 36 r (r = min(b, 128))
  // is 231192 B at b = 114 and 233680 B > 233472 B at b = 115: square 114 x 114 blocks.
  CHECK(derive_blocks("fa1", problem, m_bytes) == BlockSizes{114, 114, 0});
  // FA2 swaps the roles: Br = 228, Bc = 128 under the paper's rule.
  CHECK(derive_blocks("fa2", problem, m_bytes, BlockRule::paper) == BlockSizes{228, 128, 0});

  RunOptions options;
  options.sram_bytes = m_bytes;
  const RunResult fitting = run_schedule("fa1", problem, options);
  CHECK(fitting.block_rule == "fitting");
  CHECK(fitting.arena_bytes == m_bytes);
  options.block_rule = BlockRule::paper;
  const RunResult paper = run_schedule("fa1", problem, options);
  CHECK(paper.block_rule == "paper");
  CHECK(paper.blocks == BlockSizes{128, 228, 0});
  // The paper's blocks hold more than M: K, V 228 x 256, Q 128 x 128, S and P 2 x 128 x 228
  // (bf16), O fp32 and bf16 128 x 128 x 6 B, nine fp32 rows of 128: 2 (58368 + 16384 + 58368) +
  // 98304 + 4608 = 369152 B. The arena grows to it. The peak is one fp32 row of 128 less
  // (368640 B): LSE is made only on a query block's last visit, and 2048 = 8 x 228 + 224 makes
  // that visit's key block shorter.
  CHECK(paper.arena_bytes == 369152);
  CHECK(paper.counters.sram_peak_bytes == 369152 - 128 * 4);
  CHECK(paper.counters.hbm_bytes() < fitting.counters.hbm_bytes());  // fewer, larger key blocks
  options.blocks = {64, 64};
  CHECK(run_schedule("fa1", problem, options).block_rule == "given");
  CHECK_THROWS_AS(block_rule_from_string("square"), std::invalid_argument);
}
