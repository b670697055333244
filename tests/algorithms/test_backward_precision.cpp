// The gradients' precision: the oracle's analytic gradients against central finite differences
// (in double, so this checks the oracle itself), and the low-precision rule for the tiled
// backward schedules in bf16 and fp16.
#include <cmath>
#include <string>
#include <vector>

#include "backward_check.hpp"
#include "catch.hpp"

using namespace flashlab;
using backward_test::Blocks;
using backward_test::Schedule;

namespace {

// Inputs on a grid of 2^-16 within [-4, 4], so that x +- h with h = 2^-14 is exact in float and
// the finite difference sees exactly the perturbation it divides by.
constexpr double kStep = 1.0 / 16384.0;

void put_on_grid(HostTensor& tensor) {
  for (float& value : tensor.values) value = std::ldexp(std::round(std::ldexp(std::clamp(value, -4.0f, 4.0f), 16)), -16);
}

// The scalar loss whose gradient the oracle computes for a given dO: sum(O * dO).
double loss(const Problem& problem, const AttentionTensors& tensors) {
  const OracleResult result = oracle_attention(problem, tensors);
  double sum = 0;
  for (std::size_t i = 0; i < result.O.values.size(); ++i) sum += result.O.values[i] * tensors.dO.values[i];
  return sum;
}

struct FiniteDifferenceReport {
  double max_error = 0;      // max |analytic - finite difference| / (1 + |analytic|)
  double largest_gradient = 0;
  std::string where;
};

void check_tensor(const Problem& problem, AttentionTensors& tensors, HostTensor& input, const OracleTensor& analytic,
                  const char* name, FiniteDifferenceReport& report) {
  REQUIRE(analytic.values.size() == input.values.size());
  for (std::size_t i = 0; i < input.values.size(); ++i) {
    const float original = input.values[i];
    input.values[i] = static_cast<float>(original + kStep);
    const double plus = loss(problem, tensors);
    input.values[i] = static_cast<float>(original - kStep);
    const double minus = loss(problem, tensors);
    input.values[i] = original;
    const double finite_difference = (plus - minus) / (2 * kStep);
    const double error = std::fabs(analytic.values[i] - finite_difference) / (1 + std::fabs(analytic.values[i]));
    report.largest_gradient = std::max(report.largest_gradient, std::fabs(analytic.values[i]));
    if (error > report.max_error) {
      report.max_error = error;
      report.where = std::string(name) + "[" + std::to_string(i) + "]: analytic " + std::to_string(analytic.values[i]) +
                     ", finite difference " + std::to_string(finite_difference);
    }
  }
}

}  // namespace

TEST_CASE("The oracle's gradients match central finite differences of sum(O * dO)", "[backward][oracle]") {
  const std::string feature = GENERATE("plain", "causal, masked rows", "window", "softcap", "alibi", "dropout",
                                       "everything, GQA, varlen");
  Problem problem;
  problem.heads_q = 2;
  problem.heads_kv = 2;
  problem.seqlen_q = 5;
  problem.seqlen_k = 7;
  problem.head_dim = 3;
  problem.head_dim_v = 4;
  if (feature == "causal, masked rows") problem.seqlen_q = 9, problem.mask.causal = true;  // rows 0, 1 masked
  if (feature == "window") problem.mask.window_left = 1, problem.mask.window_right = 2;
  if (feature == "softcap") problem.softcap = 0.8f;  // scores of a few units: tanh well in its curve
  if (feature == "alibi") problem.alibi_slopes = {0.7f, 0.2f};
  if (feature == "dropout") problem.dropout = {0.3f, reference::fresh_seed(), 5};
  if (feature == "everything, GQA, varlen") {
    problem.heads_q = 4;
    problem.heads_kv = 2;
    set_varlen(problem, {6, 2}, {4, 5});
    problem.mask.causal = true;
    problem.mask.window_left = 2;
    problem.softcap = 1.2f;
    problem.alibi_slopes = {0.5f, 0.0f, 0.3f, 0.1f};
    problem.dropout = {0.25f, reference::fresh_seed(), 9};
  }
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = reference::random_inputs(problem, seed, /*with_backward=*/true);
  for (HostTensor* t : {&tensors.Q, &tensors.K, &tensors.V, &tensors.dO}) put_on_grid(*t);
  for (HostTensor* t : {&tensors.Q, &tensors.K}) {  // scores of a few units, so the softmax is not flat
    for (float& value : t->values) value = std::ldexp(std::round(std::ldexp(value * 1.5f, 16)), -16);
  }
  const OracleResult analytic = oracle_attention(problem, tensors, &tensors.dO);

  FiniteDifferenceReport report;
  check_tensor(problem, tensors, tensors.Q, analytic.dQ, "dQ", report);
  check_tensor(problem, tensors, tensors.K, analytic.dK, "dK", report);
  check_tensor(problem, tensors, tensors.V, analytic.dV, "dV", report);
  INFO(feature << ": " << reference::describe(problem) << ", seed " << seed << "\nworst " << report.where);
  CHECK(report.largest_gradient > 0.05);  // the check compares something
  CHECK(report.max_error < 1e-7);
  if (feature == "causal, masked rows") {
    for (int row = 0; row < 2; ++row)
      for (int h = 0; h < problem.heads_q; ++h)
        for (int c = 0; c < problem.head_dim; ++c) CHECK(analytic.dQ.at(row, h, c) == 0.0);
  }
}

