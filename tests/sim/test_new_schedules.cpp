// Rabe-Staats memory-efficient attention (10) and Saha-Ye square tiling (11) against the oracle:
// odd shapes, masks, GQA, blocks that do not divide, head dims that are not powers of two.
#include "algorithms/10_memory_efficient.hpp"
#include "algorithms/11_square_tiling.hpp"
#include "algorithms/run_schedule.hpp"
#include "catch.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

template <class Schedule>
void check_against_oracle(const Problem& problem, const std::string& label, Schedule schedule) {
  const auto seed = reference::fresh_seed();
  AttentionTensors tensors = reference::random_inputs(problem, seed, false);
  run_per_head(problem, tensors, 0, schedule);
  const OracleResult oracle = oracle_attention(problem, tensors);
  const auto o_error = reference::compare(tensors.O, oracle.O);
  const auto lse_error = reference::compare(tensors.LSE, oracle.LSE);
  INFO(label << ": " << reference::describe(problem) << ", seed " << seed);
  INFO(o_error.describe("O") << "\n" << lse_error.describe("LSE"));
  CHECK(o_error.nan_count == 0);
  CHECK(o_error.max_error < 1e-4);
  CHECK(lse_error.max_error < 1e-4);
}

Problem odd_problem(int seqlen_q, int seqlen_k, int mask_kind) {
  Problem problem;
  problem.batch = 2;
  problem.heads_q = 4;
  problem.heads_kv = 2;
  problem.seqlen_q = seqlen_q;
  problem.seqlen_k = seqlen_k;
  problem.head_dim = 59;
  problem.head_dim_v = 40;
  if (mask_kind == 1) problem.mask.causal = true;
  if (mask_kind == 2) problem.mask.causal = true, problem.mask.alignment = CausalAlignment::top_left;
  const int window_limit = std::max(seqlen_q, seqlen_k);
  if (mask_kind == 3) problem.mask.window_left = std::min(17, window_limit), problem.mask.window_right = std::min(3, window_limit);
  return problem;
}

}  // namespace

TEST_CASE("memory-efficient attention matches the oracle", "[sim][memory_efficient]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 203}, {128, 217}, {1, 1}, {239, 1}, {799, 3}}));
  const int mask_kind = GENERATE(0, 1, 2, 3);
  const Problem problem = odd_problem(seqlen_q, seqlen_k, mask_kind);
  check_against_oracle(problem, "memory_efficient 48 x 40", [](auto& mem, const HeadProblem& head, const HeadTensors& x) {
    memory_efficient_attention(mem, head, BlockTiling{48, 40}, x);
  });
}

TEST_CASE("square tiling matches the oracle", "[sim][square_tiling]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 203}, {128, 217}, {1, 1}, {239, 1}, {799, 3}}));
  const int mask_kind = GENERATE(0, 1, 2, 3);
  const int side = GENERATE(16, 37, 64);  // slices of d = 59 that do and do not divide it; B > d
  const Problem problem = odd_problem(seqlen_q, seqlen_k, mask_kind);
  check_against_oracle(problem, "square_tiling B " + std::to_string(side), [side](auto& mem, const HeadProblem& head, const HeadTensors& x) {
    square_tiling_attention(mem, head, SquareTiling{side}, x);
  });
}

TEST_CASE("square tiling's side follows Saha and Ye's rule", "[sim][square_tiling]") {
  CHECK(SquareTiling::from_sram(4 * 4 * 100, DType::fp32).block == 10);  // M = 400 elements: sqrt(100)
  CHECK(SquareTiling::from_sram(4 * 4 * 99, DType::fp32).block == 9);
  CHECK(SquareTiling::from_sram(2 * 4 * 64 * 64, DType::bf16).block == 64);
  CHECK_THROWS_AS(SquareTiling::from_sram(15, DType::fp32), std::invalid_argument);
  CHECK_THROWS_WITH(SquareTiling::from_sram(15, DType::fp32),
                    testing::contains_text("M = 15 bytes") && testing::contains_text("allowed: M >= 16 bytes"));
}
