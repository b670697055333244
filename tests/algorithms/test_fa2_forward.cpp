#include "algorithms/04_fa2_forward.hpp"
#include "algorithms/run_schedule.hpp"
#include "catch.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

void check_fa2_against_oracle(const Problem& problem, BlockTiling tiling) {
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = reference::random_inputs(problem, seed, false);
  run_per_head(problem, tensors, 0, [&](auto& mem, const HeadProblem& head, const HeadTensors& x) {
    fa2_forward(mem, head, tiling, x);
  });
  const OracleResult oracle = oracle_attention(problem, tensors);
  const auto o_error = reference::compare(tensors.O, oracle.O);
  const auto lse_error = reference::compare(tensors.LSE, oracle.LSE);
  INFO(reference::describe(problem) << ", Br " << tiling.block_rows << ", Bc " << tiling.block_cols << ", seed " << seed);
  INFO(o_error.describe("O") << "\n" << lse_error.describe("LSE"));
  CHECK(o_error.nan_count == 0);
  CHECK(o_error.max_error < 1e-4);
  CHECK(lse_error.max_error < 1e-4);
}

}  // namespace

TEST_CASE("FA2 forward matches the oracle on odd shapes and masks", "[fa2]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 203}, {128, 217}, {1, 1}, {239, 1}, {799, 3}}));
  const bool causal = GENERATE(false, true);
  Problem problem;
  problem.batch = 2;
  problem.heads_q = 4;
  problem.heads_kv = 2;
  problem.seqlen_q = seqlen_q;
  problem.seqlen_k = seqlen_k;
  problem.head_dim = 59;
  problem.mask.causal = causal;
  check_fa2_against_oracle(problem, {48, 40});
}
