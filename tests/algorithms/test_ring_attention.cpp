// Ring Attention (algorithms/12_ring_attention.hpp) against the oracle: forward and backward,
// P = 1..8 devices, every ordering, with and without a causal mask, odd shapes, GQA; the
// orderings' layouts; the load balance that striped and zig-zag buy; the link bytes per step;
// and the refusals.
#include <numeric>
#include <set>

#include "algorithms/12_ring_attention.hpp"
#include "backward_check.hpp"
#include "catch.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

Problem ring_problem(int seqlen_q, int seqlen_k, bool causal) {
  Problem p;
  p.batch = 1;
  p.heads_q = 2;
  p.heads_kv = 1;  // GQA: the group's query heads share the travelling K, V (and dK, dV)
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.head_dim = 24;
  p.head_dim_v = 17;
  p.mask.causal = causal;
  return p;
}

RingTiling tiling_of(int devices, RingOrdering ordering) { return {{16, 24}, devices, ordering}; }

constexpr RingOrdering kOrderings[] = {RingOrdering::contiguous, RingOrdering::striped, RingOrdering::zigzag};

}  // namespace

TEST_CASE("each ordering gives every position to exactly one device", "[ring]") {
  for (const RingOrdering ordering : kOrderings) {
    for (int devices = 1; devices <= 8; ++devices) {
      for (const int length : {1, 3, 7, 16, 113, 203}) {
        std::vector<int> owner(static_cast<std::size_t>(length), -1);
        for (int d = 0; d < devices; ++d) {
          for (const RingRun& run : ring_runs(ordering, devices, d, length)) {
            for (int t = 0; t < run.length; ++t) {
              const int position = run.first + run.stride * t;
              REQUIRE(position >= 0);
              REQUIRE(position < length);
              CHECK(owner[static_cast<std::size_t>(position)] == -1);
              owner[static_cast<std::size_t>(position)] = d;
            }
          }
        }
        INFO(to_string(ordering) << ", P " << devices << ", length " << length);
        CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
      }
    }
  }
  // Striped: device 2 of 4 holds 2, 6, 10; zig-zag: device 0 of 2 holds chunks 0 and 3 of 4.
  CHECK(ring_runs(RingOrdering::striped, 4, 2, 12).front().stride == 4);
  const auto zigzag = ring_runs(RingOrdering::zigzag, 2, 0, 16);
  REQUIRE(zigzag.size() == 2);
  CHECK((zigzag[0].first == 0 && zigzag[0].length == 4 && zigzag[1].first == 12 && zigzag[1].length == 4));
}

