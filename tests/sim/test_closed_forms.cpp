// Counted traffic equals the closed form exactly (sim/closed_forms.hpp), for every schedule, in
// both memory models, on sizes that divide the blocks and sizes that do not, with every mask kind,
// GQA, varlen and low precision; and the data and shape-only models count identically.
#include <string>
#include <vector>

#include "catch.hpp"
#include "reference/reference_check.hpp"
#include "sim/closed_forms.hpp"
#include "sim/schedules.hpp"

using namespace flashlab;
using namespace flashlab::sim;
using flashlab::testing::contains_text;

namespace {

std::string describe(const Counters& c) {
  std::string text;
  for (int i = 0; i < kTensorCount; ++i) {
    const TensorTraffic& t = c.tensor[i];
    if (t.hbm_read_elements == 0 && t.hbm_write_elements == 0) continue;
    text += std::string(to_string(static_cast<TensorId>(i))) + ": r " + std::to_string(t.hbm_read_elements) + " w " +
            std::to_string(t.hbm_write_elements) + " rb " + std::to_string(t.hbm_read_bytes) + " wb " +
            std::to_string(t.hbm_write_bytes) + "; ";
  }
  return text + "matmul " + std::to_string(c.matmul_flops) + ", exp " + std::to_string(c.exponentials) + ", loads " +
         std::to_string(c.loads) + ", stores " + std::to_string(c.stores);
}

void require_equal_to_closed_form(const std::string& schedule, const Problem& problem, const RunOptions& options) {
  const RunResult run = run_schedule(schedule, problem, options);
  const Counters expected = closed_form(schedule, problem, run.blocks, options.sram_bytes);
  INFO(schedule << " (" << to_string(options.memory) << "), " << reference::describe(problem) << ", Br " << run.blocks.block_rows
                << ", Bc " << run.blocks.block_cols << ", M " << options.sram_bytes);
  INFO("counted:     " << describe(run.counters));
  INFO("closed form: " << describe(expected));
  CHECK(run.counters.tensor == expected.tensor);
  CHECK(run.counters.matmul_flops == expected.matmul_flops);
  CHECK(run.counters.exponentials == expected.exponentials);
  CHECK(run.counters.loads == expected.loads);
  CHECK(run.counters.stores == expected.stores);
  if (options.sram_bytes > 0) CHECK(run.counters.sram_peak_bytes <= options.sram_bytes);
}

// A schedule that cannot run a problem (ScheduleInfo::unsupported: the ring with ALiBi, dropout or
// block sparsity) refuses it with its own sentence, in a run and in its closed form alike.
bool refuses(const ScheduleInfo& info, const Problem& problem) {
  const std::string refusal = info.unsupported ? info.unsupported(problem) : "";
  if (refusal.empty()) return false;
  INFO(info.name);
  RunOptions options;
  options.blocks = {16, 16};
  CHECK_THROWS_WITH(run_schedule(info.name, problem, options), refusal);
  CHECK_THROWS_WITH(closed_form(info.name, problem, options.blocks), refusal);
  return true;
}

Problem make_problem(int seqlen_q, int seqlen_k, int head_dim, int mask_kind, DType dtype) {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;  // GQA: backward passes reduce dK, dV over groups of 2
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = head_dim;
  p.dtype = dtype;
  const int window_limit = std::max(seqlen_q, seqlen_k);
  switch (mask_kind) {
    case 1: p.mask.causal = true; break;
    case 2: p.mask.causal = true, p.mask.alignment = CausalAlignment::top_left; break;
    case 3: p.mask.window_left = std::min(23, window_limit), p.mask.window_right = std::min(5, window_limit); break;
    case 4: {  // block sparsity at its own granularity (not the tiles')
      BlockSparsity& s = p.block_sparsity;
      s.block_rows = 16, s.block_cols = 24;
      s.row_blocks = (seqlen_q + 15) / 16, s.col_blocks = (seqlen_k + 23) / 24;
      s.keep.resize(static_cast<std::size_t>(s.row_blocks) * s.col_blocks);
      for (std::size_t i = 0; i < s.keep.size(); ++i) s.keep[i] = (i * 7 + 3) % 5 < 2;
      break;
    }
    default: break;
  }
  return p;
}

}  // namespace

TEST_CASE("every schedule's count equals its closed form, data and shape-only", "[sim][closed_form]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 203}, {128, 256}, {239, 1}, {1, 77}}));
  const int mask_kind = GENERATE(0, 1, 2, 3, 4);
  const Problem problem = make_problem(seqlen_q, seqlen_k, 40, mask_kind, DType::fp32);
  REQUIRE(schedules().size() == 14);  // every schedule of the registry is below, none forgotten
  for (const ScheduleInfo& info : schedules()) {
    if (refuses(info, problem)) continue;
    for (const MemoryKind memory : {MemoryKind::shape, MemoryKind::data}) {
      RunOptions options;
      options.memory = memory;
      options.sram_bytes = 48 * 1024;  // derived blocks: none of them divides 113, 203 or 239
      require_equal_to_closed_form(info.name, problem, options);
      options.blocks = {32, 64, 3};  // explicit blocks that divide 128 and 256
      options.sram_bytes = 0;        // unbounded: standard attention holds whole rows
      require_equal_to_closed_form(info.name, problem, options);
    }
  }
}