TEST_CASE("Backward schedules in bf16 and fp16 meet the low-precision rule", "[backward][precision]") {
  // The rule of the official tests for gradients: max error <= 3 x that of the naive backward in
  // the same precision (05_standard_backward.hpp, every intermediate rounded), + a tiny slack.
  // O and LSE come from the FA2 forward in the same dtype.
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  const std::string feature = GENERATE("plain", "causal GQA", "softcap alibi dropout", "varlen window MQA");
  Problem problem;
  problem.heads_q = 2;
  problem.heads_kv = 2;
  problem.dtype = dtype;
  problem.seqlen_q = 113;
  problem.seqlen_k = 203;
  problem.head_dim = 64;
  if (feature == "causal GQA") {
    problem.seqlen_q = 128, problem.seqlen_k = 217, problem.head_dim = 111;
    problem.heads_q = 4, problem.heads_kv = 2;
    problem.mask.causal = true;
  }
  if (feature == "softcap alibi dropout") {
    problem.head_dim = 40;
    problem.softcap = 3.0f;
    problem.alibi_slopes = {0.25f, 0.5f};
    problem.dropout = {0.15f, reference::fresh_seed(), 11};
  }
  if (feature == "varlen window MQA") {
    set_varlen(problem, {99, 1, 60}, {150, 77, 60});
    problem.heads_q = 3, problem.heads_kv = 1;
    problem.head_dim = 96, problem.head_dim_v = 59;
    problem.mask.window_left = 37, problem.mask.window_right = 5;
  }
  const auto seed = reference::fresh_seed();
  const AttentionTensors inputs = backward_test::forward_inputs(problem, seed);
  const OracleResult oracle = oracle_attention(problem, inputs, &inputs.dO);
  const double slack = 1e-5 * std::max(1.0, backward_test::largest_gradient(oracle));

  AttentionTensors naive_run = inputs;
  backward_test::run(Schedule::standard, problem, &naive_run, {64, 64});
  const auto naive = backward_test::compare_gradients(naive_run, oracle);
  REQUIRE_FALSE(naive.any_nan());
  {
    // The baseline is itself a schedule under test: a low-precision bug in it would loosen the
    // 3x rule for the others. Its error must stay at rounding level: 4 units of the dtype's
    // precision (2^-8 for bf16, 2^-11 for fp16) times the largest gradient; measured at most 1.5.
    const double unit = dtype == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const double baseline_limit = 4 * unit * std::max(1.0, backward_test::largest_gradient(oracle));
    INFO("05 standard backward as the baseline, " << feature << ": " << reference::describe(problem) << ", seed "
                                                  << seed << "\n" << naive.describe() << "\nlimit " << baseline_limit);
    REQUIRE(naive.max_error() <= baseline_limit);
  }

  for (Schedule schedule : {Schedule::fa1, Schedule::fa2}) {
    AttentionTensors run = inputs;
    backward_test::run(schedule, problem, &run, {48, 40});
    const auto errors = backward_test::compare_gradients(run, oracle);
    INFO(backward_test::to_string(schedule) << ", " << feature << ": " << reference::describe(problem) << ", seed "
                                            << seed << "\n" << errors.describe() << "\nnaive:\n" << naive.describe()
                                            << "\nslack " << slack);
    const reference::Tolerance rule{3.0, slack};
    CHECK(reference::within_rule(errors.dQ, naive.dQ.max_error, rule));
    CHECK(reference::within_rule(errors.dK, naive.dK.max_error, rule));
    CHECK(reference::within_rule(errors.dV, naive.dV.max_error, rule));
  }
}