TEST_CASE("a block pair covers exactly the visible scores between two runs", "[ring]") {
  // Every (query, key) of every run pair: visible in the global mask iff inside the pair's band.
  for (const int mask_kind : {0, 1, 2, 3}) {
    Problem problem = ring_problem(37, 29, mask_kind == 1);
    if (mask_kind == 2) problem.mask.causal = true, problem.mask.alignment = CausalAlignment::top_left;
    if (mask_kind == 3) problem.mask.window_left = 5, problem.mask.window_right = 2;
    const HeadProblem head = head_problem(problem, 0, 0);
    for (const RingOrdering ordering : kOrderings) {
      for (const int devices : {1, 3, 4}) {
        for (int i = 0; i < devices; ++i) {
          for (int j = 0; j < devices; ++j) {
            for (const RingRun& q : ring_runs(ordering, devices, i, problem.seqlen_q)) {
              for (const RingRun& k : ring_runs(ordering, devices, j, problem.seqlen_k)) {
                const auto pair = ring_block_pair(head, q, k);
                const HeadProblem sub = pair ? ring_pair_head(head, *pair) : head;
                for (int a = 0; a < q.length; ++a) {
                  for (int b = 0; b < k.length; ++b) {
                    const bool visible = head.key_visible(q.first + q.stride * a, k.first + k.stride * b);
                    const bool inside = pair && a >= pair->query_rows.begin && a < pair->query_rows.end() &&
                                        b >= pair->key_rows.begin && b < pair->key_rows.end() &&
                                        sub.key_visible(a - pair->query_rows.begin, b - pair->key_rows.begin);
                    INFO(to_string(ordering) << " P " << devices << " pair " << i << "," << j << " mask " << mask_kind
                                             << " a " << a << " b " << b);
                    REQUIRE(visible == inside);
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("ring attention matches the oracle, forward and backward, P = 1..8, every ordering", "[ring]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 113}, {61, 203}, {1, 1}, {7, 3}}));
  const bool causal = GENERATE(false, true);
  const Problem problem = ring_problem(seqlen_q, seqlen_k, causal);
  for (const RingOrdering ordering : kOrderings) {
    for (int devices = 1; devices <= 8; ++devices) {
      const auto seed = reference::fresh_seed();
      AttentionTensors tensors = backward_test::forward_inputs(problem, seed);
      const OracleResult oracle = oracle_attention(problem, tensors, &tensors.dO);
      reference::poison_outputs(tensors);
      run_ring(problem, &tensors, 0, tiling_of(devices, ordering), false);
      INFO(reference::describe(problem) << ", " << to_string(ordering) << ", P " << devices << ", seed " << seed);
      const auto o = reference::compare(tensors.O, oracle.O), lse = reference::compare(tensors.LSE, oracle.LSE);
      INFO(o.describe("O") << "\n" << lse.describe("LSE"));
      CHECK(o.max_error < 1e-4);
      CHECK(lse.max_error < 1e-4);
      // The backward from the ring's own O and LSE.
      tensors.dQ.values.assign(tensors.dQ.values.size(), NAN);
      tensors.dK.values.assign(tensors.dK.values.size(), NAN);
      tensors.dV.values.assign(tensors.dV.values.size(), NAN);
      run_ring(problem, &tensors, 0, tiling_of(devices, ordering), true);
      for (const auto& [name, got, expected] : {std::tuple{"dQ", &tensors.dQ, &oracle.dQ}, std::tuple{"dK", &tensors.dK, &oracle.dK},
                                                std::tuple{"dV", &tensors.dV, &oracle.dV}}) {
        const auto error = reference::compare(*got, *expected);
        INFO(error.describe(name));
        CHECK(error.max_error < 3e-4);
      }
    }
  }
}

TEST_CASE("ring attention with windows, both causal alignments and varlen matches the oracle", "[ring]") {
  Problem problem = ring_problem(97, 131, false);
  SECTION("window") { problem.mask.window_left = 23, problem.mask.window_right = 5; }
  SECTION("causal, top-left") { problem.mask.causal = true, problem.mask.alignment = CausalAlignment::top_left; }
  SECTION("varlen, causal") {
    problem.mask.causal = true;
    set_varlen(problem, {97, 5, 64}, {131, 5, 200});
  }
  SECTION("softcap, causal") { problem.mask.causal = true, problem.softcap = 5.0f; }
  for (const RingOrdering ordering : kOrderings) {
    for (const int devices : {3, 4}) {
      const auto seed = reference::fresh_seed();
      AttentionTensors tensors = backward_test::forward_inputs(problem, seed);
      const OracleResult oracle = oracle_attention(problem, tensors, &tensors.dO);
      run_ring(problem, &tensors, 0, tiling_of(devices, ordering), true);
      reference::poison_outputs(tensors);  // the forward again, from nothing
      run_ring(problem, &tensors, 0, tiling_of(devices, ordering), false);
      INFO(reference::describe(problem) << ", " << to_string(ordering) << ", P " << devices << ", seed " << seed);
      CHECK(reference::compare(tensors.O, oracle.O).max_error < 1e-4);
      CHECK(reference::compare(tensors.LSE, oracle.LSE).max_error < 1e-4);
    }
  }
}

TEST_CASE("ring attention in bf16 keeps the 2x / 3x rule against naive attention", "[ring][precision]") {
  Problem problem = ring_problem(256, 256, true);
  problem.dtype = DType::bf16;
  problem.heads_q = problem.heads_kv = 1;
  problem.head_dim = problem.head_dim_v = 64;
  const auto seed = reference::fresh_seed();
  AttentionTensors inputs = backward_test::forward_inputs(problem, seed);  // O, LSE from FA2 in bf16
  const OracleResult oracle = oracle_attention(problem, inputs, &inputs.dO);
  AttentionTensors naive = inputs;
  backward_test::run(backward_test::Schedule::standard, problem, &naive, {64, 64});
  const double naive_o = reference::compare(inputs.O, oracle.O).max_error;  // FA2's bf16 output: the baseline
  for (const RingOrdering ordering : kOrderings) {
    AttentionTensors tensors = inputs;
    reference::poison_outputs(tensors);
    run_ring(problem, &tensors, 0, {{64, 64}, 8, ordering}, false);
    const auto o = reference::compare(tensors.O, oracle.O);
    INFO(to_string(ordering) << ", seed " << seed << "\n" << o.describe("O") << "\nbaseline " << naive_o);
    CHECK(reference::within_rule(o, naive_o, {2.0, 1e-5 + reference::rounding_slack(DType::bf16, oracle.O)}));
    AttentionTensors gradients = inputs;
    run_ring(problem, &gradients, 0, {{64, 64}, 8, ordering}, true);
    for (const auto& [name, got, base, expected] :
         {std::tuple{"dQ", &gradients.dQ, &naive.dQ, &oracle.dQ}, std::tuple{"dK", &gradients.dK, &naive.dK, &oracle.dK},
          std::tuple{"dV", &gradients.dV, &naive.dV, &oracle.dV}}) {
      const auto error = reference::compare(*got, *expected);
      const double baseline = reference::compare(*base, *expected).max_error;
      INFO(error.describe(name) << " baseline " << baseline);
      // Each of the ring's block pairs writes its gradients in the dtype before they are added in
      // fp32 (as the kernel writes them), where the naive backward rounds once: the largest
      // gradient (dV of the first key, which every query sees) lands an ulp of the output format
      // past the naive error in about 1 % of seeds. The slack is that rounding, as O's above.
      CHECK(reference::within_rule(error, baseline, {3.0, 1e-4 + reference::rounding_slack(DType::bf16, *expected)}));
    }
  }
}

TEST_CASE("striped and zig-zag balance a causal ring; contiguous leaves devices idle", "[ring][balance]") {
  // Per step, the largest device's matmul work over the mean: 1 is perfect balance.
  Problem problem = ring_problem(1024, 1024, true);
  problem.batch = 1;
  const auto imbalance = [&](RingOrdering ordering) {
    RingLog log;
    run_ring<ShapeMemory>(problem, nullptr, 0, {{64, 64}, 8, ordering}, false, &log);
    double worst = 1;
    for (const auto& step : log.steps) {
      std::int64_t most = 0, total = 0;
      for (const RingDeviceStep& device : step) most = std::max(most, device.matmul_flops), total += device.matmul_flops;
      worst = std::max(worst, static_cast<double>(most) * step.size() / static_cast<double>(total));
    }
    return worst;
  };
  CHECK(imbalance(RingOrdering::contiguous) > 1.9);  // at step 1 one device of 8 has nothing to do...
  CHECK(imbalance(RingOrdering::striped) < 1.1);
  CHECK(imbalance(RingOrdering::zigzag) < 1.1);
}

TEST_CASE("the link carries K and V for P - 1 steps forward, and dK, dV one hop more backward", "[ring][link]") {
  Problem problem = ring_problem(96, 96, false);
  problem.batch = 1;
  problem.dtype = DType::bf16;
  const int devices = 4;
  const std::int64_t shard = 96 / devices, e = 2;
  for (const bool backward : {false, true}) {
    RingLog log;
    run_ring<ShapeMemory>(problem, nullptr, 0, tiling_of(devices, RingOrdering::zigzag), backward, &log);
    REQUIRE(log.steps.size() == static_cast<std::size_t>(devices));
    for (int step = 0; step < devices; ++step) {
      for (int i = 0; i < devices; ++i) {
        const RingDeviceStep& entry = log.steps[static_cast<std::size_t>(step)][static_cast<std::size_t>(i)];
        CHECK(entry.block == (i - step + devices) % devices);
        const std::int64_t kv = step + 1 < devices ? shard * (24 + 17) * e : 0;
        const std::int64_t gradients = backward ? shard * (24 + 17) * 4 : 0;
        CHECK(entry.link_bytes == kv + gradients);
      }
    }
  }
}

TEST_CASE("one device is FA2 itself, plus the merge", "[ring]") {
  // P = 1, contiguous, no mask: the same FA2 reads of Q, K, V; the merge reads and writes O_i.
  Problem problem = ring_problem(128, 128, false);
  problem.batch = 1;
  problem.heads_q = problem.heads_kv = 1;
  const std::vector<Counters> ring = run_ring<ShapeMemory>(problem, nullptr, 0, {{32, 64}, 1, RingOrdering::contiguous}, false);
  AttentionTensors none;
  ShapeMemory fa2_memory(MemoryConfig{problem.dtype, 0});
  fa2_forward(fa2_memory, head_problem(problem, 0, 0), BlockTiling{32, 64}, shape_only_head_tensors(problem, 0));
  const Counters fa2 = fa2_memory.counters();
  CHECK(ring[0][TensorId::Q] == fa2[TensorId::Q]);
  CHECK(ring[0][TensorId::K] == fa2[TensorId::K]);
  CHECK(ring[0].matmul_flops == fa2.matmul_flops);
  CHECK(ring[0][TensorId::O_partial].hbm_write_elements == 128 * 17);
}

TEST_CASE("the ring refuses what it cannot run, by name", "[ring]") {
  Problem problem = ring_problem(64, 64, true);
  AttentionTensors tensors = reference::random_inputs(problem, 1, false);
  CHECK_THROWS_WITH(run_ring(problem, &tensors, 0, tiling_of(0, RingOrdering::zigzag), false),
                    flashlab::testing::contains_text("ring devices = 0; allowed: 1..1024"));
  CHECK_THROWS_WITH(ring_ordering_from_string("spiral"), flashlab::testing::contains_text("allowed: contiguous, striped, zigzag"));
  problem.alibi_slopes = {0.5f, 0.25f};
  CHECK_THROWS_WITH(run_ring(problem, &tensors, 0, tiling_of(2, RingOrdering::zigzag), false),
                    flashlab::testing::contains_text("ring attention: ALiBi slopes given; allowed:"));
  problem.alibi_slopes.clear();
  problem.dropout.probability = 0.1f;
  CHECK_THROWS_WITH(run_ring(problem, &tensors, 0, tiling_of(2, RingOrdering::zigzag), false), flashlab::testing::contains_text("dropout"));
}