TEST_CASE("closed forms hold in bf16, with head_dim_v != head_dim and with varlen batches", "[sim][closed_form]") {
  Problem problem = make_problem(97, 131, 59, 1, DType::bf16);
  problem.head_dim_v = 24;
  SECTION("bf16, head_dim_v 24") {}
  SECTION("varlen") { set_varlen(problem, {97, 5, 64}, {131, 5, 200}); }
  for (const ScheduleInfo& info : schedules()) {
    for (const MemoryKind memory : {MemoryKind::shape, MemoryKind::data}) {
      RunOptions options;
      options.memory = memory;
      options.sram_bytes = 20 * 1024;
      require_equal_to_closed_form(info.name, problem, options);
    }
  }
}

TEST_CASE("data and shape-only runs count identically, every counter", "[sim][models]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 203}, {64, 64}, {1, 1}, {799, 3}}));
  const int mask_kind = GENERATE(0, 1, 3);
  Problem problem = make_problem(seqlen_q, seqlen_k, 33, mask_kind, DType::fp32);
  problem.softcap = mask_kind == 1 ? 30.0f : 0.0f;
  problem.alibi_slopes = mask_kind == 3 ? std::vector<float>{0.5f, 0.0f, 0.25f, 0.0f} : std::vector<float>{};
  problem.dropout.probability = mask_kind == 0 ? 0.1f : 0.0f;
  for (const ScheduleInfo& info : schedules()) {
    if (refuses(info, problem)) continue;
    RunOptions options;
    options.blocks = {24, 40, 3};  // explicit blocks, unbounded arena (softcap adds tiles)
    options.memory = MemoryKind::data;
    const RunResult data = run_schedule(info.name, problem, options);
    options.memory = MemoryKind::shape;
    const RunResult shape = run_schedule(info.name, problem, options);
    options.every_head = true;
    const RunResult every_head = run_schedule(info.name, problem, options);
    INFO(info.name << ", " << reference::describe(problem));
    CHECK(data.counters == shape.counters);  // traffic, FLOPs of all kinds, loads, stores, SRAM peak
    CHECK(every_head.counters == shape.counters);
    CHECK(shape.heads_run <= every_head.heads_run);
  }
}

TEST_CASE("the SRAM peak equals the closed-form working set on dividing sizes", "[sim][closed_form]") {
  Problem problem = make_problem(256, 256, 32, 0, DType::fp32);
  problem.heads_kv = 4;
  for (const ScheduleInfo& info : schedules()) {
    RunOptions options;
    options.blocks = {32, 64, 4};
    options.sram_bytes = 0;
    const RunResult run = run_schedule(info.name, problem, options);
    INFO(info.name);
    CHECK(run.counters.sram_peak_bytes == working_set_bytes(info.name, problem, options.blocks));
  }
}

TEST_CASE("block sizes derived from M fit M, and M below the smallest working set is refused", "[sim][tiling]") {
  const Problem problem = make_problem(1000, 1000, 64, 0, DType::bf16);
  for (const ScheduleInfo& info : schedules()) {
    for (const std::int64_t sram : {std::int64_t{16} * 1024, std::int64_t{48} * 1024, std::int64_t{228} * 1024}) {
      const BlockSizes blocks = derive_blocks(info.name, problem, sram);
      INFO(info.name << " at M = " << sram);
      CHECK(working_set_bytes(info.name, problem, blocks) <= sram);
      RunOptions options;
      options.sram_bytes = sram;
      CHECK_NOTHROW(run_schedule(info.name, problem, options));  // the arena of M holds it
    }
    CHECK_THROWS_AS(derive_blocks(info.name, problem, 8), std::invalid_argument);
    CHECK_THROWS_WITH(derive_blocks(info.name, problem, 8),
                      contains_text("M = 8 B") && contains_text("'" + info.name + "'") && contains_text("allowed: M >="));
  }
  CHECK_THROWS_AS(find_schedule("fa3"), std::invalid_argument);
  CHECK_THROWS_WITH(find_schedule("fa3"), contains_text("schedule 'fa3' is unknown") && contains_text("allowed: standard"));
  // FA1's rule is the paper's when it fits: Bc = ceil(M / 4d), Br = min(Bc, d), M in elements.
  const BlockSizes fa1 = derive_blocks("fa1", problem, 1 << 30);
  CHECK(fa1.block_cols == (((1 << 30) / 2) + 4 * 64 - 1) / (4 * 64));
  CHECK(fa1.block_rows == 64);
  // Saha-Ye: B = floor(sqrt(M / 4)) when it fits.
  CHECK(derive_blocks("square_tiling", problem, 2 * 4 * 50 * 50).block_rows == 50);
}
