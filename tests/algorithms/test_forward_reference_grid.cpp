// Every forward schedule through the reference-test library (tests/reference/attention_check.hpp):
// its default grid, its independent naive same-precision attention for the 2x rule, its
// determinism check. A second, independent harness for the same claims as
// test_forward_schedules.cpp.
#include <vector>

#include "catch.hpp"
#include "forward_schedules.hpp"
#include "reference/attention_check.hpp"

using namespace flashlab;
using flashlab::testing::ForwardSchedule;

TEST_CASE("every forward schedule passes the reference library's default bf16 grid",
          "[forward][reference_grid]") {
  const ForwardSchedule schedule = GENERATE(from_range(testing::kForwardSchedules));
  const reference::ForwardImplementation implementation = [&](const Problem& problem,
                                                              AttentionTensors& tensors) {
    testing::run_forward(schedule, problem, tensors);
  };
  // The library's grid without its largest score matrices (those run in
  // test_forward_schedules.cpp already), to keep the suite fast.
  std::vector<Problem> grid;
  for (const Problem& problem : reference::default_forward_grid(DType::bf16, {40, 59, 111, 128})) {
    if (static_cast<long long>(problem.seqlen_q) * problem.seqlen_k <= 60000)
      grid.push_back(problem);
  }
  REQUIRE(grid.size() >= 20);
  INFO(grid.size() << " problems");
  const reference::GridResult result = reference::check_forward_grid(implementation, grid);
  INFO(testing::name(schedule) << ":\n" << result.summary());
  CHECK(result.failed == 0);
  CHECK(result.refused == 0);
  CHECK(result.passed == static_cast<int>(grid.size()));
}
