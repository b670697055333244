// Every schedule is one module: its registry entry carries its block-size rule, working set,
// closed form, cost model, bound and search terms, and the public lookups by name reach them.
// Expected values below are worked out by hand from the papers' rules.
#include <string>

#include "algorithms/03_fa1_forward.hpp"
#include "algorithms/07_fa2_backward.hpp"
#include "algorithms/11_square_tiling.hpp"
#include "catch.hpp"
#include "sim/bounds.hpp"
#include "sim/closed_forms.hpp"
#include "sim/schedules.hpp"
#include "sim/search.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

// N = 256, d = dv = 32, fp32; M = 65536 B = 16384 elements.
Problem small_problem() {
  Problem problem;
  problem.seqlen_q = 256;
  problem.seqlen_k = 256;
  problem.head_dim = 32;
  problem.dtype = DType::fp32;
  return problem;
}
constexpr std::int64_t kSramBytes = 65536;

}  // namespace

TEST_CASE("every registry entry sets every piece of its module") {
  for (const ScheduleInfo& info : schedules()) {
    INFO(info.name);
    CHECK(info.paper_block_side != nullptr);
    CHECK(info.blocks_of_side != nullptr);
    CHECK(info.head_counts != nullptr);
    CHECK((info.kv_head_counts != nullptr) == info.shares_kv_in_group);
    CHECK(info.working_set_bytes != nullptr);
    CHECK(info.tile_steps != nullptr);
    CHECK(info.scratch_elements != nullptr);
    CHECK(std::string(info.bound_formula).size() > 0);
    CHECK(std::string(info.bound_source).size() > 0);
    CHECK(info.bound != nullptr);
    CHECK(info.theory_exponents != nullptr);
    CHECK(info.accumulator_elements != nullptr);
    REQUIRE(info.pseudocode != nullptr);
    CHECK_FALSE(info.pseudocode().title.empty());
  }
}

TEST_CASE("the lookups by name reach every registered schedule's module") {
  const Problem problem = small_problem();
  for (const ScheduleInfo& info : schedules()) {
    INFO(info.name);
    const BlockSizes blocks = derive_blocks(info.name, problem, kSramBytes);
    CHECK(blocks.block_rows >= 1);
    CHECK(working_set_bytes(info.name, problem, blocks) <= kSramBytes);  // the fitting rule fits
    CHECK(closed_form(info.name, problem, blocks, kSramBytes).hbm_bytes() > 0);
    CHECK(tile_steps(info.name, problem, 0, blocks) > 0);
    CHECK(scratch_elements(info.name, problem, 0, blocks) >= 0);
    CHECK(schedule_bound(info.name, problem, kSramBytes).elements > 0);
    CHECK(theory_exponents(info.name, 16384, 32).n == 2);
    CHECK(accumulator_elements(info.name, problem, blocks) > 0);
  }
  CHECK_THROWS_WITH(derive_blocks("fa3", problem, kSramBytes), flashlab::testing::contains_text("allowed: standard"));
  CHECK_THROWS_WITH(working_set_bytes("fa3", problem, {64, 64}), flashlab::testing::contains_text("'fa3' is unknown"));
  CHECK_THROWS_WITH(schedule_bound("fa3", problem, kSramBytes), flashlab::testing::contains_text("'fa3' is unknown"));
  CHECK_THROWS_WITH(theory_exponents("fa3", 16384, 32), flashlab::testing::contains_text("'fa3' is unknown"));
}

TEST_CASE("each entry's block-size rule is its paper's") {
  const Problem problem = small_problem();
  // FA1 Algorithm 1 line 1: Bc = ceil(16384 / (4 * 32)) = 128, Br = min(128, 32) = 32; the
  // backward passes and block-sparse keep FA1's shape.
  for (const char* name : {"fa1", "fa1_skip", "block_sparse", "fa1_backward", "fa2_backward", "fa2_backward_atomic"}) {
    INFO(name);
    CHECK(derive_blocks(name, problem, kSramBytes, BlockRule::paper) == BlockSizes{32, 128});
  }
  // FA2 swaps the roles: Br = 128, Bc = 32.
  CHECK(derive_blocks("fa2", problem, kSramBytes, BlockRule::paper) == BlockSizes{128, 32});
  CHECK(derive_blocks("split_kv", problem, kSramBytes, BlockRule::paper) == BlockSizes{128, 32});
  // Saha-Ye Algorithm 1: B = floor(sqrt(16384 / 4)) = 64.
  CHECK(derive_blocks("square_tiling", problem, kSramBytes, BlockRule::paper) == BlockSizes{64, 64});
  CHECK(has_paper_block_rule("fa1"));
  CHECK_FALSE(has_paper_block_rule("standard"));
  CHECK_FALSE(has_paper_block_rule("standard_backward"));
  CHECK_FALSE(has_paper_block_rule("memory_efficient"));
}

