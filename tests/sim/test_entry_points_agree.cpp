// One policy for every entry point: `flashlab run` (run_schedule with blocks derived from M),
// `flashlab sweep` and `flashlab experiment` (count_point), and the closed form give the same
// blocks and the same counts for the same schedule, problem and M, or the same refusal.
// (tests/sim/entry_points_agree.py holds the command line's JSON and flashlab.sim to it.)
#include <cstdint>
#include <string>

#include "catch.hpp"
#include "sim/closed_forms.hpp"
#include "sim/sweep.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

struct Case {
  std::string schedule;
  int seqlen, head_dim;
  std::int64_t sram_bytes;
  DType dtype;
  BlockRule rule = BlockRule::fitting;
};

SweepGrid grid_of(const Case& c) {
  SweepGrid grid;
  grid.schedules = {c.schedule};
  grid.seqlens = {c.seqlen};
  grid.head_dims = {c.head_dim};
  grid.sram_bytes = {c.sram_bytes};
  grid.dtype = c.dtype;
  grid.block_rule = c.rule;
  return grid;
}

RunResult run_as_the_command_line_does(const Case& c) {
  const Problem problem = sweep_problem(grid_of(c), c.seqlen, c.head_dim, MaskSpec{}, {});
  RunOptions options;
  options.memory = MemoryKind::shape;
  options.sram_bytes = c.sram_bytes;
  options.block_rule = c.rule;
  return run_schedule(c.schedule, problem, options);
}

}  // namespace

TEST_CASE("run, sweep and the closed form agree on blocks and counts for the same schedule, problem and M",
          "[sim][agreement]") {
  const Case cases[] = {
      {"standard", 16384, 64, 96 * 1024, DType::fp32},  // refused by run, counted by sweep, before
      {"standard", 1024, 64, 163 * 1024, DType::bf16},
      {"standard_backward", 2048, 64, 48 * 1024, DType::bf16},
      {"fa2", 4096, 64, 100 * 1024, DType::bf16},
      {"fa1_backward", 2048, 64, 64 * 1024, DType::bf16},
      {"fa1", 2048, 128, 96 * 1024, DType::fp16, BlockRule::paper},
      {"square_tiling", 1024, 64, 64 * 1024, DType::bf16, BlockRule::paper},
  };
  for (const Case& c : cases) {
    INFO(c.schedule << ", N " << c.seqlen << ", d " << c.head_dim << ", M " << c.sram_bytes << ", " << to_string(c.dtype)
                    << ", rule " << to_string(c.rule));
    const RunResult run = run_as_the_command_line_does(c);
    const SweepPoint point = count_point(grid_of(c), c.schedule, c.seqlen, c.head_dim, c.sram_bytes, "none");
    REQUIRE(point.fits);
    CHECK(point.blocks == run.blocks);
    CHECK(point.counters == run.counters);
    CHECK(point.block_rule == run.block_rule);
    CHECK(point.arena_bytes == run.arena_bytes);
    CHECK(run.counters.sram_peak_bytes <= run.arena_bytes);
    const Problem problem = sweep_problem(grid_of(c), c.seqlen, c.head_dim, MaskSpec{}, {});
    CHECK(closed_form(c.schedule, problem, run.blocks, run.arena_bytes).tensor == run.counters.tensor);
  }
}

TEST_CASE("standard attention at N = 16384, d = 64, M = 96 KiB fp32: 64 x 64 blocks, traffic by hand", "[sim][agreement]") {
  const RunResult run = run_as_the_command_line_does({"standard", 16384, 64, 96 * 1024, DType::fp32});
  CHECK(run.blocks == BlockSizes{64, 64, 0});
  // N = 16384, d = 64, Tr = N / 64 = 256, fp32: Q read once, K and V Tr times (2 Tr N d), S
  // written once and read twice (row-block form), P written and read once (5 N^2), O written
  // once (2 N d in all), LSE written once (N): 4 (2 N d + 2 Tr N d + 5 N^2 + N) bytes.
  const std::int64_t n = 16384, d = 64, tr = 256;
  CHECK(run.counters.hbm_bytes() == 4 * (2 * n * d + 2 * tr * n * d + 5 * n * n + n));
  CHECK(run.counters.hbm_bytes() == 7524646912);
}

TEST_CASE("standard attention's row-block form fits M at N = 65536 (163 KiB, bf16, d = 64), as its backward does",
          "[sim][agreement]") {
  Problem problem;
  problem.seqlen_q = problem.seqlen_k = 65536;
  problem.head_dim = 64;
  problem.dtype = DType::bf16;
  for (const char* schedule : {"standard", "standard_backward"}) {
    INFO(schedule);
    const BlockSizes blocks = derive_blocks(schedule, problem, 163 * 1024);
    CHECK(blocks == BlockSizes{64, 64, 0});  // square blocks up to d
    CHECK(working_set_bytes(schedule, problem, blocks) <= 163 * 1024);
  }
  // A row of S in one block: the whole-row form, S read once (the paper's line 2).
  problem.seqlen_q = problem.seqlen_k = 48;
  const Counters whole_rows = closed_form("standard", problem, {16, 48, 0}, 0);
  CHECK(whole_rows.tensor[static_cast<int>(TensorId::S)].hbm_read_elements == 48 * 48);
  const Counters row_blocks = closed_form("standard", problem, {16, 16, 0}, 0);
  CHECK(row_blocks.tensor[static_cast<int>(TensorId::S)].hbm_read_elements == 2 * 48 * 48);
}

TEST_CASE("M in elements: one conversion, whole elements for the rules, the exact ratio for the bounds", "[sim][agreement]") {
  CHECK(sram_elements(163 * 1024, DType::bf16) == 83456);
  CHECK(sram_elements(98304, DType::fp32) == 24576);
  CHECK(sram_elements(7, DType::fp16) == 3);
  CHECK(sram_elements_exact(7, DType::fp16) == 3.5);
  Problem problem;
  problem.dtype = DType::fp16;
  CHECK(bound_inputs(problem, 7).m == 3.5);
  // The run's rule and the bound see the same M: FA2's Br = ceil(M / 4d) at M = 64 KiB bf16, d = 64.
  problem.seqlen_q = problem.seqlen_k = 4096;
  problem.head_dim = 64;
  problem.dtype = DType::bf16;
  CHECK(derive_blocks("fa2", problem, 64 * 1024, BlockRule::paper).block_rows == 32768 / 256);
}

TEST_CASE("run and sweep refuse the same point with the same reason", "[sim][agreement]") {
  const Case c{"fa2", 1024, 256, 1024, DType::fp32};
  std::string run_reason;
  try {
    run_as_the_command_line_does(c);
  } catch (const std::invalid_argument& error) {
    run_reason = error.what();
  }
  const SweepPoint point = count_point(grid_of(c), c.schedule, c.seqlen, c.head_dim, c.sram_bytes, "none");
  CHECK_FALSE(point.fits);
  CHECK_FALSE(run_reason.empty());
  CHECK(point.reason == run_reason);
}
