// The backward schedules (05 standard, 06 FA1, 07 FA2) against the oracle's analytic gradients,
// on fresh random inputs, with O and LSE from the FA2 forward.
#include <vector>

#include "backward_check.hpp"
#include "catch.hpp"

using namespace flashlab;
using backward_test::Blocks;
using backward_test::Schedule;

namespace {

constexpr Schedule kAllSchedules[] = {Schedule::standard, Schedule::fa1, Schedule::fa2};

// fp32: the schedules accumulate in fp32 where the oracle uses double; the error grows with the
// gradients' magnitude and the number of terms summed.
constexpr double kFp32RelativeTolerance = 1e-5;

void check_against_oracle(Schedule schedule, const Problem& problem, Blocks blocks) {
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = backward_test::forward_inputs(problem, seed);
  backward_test::run(schedule, problem, &tensors, blocks);
  const OracleResult oracle = oracle_attention(problem, tensors, &tensors.dO);
  const auto errors = backward_test::compare_gradients(tensors, oracle);
  const double tolerance = kFp32RelativeTolerance * std::max(1.0, backward_test::largest_gradient(oracle));
  INFO(backward_test::to_string(schedule) << "\n" << reference::describe(problem) << ", blocks " << blocks.rows << "x"
                                          << blocks.cols << ", seed " << seed << "\n" << errors.describe()
                                          << "\ntolerance " << tolerance);
  CHECK_FALSE(errors.any_nan());
  CHECK(errors.max_error() <= tolerance);
}

}  // namespace

TEST_CASE("Backward schedules match the oracle's gradients on the odd shapes", "[backward]") {
  const auto [seqlen_q, seqlen_k] =
      GENERATE(table<int, int>({{113, 203}, {128, 217}, {1, 1}, {239, 1}, {799, 3}, {108, 256}}));
  const int mask_kind = GENERATE(0, 1, 2);  // none, causal bottom-right, causal top-left
  const Schedule schedule = GENERATE(Schedule::standard, Schedule::fa1, Schedule::fa2);
  Problem problem;
  problem.batch = 2;
  problem.heads_q = 2;
  problem.heads_kv = 1;
  problem.seqlen_q = seqlen_q;
  problem.seqlen_k = seqlen_k;
  problem.head_dim = 59;
  problem.mask.causal = mask_kind != 0;
  problem.mask.alignment = mask_kind == 2 ? CausalAlignment::top_left : CausalAlignment::bottom_right;
  check_against_oracle(schedule, problem, {48, 40});
}
