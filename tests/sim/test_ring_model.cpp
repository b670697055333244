// Ring Attention on a machine (sim/ring.hpp): the devices' counters add up to the registry's run,
// the link carries each shard once per step, a step hides its transfer exactly when its link time
// is at most its compute time, the seqlen per device where overlap begins sits where the matmul
// estimate puts it, and the machine presets carry their links.
#include "catch.hpp"
#include "reference/reference_check.hpp"
#include "sim/closed_forms.hpp"
#include "sim/machines.hpp"
#include "sim/ring.hpp"
#include "sim/schedules.hpp"

using namespace flashlab;
using namespace flashlab::sim;
using flashlab::testing::contains_text;

namespace {

Problem ring_problem(int seqlen, bool causal) {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = 64;
  p.dtype = DType::bf16;
  p.mask.causal = causal;
  return p;
}

}  // namespace

TEST_CASE("every preset has a link to the next device, with its source", "[ring]") {
  for (const Machine& m : load_machines()) {
    INFO(m.key);
    CHECK(m.link_bytes_per_second > 0);
    CHECK(m.link_source.find("one direction") != std::string::npos);
  }
  CHECK(find_machine("h200").link_bytes_per_second == 450e9);  // NVLink 4: 900 GB/s both directions
  CHECK(find_machine("a100").link_bytes_per_second == 300e9);  // NVLink 3: 600 GB/s
  CHECK(find_machine("b200").link_bytes_per_second == 900e9);  // NVLink 5: 1.8 TB/s
}

TEST_CASE("the devices' counters add up to the registry's run of the ring", "[ring]") {
  const bool causal = GENERATE(false, true);
  const bool backward = GENERATE(false, true);
  const Problem problem = ring_problem(1000, causal);
  const RingTiling tiling{{64, 64}, 4, RingOrdering::striped};
  const RingModel model = model_ring(problem, tiling, backward, find_machine("h200"));
  Counters sum;
  for (const Counters& c : model.devices) sum += c;
  RunOptions options;
  options.blocks = {64, 64, 0, 4, RingOrdering::striped};
  const RunResult run = run_schedule(backward ? "ring_backward" : "ring", problem, options);
  CHECK(sum.tensor == run.counters.tensor);
  CHECK(sum.matmul_flops == run.counters.matmul_flops);
  CHECK(sum.tensor == closed_form(backward ? "ring_backward" : "ring", problem, run.blocks).tensor);
  // Each device sends its K, V shard (bf16, 250 rows x 64 x 2 per KV head, 2 KV heads, 2 sequences)
  // at steps 0..P-2; backward, dK, dV (fp32) at every step too.
  const std::int64_t kv = 250LL * 128 * 2 * 2 * 2, gradients = 250LL * 128 * 4 * 2 * 2;
  REQUIRE(model.steps.size() == 4);
  for (const RingStepTime& step : model.steps) {
    CHECK(step.link_bytes == (step.step < 3 ? kv : 0) + (backward ? gradients : 0));
    CHECK(step.hidden() == (step.link_seconds <= step.compute_seconds));
    CHECK(step.blocks.size() == 4);
  }
  CHECK(model.seconds >= std::max(model.compute_seconds, model.link_seconds) * 0.999);
  CHECK(model.seconds <= (model.compute_seconds + model.link_seconds) * 1.001);
}

TEST_CASE("overlap begins where the matmul estimate says, twice as late for a balanced causal ring", "[ring]") {
  Problem shape = ring_problem(1, false);
  shape.head_dim = 128;
  const Machine h200 = find_machine("h200");
  const RingTiling tiling{{128, 128}, 8, RingOrdering::zigzag};
  const RingOverlapPoint full = ring_overlap_threshold(shape, tiling, false, h200);
  // F e / (2 g B) with g = 2 query heads per KV head: 989e12 * 2 / (4 * 450e9) = 1099 tokens.
  CHECK(full.estimate == Approx(989e12 * 2 / (4 * 450e9)));
  CHECK(full.seqlen_per_device >= full.estimate * 0.9);
  CHECK(full.seqlen_per_device <= full.estimate * 1.3);
  shape.mask.causal = true;
  const RingOverlapPoint causal = ring_overlap_threshold(shape, tiling, false, h200);
  CHECK(causal.estimate == Approx(2 * full.estimate));
  CHECK(causal.seqlen_per_device >= 1.7 * full.seqlen_per_device);
  // At the threshold every step hides its transfer behind its matmul time; one step shorter, one does not.
  Problem at = shape;
  at.batch = 1, at.heads_q = 2, at.heads_kv = 1;
  at.seqlen_q = at.seqlen_k = 8 * causal.seqlen_per_device;
  CHECK(model_ring(at, tiling, false, h200).overlapped_by_matmul());
  at.seqlen_q = at.seqlen_k = 8 * (causal.seqlen_per_device - 64);
  CHECK_FALSE(model_ring(at, tiling, false, h200).overlapped_by_matmul());
}

TEST_CASE("the ring model refuses by name", "[ring]") {
  Machine no_link = find_machine("h200");
  no_link.link_bytes_per_second = 0;
  const RingTiling tiling{{64, 64}, 4, RingOrdering::zigzag};
  CHECK_THROWS_WITH(model_ring(ring_problem(256, false), tiling, false, no_link),
                    contains_text("machine 'h200' has no link_bytes_per_second"));
  Problem alibi = ring_problem(256, false);
  alibi.alibi_slopes = {0.5f, 0.5f, 0.5f, 0.5f};
  CHECK_THROWS_WITH(model_ring(alibi, tiling, false, find_machine("h200")), contains_text("ring attention: ALiBi"));
  Problem varlen = ring_problem(256, false);
  set_varlen(varlen, {100, 156}, {100, 156});
  CHECK_THROWS_WITH(model_ring(varlen, tiling, false, find_machine("h200")), contains_text("a varlen batch"));
  RunOptions options;
  options.blocks = {64, 64, 0, 4, RingOrdering::striped};
  CHECK_THROWS_WITH(run_schedule("fa2", ring_problem(256, false), options),
                    contains_text("ordering striped are a ring's; allowed: ring, ring_backward"));
}
