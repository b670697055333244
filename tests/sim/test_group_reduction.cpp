// The backward's dK/dV reduction over a GQA/MQA group, both ways a kernel does it: fp32 parts per
// query head then a reduction pass, or one fp32 accumulator per KV head added into in place.
// Counts derived by hand; outputs compared bit for bit.
#include <string>

#include "catch.hpp"
#include "sim/closed_forms.hpp"
#include "sim/schedules.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

// 8 query heads on 2 KV heads (groups of g = 4), Nk = 100 keys, d = 16, bf16; blocks 32 x 48 in an
// unbounded arena, so the reduction and conversion go by blocks of 64 rows (2 blocks of 100).
Problem grouped_problem(int seqlen_q = 100) {
  Problem p;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = 100;
  p.head_dim = 16;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.dtype = DType::bf16;
  return p;
}

RunOptions with_reduction(GroupReduction reduction, MemoryKind memory = MemoryKind::shape) {
  RunOptions options;
  options.memory = memory;
  options.blocks = {32, 48};
  options.group_reduction = reduction;
  return options;
}

}  // namespace

TEST_CASE("in-place dK/dV accumulation reads one accumulator per KV head instead of g fp32 parts",
          "[sim][backward][gqa][group_reduction]") {
  // One head's dK is Nk d = 1600 elements: 6400 B in fp32, 3200 B in bf16.
  // fp32_partials: 8 heads write 6400 B each; per KV head the reduction reads 4 x 6400 and writes 3200.
  //   dK read 2 x 25600 = 51200, written 8 x 6400 + 2 x 3200 = 57600.
  // in_place: per KV head 6400 B of zeros written, 4 atomic adds of 6400 B, then 6400 read and
  //   3200 written to convert: dK read 12800, written 12800 + 51200 + 6400 = 70400.
  const Counters partials = run_schedule("fa2_backward", grouped_problem(), with_reduction(GroupReduction::fp32_partials)).counters;
  const Counters in_place = run_schedule("fa2_backward", grouped_problem(), with_reduction(GroupReduction::in_place)).counters;
  for (TensorId id : {TensorId::dK, TensorId::dV}) {
    INFO(to_string(id));
    CHECK(partials[id].hbm_read_bytes == 51200);
    CHECK(partials[id].hbm_write_bytes == 57600);
    CHECK(in_place[id].hbm_read_bytes == 12800);
    CHECK(in_place[id].hbm_write_bytes == 70400);
  }
  // Nothing else changes.
  for (TensorId id : {TensorId::Q, TensorId::K, TensorId::V, TensorId::dO, TensorId::dQ, TensorId::LSE, TensorId::D})
    CHECK(partials[id] == in_place[id]);

  // FA1 Algorithm 4 zeroes dK_j, dV_j at line 5 and writes them at line 24: 2 x 6400 B a head with
  // fp32 parts (8 x 12800 + 2 x 3200 = 108800 written); in place the accumulator is zeroed once per
  // KV head, so line 5 writes nothing: 12800 + 51200 + 6400 = 70400 written.
  const Counters fa1_partials = run_schedule("fa1_backward", grouped_problem(), with_reduction(GroupReduction::fp32_partials)).counters;
  const Counters fa1_in_place = run_schedule("fa1_backward", grouped_problem(), with_reduction(GroupReduction::in_place)).counters;
  CHECK(fa1_partials[TensorId::dK].hbm_write_bytes == 108800);
  CHECK(fa1_in_place[TensorId::dK].hbm_write_bytes == 70400);
  CHECK(fa1_in_place[TensorId::dK].hbm_read_bytes == 12800);
}

