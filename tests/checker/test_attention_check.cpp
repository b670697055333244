// The reference-test library checks itself on the CPU (runs in CI): the CPU FA2 schedule passes
// part of the default grid in bf16 and fp16, and the same schedule run with an off-by-one causal
// mask (every query sees one key past the diagonal) fails, with a report naming the case; inputs
// whose scores grow along the keys catch a softmax whose max never moves after the first block.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "algorithms/04_fa2_forward.hpp"
#include "algorithms/run_schedule.hpp"
#include "catch.hpp"
#include "reference/attention_check.hpp"

using namespace flashlab;
using reference::CaseResult;

namespace {

void cpu_fa2(const Problem& problem, AttentionTensors& tensors) {
  run_per_head(problem, tensors, 0, [&](auto& mem, const HeadProblem& head, const HeadTensors& x) {
    fa2_forward(mem, head, BlockTiling{48, 40}, x);
  });
}

// The planted bug: a causal problem computed as "key <= diagonal + 1".
void cpu_fa2_off_by_one(const Problem& problem, AttentionTensors& tensors) {
  Problem shifted = problem;
  if (shifted.mask.causal) {
    shifted.mask.causal = false;
    shifted.mask.window_right = 1;
  }
  cpu_fa2(shifted, tensors);
}

// The small shapes of the grid: skip (1023, 1024)-sized cases to keep CI fast.
std::vector<Problem> small_grid(DType dtype) {
  std::vector<Problem> grid;
  for (const Problem& p : reference::default_forward_grid(dtype, {40, 64, 59})) {
    if (static_cast<long long>(p.seqlen_q) * p.seqlen_k <= 256 * 512) grid.push_back(p);
  }
  return grid;
}

// The planted bug for key_growth: an online softmax that never moves its max after the first 32
// visible keys, with P rounded to the dtype (a kernel that keeps its first block's max). Exact in
// real arithmetic; in fp16 a later score far above that max overflows P.
void stale_max_attention(const Problem& problem, AttentionTensors& t) {
  for (int b = 0; b < problem.batch; ++b) {
    const int rq = problem.first_row_q(b), rk = problem.first_row_k(b);
    for (int h = 0; h < problem.heads_q; ++h) {
      const HeadProblem head = head_problem(problem, b, h);
      const int hk = problem.kv_head(h);
      std::vector<float> p(static_cast<std::size_t>(head.seqlen_k));
      for (int i = 0; i < head.seqlen_q; ++i) {
        float stale_max = -INFINITY;
        int seen = 0;
        for (int j = 0; j < head.seqlen_k; ++j) {
          p[j] = -INFINITY;
          if (!head.key_visible(i, j)) continue;
          float dot = 0.0f;
          for (int c = 0; c < problem.head_dim; ++c) dot += t.Q.at(rq + i, h, c) * t.K.at(rk + j, hk, c);
          p[j] = dot * head.scale;
          if (seen++ < 32) stale_max = std::max(stale_max, p[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j < head.seqlen_k; ++j) {
          p[j] = seen == 0 ? 0.0f : round_to(problem.dtype, std::exp(p[j] - stale_max));
          sum += p[j];
        }
        for (int c = 0; c < problem.head_dim; ++c) {
          float acc = 0.0f;
          for (int j = 0; j < head.seqlen_k; ++j) acc += p[j] * t.V.at(rk + j, hk, c);
          t.O.at(rq + i, h, c) = round_to(problem.dtype, seen == 0 ? 0.0f : acc / sum);
        }
        t.LSE.at(rq + i, h, 0) = seen == 0 ? -INFINITY : stale_max + std::log(sum);
      }
    }
  }
}

}  // namespace

TEST_CASE("reference grid: key_growth catches a softmax whose max never moves after the first block", "[checker]") {
  // Standard normal inputs let the planted bug through (its max is exact math); scores that grow
  // along the keys overflow its fp16 P. The real schedule passes both ways.
  std::vector<Problem> grid;
  for (const Problem& p : small_grid(DType::fp16)) {
    if (p.seqlen_k >= 200) grid.push_back(p);
  }
  REQUIRE(grid.size() >= 6);
  reference::ForwardCheckOptions growing;
  growing.key_growth = 8.0;
  const auto plain = reference::check_forward_grid(stale_max_attention, grid);
  INFO("plain inputs:\n" << plain.summary());
  CHECK(plain.failed == 0);
  const auto grown = reference::check_forward_grid(stale_max_attention, grid, growing);
  INFO("growing keys:\n" << grown.summary());
  CHECK(grown.failed > static_cast<int>(grid.size()) / 2);
  const auto schedule = reference::check_forward_grid(cpu_fa2, grid, growing);
  INFO("CPU FA2 schedule, growing keys:\n" << schedule.summary());
  CHECK(schedule.failed == 0);
  CHECK(schedule.passed == static_cast<int>(grid.size()));
}

TEST_CASE("reference grid: the CPU FA2 schedule passes, bf16 and fp16", "[checker]") {
  const DType dtype = GENERATE(DType::bf16, DType::fp16);
  const auto result = reference::check_forward_grid(cpu_fa2, small_grid(dtype));
  INFO(result.summary());
  CHECK(result.failed == 0);
  CHECK(result.refused == 0);
  CHECK(result.passed > 20);
}

TEST_CASE("reference grid: a planted causal off-by-one fails with a readable report", "[checker]") {
  const auto result = reference::check_forward_grid(cpu_fa2_off_by_one, small_grid(DType::bf16));
  INFO(result.summary());
  int causal_failures = 0;
  for (const CaseResult& c : result.cases) {
    INFO(c.report);
    if (!c.problem.mask.causal) CHECK(c.status == CaseResult::Status::passed);
    if (c.problem.mask.causal && c.problem.seqlen_k > 1 && !c.problem.varlen()) {
      CHECK(c.status == CaseResult::Status::failed);
      CHECK(c.report.find("FAILED") == 0);
      CHECK(c.report.find("causal") != std::string::npos);
      CHECK(c.report.find("O: max error") != std::string::npos);
      causal_failures += c.status == CaseResult::Status::failed;
    }
  }
  CHECK(causal_failures > 5);
}

TEST_CASE("reference grid: unwritten outputs and nondeterminism are caught", "[checker]") {
  Problem problem;
  problem.batch = 1, problem.heads_q = 2, problem.heads_kv = 1, problem.seqlen_q = 113, problem.seqlen_k = 203;
  problem.head_dim = 40, problem.dtype = DType::bf16;
  // Leaves the last row of O unwritten (still NaN from the poison).
  const auto skips_a_row = [](const Problem& p, AttentionTensors& t) {
    AttentionTensors copy = t;
    cpu_fa2(p, copy);
    for (int row = 0; row + 1 < t.O.rows; ++row)
      for (int h = 0; h < t.O.heads; ++h)
        for (int c = 0; c < t.O.dim; ++c) t.O.at(row, h, c) = copy.O.at(row, h, c);
    t.LSE = copy.LSE;
  };
  const CaseResult unwritten = reference::check_forward_case(skips_a_row, problem);
  INFO(unwritten.report);
  CHECK(unwritten.status == CaseResult::Status::failed);
  CHECK(unwritten.report.find("NaN or unwritten") != std::string::npos);

  int calls = 0;  // the second run adds a tiny perturbation: not bitwise repeatable
  const auto flaky = [&calls](const Problem& p, AttentionTensors& t) {
    cpu_fa2(p, t);
    if (calls++ % 2 == 1) t.O.values[7] = round_to(p.dtype, t.O.values[7] + 0.25f);
  };
  const CaseResult nondeterministic = reference::check_forward_case(flaky, problem);
  INFO(nondeterministic.report);
  CHECK(nondeterministic.status == CaseResult::Status::failed);
  CHECK(nondeterministic.report.find("not deterministic") != std::string::npos);
}

TEST_CASE("reference grid: an implementation that ignores softcap, ALiBi or dropout fails", "[checker]") {
  // The naive same-precision baseline must compute the problem that was asked (score
  // modifications and dropout included); a baseline that ignored them would be as wrong as the
  // implementation and let it pass.
  const std::string feature = GENERATE("softcap", "alibi", "dropout");
  Problem problem;
  problem.batch = 2, problem.heads_q = 2, problem.heads_kv = 1, problem.seqlen_q = 113, problem.seqlen_k = 203;
  problem.head_dim = 40, problem.dtype = GENERATE(DType::bf16, DType::fp16);
  if (feature == "softcap") problem.softcap = 2.0f;
  if (feature == "alibi") problem.alibi_slopes = {0.5f, 0.125f};
  if (feature == "dropout") problem.dropout = {0.2f, reference::fresh_seed(), 7};
  INFO(feature << ", " << reference::describe(problem));

  const CaseResult right = reference::check_forward_case(cpu_fa2, problem);
  INFO(right.report);
  CHECK(right.status == CaseResult::Status::passed);

  const auto ignores_feature = [](const Problem& p, AttentionTensors& t) {
    Problem plain = p;
    plain.softcap = 0.0f, plain.alibi_slopes.clear(), plain.dropout = {};
    cpu_fa2(plain, t);
  };
  const CaseResult wrong = reference::check_forward_case(ignores_feature, problem);
  INFO(wrong.report);
  CHECK(wrong.status == CaseResult::Status::failed);
}

TEST_CASE("reference grid: a fully masked row must be exactly O = 0 and LSE = -inf", "[checker]") {
  // Bottom-right causal with seqlen_q > seqlen_k: queries 0..(seqlen_q - seqlen_k - 1) see no key.
  // A small value left in O there is within 2x the naive error of the visible rows, so the
  // max-error rule alone would not see it.
  Problem problem;
  problem.batch = 2, problem.heads_q = 2, problem.heads_kv = 1, problem.seqlen_q = 239, problem.seqlen_k = 113;
  problem.head_dim = 40, problem.dtype = DType::bf16, problem.mask.causal = true;
  const auto leaks_into_masked_rows = [](const Problem& p, AttentionTensors& t) {
    cpu_fa2(p, t);
    for (int row = 0; row < t.O.rows; ++row)
      for (int h = 0; h < t.O.heads; ++h)
        if (t.LSE.at(row, h, 0) == -INFINITY) t.O.at(row, h, 0) = round_to(p.dtype, 1e-3f);
  };
  const CaseResult leaky = reference::check_forward_case(leaks_into_masked_rows, problem);
  INFO(leaky.report);
  CHECK(leaky.fully_masked_rows > 0);
  CHECK(leaky.status == CaseResult::Status::failed);
  CHECK(leaky.report.find("fully masked") != std::string::npos);
  const CaseResult right = reference::check_forward_case(cpu_fa2, problem);
  INFO(right.report);
  CHECK(right.status == CaseResult::Status::passed);
}

TEST_CASE("reference grid: an implementation without LSE is checked on O alone when check_lse is off", "[checker]") {
  // As PyTorch's SDPA: O only. With check_lse the unwritten (NaN) LSE fails the case; without it
  // O decides, fully masked rows included.
  Problem problem;
  problem.batch = 2, problem.heads_q = 2, problem.heads_kv = 1, problem.seqlen_q = 239, problem.seqlen_k = 113;
  problem.head_dim = 40, problem.dtype = DType::bf16, problem.mask.causal = true;
  const auto o_only = [](const Problem& p, AttentionTensors& t) {
    AttentionTensors copy = t;
    cpu_fa2(p, copy);
    t.O = copy.O;
  };
  const CaseResult with_lse = reference::check_forward_case(o_only, problem);
  INFO(with_lse.report);
  CHECK(with_lse.status == CaseResult::Status::failed);
  reference::ForwardCheckOptions o_alone;
  o_alone.check_lse = false;
  const CaseResult without_lse = reference::check_forward_case(o_only, problem, o_alone);
  INFO(without_lse.report);
  CHECK(without_lse.status == CaseResult::Status::passed);
  CHECK(without_lse.report.find("LSE: not checked") != std::string::npos);
  const auto leaks_into_masked_rows = [](const Problem& p, AttentionTensors& t) {
    cpu_fa2(p, t);
    for (int row = 0; row < t.O.rows; ++row)
      for (int h = 0; h < t.O.heads; ++h)
        if (t.LSE.at(row, h, 0) == -INFINITY) t.O.at(row, h, 0) = round_to(p.dtype, 1e-3f);
  };
  const CaseResult leaky = reference::check_forward_case(leaks_into_masked_rows, problem, o_alone);
  INFO(leaky.report);
  CHECK(leaky.status == CaseResult::Status::failed);
  CHECK(leaky.report.find("fully masked rows not exactly O = 0:") != std::string::npos);
}
