// The mapping search (sim/search.hpp): its best tilings derived by hand, the reduction to one
// block per block count against the exhaustive search, the constraints, the Pareto front, the
// block rules' place, the verification run, and its refusals.
#include <stdexcept>
#include <string>

#include "catch.hpp"
#include "sim/closed_forms.hpp"
#include "sim/machines.hpp"
#include "sim/search.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

// N = 1024, d = 64, fp16: one tensor of N x d is 131072 bytes; LSE is 4096 bytes.
Problem fp16_problem() {
  Problem p;
  p.seqlen_q = p.seqlen_k = 1024;
  p.head_dim = 64;
  p.dtype = DType::fp16;
  return p;
}

SearchOptions options_for(std::vector<std::string> schedules, std::int64_t sram_bytes, int multiple_of) {
  SearchOptions options;
  options.schedules = std::move(schedules);
  options.constraints.sram_bytes = sram_bytes;
  options.constraints.multiple_of = multiple_of;
  return options;
}

// FA2 unmasked: Q, O and LSE once, K and V once per query block, so HBM = (2 + 2 Tr) N d e + 4 N.
std::int64_t fa2_hbm(std::int64_t row_blocks) { return (2 + 2 * row_blocks) * 131072 + 4096; }

}  // namespace

TEST_CASE("search: FA2's best tiling of 64 KB, derived by hand, beats the fitting rule 1.86x", "[search]") {
  // Working set (closed_forms.hpp) with e = 2, d = 64: 2 (64 r + 64 r + 64 c + 64 c + 2 r c) + 8 r + 12 r
  // = 276 r + 256 c + 4 r c. Traffic falls with Tr = ceil(1024 / Br) only, so the best takes
  // Bc = 16 and the largest Br: 340 r + 4096 <= 65536 gives r <= 180, Br = 176 (Tr = 6; 176 is
  // also the smallest multiple of 16 with 6 blocks, ceil(1024 / 6) = 171).
  const SearchResult result = search_tilings(fp16_problem(), options_for({"fa2"}, 65536, 16));
  CHECK(result.best.schedule == "fa2");
  CHECK(result.best.blocks.block_rows == 176);
  CHECK(result.best.blocks.block_cols == 16);
  CHECK(result.best.hbm_bytes == fa2_hbm(6));
  CHECK(result.best.working_set_bytes == 276 * 176 + 256 * 16 + 4 * 176 * 16);
  // The fitting rule: Br = ceil(M / 4d) = 128 shrunk with Bc = min(Br, 64) until 532 Br + 16384
  // <= 65536: Br = 92, Tr = 12. The paper rule 128 x 64 holds 84480 B > M: outside.
  REQUIRE(result.rules.size() == 2);
  const RuleTiling& fitting = result.rules[0];
  const RuleTiling& paper = result.rules[1];
  CHECK(fitting.rule == "fitting");
  CHECK(fitting.tiling.blocks.block_rows == 92);
  CHECK(fitting.tiling.blocks.block_cols == 64);
  CHECK(fitting.tiling.hbm_bytes == fa2_hbm(12));
  CHECK_FALSE(fitting.within_constraints);  // 92 is no multiple of 16
  CHECK_FALSE(fitting.on_front);            // 96 x 16 has 11 blocks and a smaller working set
  CHECK(fitting.ratio_to_best == Approx(static_cast<double>(fa2_hbm(12)) / fa2_hbm(6)));
  CHECK(fitting.ratio_to_best > 1.85);
  CHECK(paper.rule == "paper");
  CHECK(paper.tiling.blocks.block_rows == 128);
  CHECK(paper.tiling.working_set_bytes == 84480);
  CHECK_FALSE(paper.within_constraints);
  CHECK(paper.tiling.hbm_bytes == fa2_hbm(8));
  // The best is the front's last point; along the front the working set rises as traffic falls.
  REQUIRE_FALSE(result.front.empty());
  CHECK(result.front.back().blocks == result.best.blocks);
  for (std::size_t i = 1; i < result.front.size(); ++i) {
    CHECK(result.front[i].working_set_bytes > result.front[i - 1].working_set_bytes);
    CHECK(result.front[i].hbm_bytes < result.front[i - 1].hbm_bytes);
  }
  // Ranks: only tilings with fewer than 8 query blocks (Br >= 128 multiples of 16, Bc from 16)
  // beat the paper's traffic, and fewer than 12 the fitting rule's: both rank behind 1.
  CHECK(paper.rank > 1);
  CHECK(fitting.rank > paper.rank);
  // The best tiling ran through the real schedule in an arena of M and counted the closed form.
  CHECK(result.verification.done);
  CHECK(result.verification.closed_form_equal);
  CHECK(result.verification.arena_bytes == 65536);
  CHECK(result.verification.hbm_bytes == fa2_hbm(6));
  CHECK(result.verification.sram_peak_bytes <= 65536);
}