TEST_CASE("in place, key blocks no query sees add nothing; in fp32 the output is the accumulator",
          "[sim][backward][gqa][group_reduction]") {
  // 40 queries, causal top-left: query i sees keys 0..i <= 39, so of the key blocks [0,48), [48,96),
  // [96,100) only the first is seen. fp32_partials writes every key block of every head (zeros for
  // the unseen ones): 8 x 6400 B; in place each head adds its first block only: 8 x 48 x 16 x 4 B.
  Problem problem = grouped_problem(40);
  problem.mask.causal = true;
  problem.mask.alignment = CausalAlignment::top_left;
  const Counters partials = run_schedule("fa2_backward", problem, with_reduction(GroupReduction::fp32_partials)).counters;
  const Counters in_place = run_schedule("fa2_backward", problem, with_reduction(GroupReduction::in_place)).counters;
  CHECK(partials[TensorId::dK].hbm_write_bytes == 8 * 6400 + 2 * 3200);
  CHECK(in_place[TensorId::dK].hbm_write_bytes == 2 * 6400 + 8 * 48 * 16 * 4 + 2 * 3200);

  // fp32: no conversion, the accumulator is dK itself: zeros and adds written, nothing read.
  Problem fp32 = grouped_problem();
  fp32.dtype = DType::fp32;
  const Counters fp32_in_place = run_schedule("fa2_backward", fp32, with_reduction(GroupReduction::in_place)).counters;
  CHECK(fp32_in_place[TensorId::dK].hbm_read_bytes == 0);
  CHECK(fp32_in_place[TensorId::dK].hbm_write_bytes == 2 * 6400 + 8 * 6400);
}

TEST_CASE("both group reductions give the same gradients, bit for bit", "[sim][backward][gqa][group_reduction]") {
  const std::string schedule = GENERATE("standard_backward", "fa1_backward", "fa2_backward", "fa2_backward_atomic");
  Problem problem = grouped_problem(37);
  problem.seqlen_k = 53;
  problem.mask.causal = true;
  const RunResult partials = run_schedule(schedule, problem, with_reduction(GroupReduction::fp32_partials, MemoryKind::data));
  const RunResult in_place = run_schedule(schedule, problem, with_reduction(GroupReduction::in_place, MemoryKind::data));
  INFO(schedule);
  CHECK(partials.tensors.dK.values == in_place.tensors.dK.values);
  CHECK(partials.tensors.dV.values == in_place.tensors.dV.values);
  CHECK(partials.tensors.dQ.values == in_place.tensors.dQ.values);
}

TEST_CASE("the closed form of both group reductions equals counted runs on odd sizes", "[sim][backward][gqa][group_reduction]") {
  const std::string schedule = GENERATE("standard_backward", "fa1_backward", "fa2_backward", "fa2_backward_atomic");
  const GroupReduction reduction = GENERATE(GroupReduction::fp32_partials, GroupReduction::in_place);
  const DType dtype = GENERATE(DType::fp32, DType::bf16);
  const bool causal = GENERATE(false, true);
  Problem problem = grouped_problem(37);
  problem.seqlen_k = 113;
  problem.head_dim = 24;
  problem.head_dim_v = 20;
  problem.heads_kv = 1;  // MQA: one group of 8
  problem.dtype = dtype;
  problem.mask.causal = causal;
  RunOptions options = with_reduction(reduction);
  options.sram_bytes = 48 * 1024;
  options.blocks = {};
  const RunResult result = run_schedule(schedule, problem, options);
  INFO(schedule << ", " << to_string(reduction) << ", " << to_string(dtype) << (causal ? ", causal" : ""));
  const Counters expected = closed_form(schedule, problem, result.blocks, result.arena_bytes, {}, reduction);
  CHECK(expected.tensor == result.counters.tensor);
  CHECK(expected.loads == result.counters.loads);
  CHECK(expected.stores == result.counters.stores);
}

TEST_CASE("group reduction names", "[sim][backward][group_reduction]") {
  using flashlab::testing::contains_text;
  CHECK(group_reduction_from_string("in_place") == GroupReduction::in_place);
  CHECK(std::string(to_string(GroupReduction::fp32_partials)) == "fp32_partials");
  CHECK_THROWS_WITH(group_reduction_from_string("atomics"), contains_text("allowed: fp32_partials, in_place"));
}