TEST_CASE("each entry's working set, bound and search terms, by hand") {
  const Problem problem = small_problem();
  // FA2 with Br = 128, Bc = 32, fp32: 4 (Br d + Br dv + Bc d + Bc dv + 2 Br Bc) + 4 (2 Br + 3 Br)
  // = 4 (4096 + 4096 + 1024 + 1024 + 8192) + 20 * 128 = 73728 + 2560.
  CHECK(working_set_bytes("fa2", problem, {128, 32}) == 76288);
  // N^2 d^2 / M = 65536 * 1024 / 16384.
  const Bound fa2 = schedule_bound("fa2", problem, kSramBytes);
  CHECK(fa2.elements == 4096);
  CHECK(fa2.formula == "N^2 d^2 / M");
  CHECK(fa2.source == "FA1 Theorem 2");
  CHECK(schedule_bound("fa2_backward", problem, kSramBytes).source == "FA1 Theorem 5");
  // N d + N^2 (Nq d + Nk d + Nq Nk) = 2 * 256 * 32 + 65536.
  CHECK(schedule_bound("standard", problem, kSramBytes).elements == 81920);
  // S_ij and O_i: 128 * 32 + 128 * 32; square tiling: S_ij and a 32-wide slice of O (dv = 32 < B).
  CHECK(accumulator_elements("fa2", problem, {128, 32}) == 8192);
  CHECK(accumulator_elements("square_tiling", problem, {64, 64}) == 64 * 64 + 64 * 32);
  // Backward: S_ij and dK_j, dV_j: 32 * 128 + 128 * 64.
  CHECK(accumulator_elements("fa2_backward", problem, {32, 128}) == 4096 + 8192);
  // Square tiling runs one side; split_kv's key blocks restart per chunk.
  CHECK(find_schedule("square_tiling").one_sided);
  CHECK_FALSE(find_schedule("fa2").one_sided);
  CHECK_FALSE(find_schedule("split_kv").key_block_count_decides);
  // Split-KV's tile steps: Tr (Tc + chunks) + Nq chunks = 2 * (8 + 4) + 256 * 4 with Br = 128,
  // Bc = 32 and 4 chunks of 64 keys.
  CHECK(tile_steps("split_kv", problem, 0, {128, 32, 4}) == 2 * 12 + 1024);
}

TEST_CASE("the block-size rules and working sets are the schedules' own, in algorithms/") {
  const Problem problem = small_problem();
  // One FA1 rule: the schedule's own fa1_paper_tiling and the registry's derivation agree
  // (Bc = ceil(16384 / 128) = 128, Br = 32).
  const BlockTiling fa1 = fa1_paper_tiling(kSramBytes, 32, DType::fp32);
  CHECK(fa1.block_rows == 32);
  CHECK(fa1.block_cols == 128);
  CHECK(derive_blocks("fa1", problem, kSramBytes, BlockRule::paper) == BlockSizes{fa1.block_rows, fa1.block_cols});
  // Saha-Ye's B = 64 from the schedule's own from_sram, and from the registry.
  CHECK(SquareTiling::from_sram(kSramBytes, DType::fp32).block == 64);
  // Blocks that divide the sequences: the registry's working set is FA1's own peak formula,
  // 4 (128 * 64 + 32 * 32 + 2 * 32 * 128 + 32 * 32) + 4 * 32 * 32 + 36 * 32 = 73728 + 4096 + 1152.
  CHECK(working_set_bytes("fa1", problem, {32, 128}) == fa1_forward_sram_bytes(fa1, 32, 32, DType::fp32));
  CHECK(working_set_bytes("fa1", problem, {32, 128}) == 78976);
}

TEST_CASE("each entry's pseudocode is its paper's, variants one line apart") {
  // FA1 Algorithm 1 line 1 is the block-size rule; fa1_skip rewrites line 7 only.
  const Pseudocode& fa1 = find_schedule("fa1").pseudocode();
  const Pseudocode& skip = find_schedule("fa1_skip").pseudocode();
  REQUIRE(fa1.has_line(1));
  CHECK(fa1.lines.size() == skip.lines.size());
  int differing = 0;
  for (std::size_t i = 0; i < fa1.lines.size(); ++i) differing += fa1.lines[i].text != skip.lines[i].text;
  CHECK(differing == 1);
  CHECK(find_schedule("fa2_backward_atomic").pseudocode().has_line(15));
  CHECK(find_schedule("fa2").pseudocode().title == "FlashAttention-2 forward (FA2 Algorithm 1)");
}

TEST_CASE("one group runner: the registry and run_fa2_backward count a GQA backward alike") {
  Problem problem = small_problem();
  problem.heads_q = 4;
  problem.heads_kv = 2;
  const BlockTiling tiling{32, 32};
  const Counters direct = run_fa2_backward<ShapeMemory>(problem, nullptr, kSramBytes, tiling);
  RunOptions options;
  options.sram_bytes = kSramBytes;
  options.blocks = {tiling.block_rows, tiling.block_cols};
  options.every_head = true;
  const RunResult registry = run_schedule("fa2_backward", problem, options);
  CHECK(registry.counters.hbm_bytes() == direct.hbm_bytes());
  CHECK(registry.counters.loads == direct.loads);
  CHECK(registry.counters.stores == direct.stores);
  // And both are the closed form (the reduction: 2 fp32 parts of dK, dV read per KV head).
  CHECK(direct.hbm_bytes() == closed_form("fa2_backward", problem, options.blocks, kSramBytes).hbm_bytes());
}

TEST_CASE("SRAM sizes convert between bytes and elements in one place") {
  CHECK(sram_elements(kSramBytes, DType::fp32) == 16384);
  CHECK(sram_elements(kSramBytes, DType::bf16) == 32768);
  CHECK(sram_bytes_of_elements(16384, DType::fp32) == kSramBytes);
  CHECK(sram_bytes_of_elements(128 * 128, DType::fp16) == 32768);
  // The GQA reduction's rows: two fp32 tiles of d = 32 in M = 4000 B hold floor(1000 / 64) = 15 rows.
  CHECK(group_reduction_block_rows(4000, 32) == 15);
  CHECK(group_reduction_block_rows(kSramBytes, 32) == 64);  // capped at 64
}