TEST_CASE("search: a register budget of 32 accumulators x 128 threads caps FA2's Br at 48", "[search]") {
  // Accumulators S_ij and O_i: Br (Bc + 64) <= 4096 with Bc = 16: Br <= 51, so 48 (Tr = 22).
  SearchOptions options = options_for({"fa2"}, 65536, 16);
  options.constraints.registers_per_thread = 32;
  const SearchResult result = search_tilings(fp16_problem(), options);
  CHECK(result.best.blocks.block_rows == 48);
  CHECK(result.best.blocks.block_cols == 16);
  CHECK(result.best.accumulator_elements == 48 * (16 + 64));
  CHECK(result.best.hbm_bytes == fa2_hbm(22));
  for (const SearchCandidate& f : result.front) CHECK(f.accumulator_elements <= 32 * 128);
}

TEST_CASE("search: max rows, square blocks and multiples constrain the tilings", "[search]") {
  SearchOptions options = options_for({"fa2"}, 65536, 16);
  options.constraints.max_rows = 64;  // Tr = 16
  CHECK(search_tilings(fp16_problem(), options).best.blocks.block_rows == 64);
  options.constraints.max_rows = 0;
  options.constraints.square = true;  // 276 B + 256 B + 4 B^2 <= 65536: B <= 77, so 64
  const SearchResult square = search_tilings(fp16_problem(), options);
  CHECK(square.best.blocks.block_rows == 64);
  CHECK(square.best.blocks.block_cols == 64);
  for (const SearchCandidate& f : square.front) {
    CHECK(f.blocks.block_rows == f.blocks.block_cols);
    CHECK(f.blocks.block_rows % 16 == 0);
  }
}

TEST_CASE("search: one block per block count finds what the exhaustive search finds (unmasked)", "[search]") {
  // Sizes that do not divide, d != dv, GQA; every tiled schedule of every pass.
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 53;
  p.seqlen_k = 47;
  p.head_dim = 12;
  p.head_dim_v = 8;
  for (const char* schedule : {"fa1", "fa2", "fa1_backward", "fa2_backward", "fa2_backward_atomic", "square_tiling",
                               "memory_efficient", "standard", "split_kv"}) {
    SearchOptions options = options_for({schedule}, 3072, 1);
    options.verify = false;
    const SearchResult reduced = search_tilings(p, options);
    options.exhaustive = true;
    const SearchResult every = search_tilings(p, options);
    INFO(schedule << ": reduced " << reduced.candidates_costed << " tilings, exhaustive " << every.candidates_costed);
    CHECK(reduced.candidates_costed <= every.candidates_costed);
    CHECK(reduced.best.hbm_bytes == every.best.hbm_bytes);
    CHECK(reduced.best.working_set_bytes == every.best.working_set_bytes);
    REQUIRE(reduced.front.size() == every.front.size());
    for (std::size_t i = 0; i < every.front.size(); ++i) {
      CHECK(reduced.front[i].hbm_bytes == every.front[i].hbm_bytes);
      CHECK(reduced.front[i].working_set_bytes == every.front[i].working_set_bytes);
    }
  }
}

TEST_CASE("search: masked problems, loop orders compared, the time objective", "[search]") {
  Problem causal = fp16_problem();
  causal.seqlen_q = causal.seqlen_k = 256;
  causal.mask.causal = true;
  const SearchResult masked = search_tilings(causal, options_for({"fa2"}, 65536, 16));
  CHECK(masked.verification.closed_form_equal);
  SearchOptions every = options_for({"fa2"}, 65536, 16);
  every.exhaustive = true;
  CHECK(search_tilings(causal, every).candidates_costed == masked.candidates_costed);  // masked: every tiling costed
  CHECK(masked.best.hbm_bytes == closed_form("fa2", causal, masked.best.blocks, 65536).hbm_bytes());

  // FA1's loop order reads Q and the fp32 O accumulator once per key block; FA2's reads K, V once
  // per query block: FA2 wins, and both orders' rules are placed.
  const SearchResult orders = search_tilings(fp16_problem(), options_for({"fa1", "fa2"}, 65536, 16));
  CHECK(orders.best.schedule == "fa2");
  CHECK(orders.rules.size() == 4);
  CHECK(orders.verification.closed_form_equal);

  const Machine& machine = default_machine();
  SearchOptions timed = options_for({"fa2"}, 65536, 16);
  timed.objective = SearchObjective::time;
  timed.machine = &machine;
  const SearchResult time = search_tilings(fp16_problem(), timed);
  CHECK(time.best.seconds > 0);
  CHECK(time.machine_key == machine.key);
  for (const SearchCandidate& f : time.front) CHECK(f.seconds >= time.best.seconds);
}

TEST_CASE("search: bad input is refused naming the input and the range", "[search]") {
  const Problem p = fp16_problem();
  auto refuses = [&](SearchOptions options, const std::string& words) {
    try {
      search_tilings(p, options);
      FAIL("no error for " << words);
    } catch (const std::invalid_argument& error) {
      CHECK_THAT(std::string(error.what()), flashlab::testing::contains_text(words));
    }
  };
  refuses(options_for({"fa9"}, 65536, 16), "schedule 'fa9' is unknown");
  refuses(options_for({"fa2", "fa2_backward"}, 65536, 16), "different passes");
  refuses(options_for({"fa2"}, 65536, 0), "multiple_of = 0; allowed: 1..65536");
  refuses(options_for({"fa2"}, 0, 16), "SRAM size M (bytes) = 0");
  refuses(options_for({"fa2"}, 4096, 16), "no tiling of fa2 has its working set within M = 4096 B");
  SearchOptions timed = options_for({"fa2"}, 65536, 16);
  timed.objective = SearchObjective::time;
  refuses(timed, "needs a machine preset");
  CHECK_THROWS_AS(search_objective_from_string("speed"), std::invalid_argument);
}

TEST_CASE("search: past the work budget, the bound-pruned search finds the best of the full one", "[search]") {
  Problem p;
  p.seqlen_q = p.seqlen_k = 128;
  p.head_dim = 8;
  p.dtype = DType::fp16;
  const Machine& machine = default_machine();
  for (const char* schedule : {"fa1", "fa2", "fa2_backward", "memory_efficient"}) {
    for (SearchObjective objective : {SearchObjective::hbm_bytes, SearchObjective::time}) {
      SearchOptions options = options_for({schedule}, 4096, 1);
      options.objective = objective;
      options.machine = &machine;
      options.verify = false;
      const SearchResult full = search_tilings(p, options);
      REQUIRE(full.candidates_costed == full.candidates_total);  // within the default budget: every tiling costed
      options.max_tile_steps = 2000;
      const SearchResult pruned = search_tilings(p, options);
      INFO(schedule << " " << to_string(objective) << ": " << pruned.candidates_costed << " costed, " << pruned.candidates_pruned
                    << " pruned, " << pruned.candidates_skipped << " skipped of " << pruned.candidates_total);
      CHECK(pruned.candidates_pruned > 0);
      CHECK(pruned.candidates_costed + pruned.candidates_pruned + pruned.candidates_skipped == pruned.candidates_total);
      if (pruned.best_exact) {
        CHECK(pruned.best.objective == full.best.objective);
        CHECK(pruned.best.working_set_bytes == full.best.working_set_bytes);
      }
      if (pruned.front_complete) CHECK(pruned.front.size() == full.front.size());
      options.max_tile_steps = full.tile_steps_total / 2;  // half the full work
      const SearchResult finished = search_tilings(p, options);
      CHECK(finished.candidates_costed < finished.candidates_total);
      CHECK(finished.best_exact);
      CHECK(finished.best.objective == full.best.objective);
      // FA1's and FA2's bounds are tight (their traffic follows one block count): the front completes too.
      if (std::string(schedule) == "fa1" || std::string(schedule) == "fa2") CHECK(finished.front_complete);
      if (finished.front_complete) {
        REQUIRE(finished.front.size() == full.front.size());
        for (std::size_t i = 0; i < full.front.size(); ++i) CHECK(finished.front[i].objective == full.front[i].objective);
      }
    }
  }
}
