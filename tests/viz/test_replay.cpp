// The visualizer's replay logic: cursor and stepping, the state at a position (HBM counters,
// live SRAM tiles), the score tiles' status, the online-softmax history, pseudocode lines.
#include <cmath>

#include "catch.hpp"
#include "recorded_run.hpp"
#include "viz/pseudocode.hpp"
#include "viz/replay.hpp"

using namespace flashlab;
using namespace flashlab::viz;

namespace {

std::size_t count_line_marks_after_first(const Trace& trace) {
  std::size_t marks = 0;
  for (std::size_t i = 1; i < trace.events.size(); ++i) marks += trace.events[i].kind == EventKind::line;
  return marks;
}

}  // namespace

TEST_CASE("the counters replayed at the end equal what the memory model counted", "[viz][replay]") {
  const auto [seqlen_q, seqlen_k] = GENERATE(table<int, int>({{113, 203}, {64, 64}, {1, 37}, {39, 1}}));
  const MaskChoice mask = GENERATE(MaskChoice::none, MaskChoice::causal, MaskChoice::window);
  for (const std::string& schedule : schedule_names()) {
    const Problem problem = test::small_problem(seqlen_q, seqlen_k, 24, mask, 17);
    const test::RecordedRun run = test::record_run(schedule, problem, {32, 24}, 0);
    INFO(schedule << " " << seqlen_q << " x " << seqlen_k << " mask " << to_string(mask) << ", seed " << run.seed);
    const TraceState end = state_at(run.trace, run.trace.events.size());
    for (int t = 0; t < kTensorCount; ++t) {
      INFO("tensor " << to_string(static_cast<TensorId>(t)));
      CHECK(end.traffic[t] == run.counters.tensor[t]);
    }
    CHECK(end.loads == run.counters.loads);
    CHECK(end.stores == run.counters.stores);
    CHECK(end.sram_peak_bytes == run.counters.sram_peak_bytes);
    // Traffic only grows, and is zero before the first event.
    const TraceState start = state_at(run.trace, 0);
    CHECK(start.hbm_read_bytes() + start.hbm_write_bytes() == 0);
    CHECK(state_at(run.trace, run.trace.events.size() / 2).hbm_read_bytes() <= end.hbm_read_bytes());
  }
}

TEST_CASE("the live SRAM tiles add up to the SRAM in use at every position", "[viz][replay]") {
  for (const std::string& schedule : schedule_names()) {
    const Problem problem = test::small_problem(53, 70, 16, MaskChoice::causal);
    const test::RecordedRun run = test::record_run(schedule, problem, {16, 24}, 0);
    INFO(schedule << ", seed " << run.seed);
    for (std::size_t p = 0; p <= run.trace.events.size(); ++p) {
      const TraceState state = state_at(run.trace, p);
      std::int64_t live_bytes = 0;
      for (const LiveTile& tile : state.sram) live_bytes += tile.bytes;
      INFO("position " << p);
      REQUIRE(live_bytes == state.sram_bytes);
    }
    CHECK(state_at(run.trace, run.trace.events.size()).sram.empty());
  }
}

TEST_CASE("stepping by event and by line, scrubbing and playing", "[viz][replay]") {
  const Problem problem = test::small_problem(70, 50, 16, MaskChoice::none);
  const test::RecordedRun run = test::record_run("fa2", problem, {32, 16}, 0);
  const Trace& trace = run.trace;
  const std::size_t size = trace.events.size();
  REQUIRE(size > 10);

  TraceCursor cursor(trace);
  CHECK(cursor.position() == 0);
  CHECK_FALSE(cursor.step_back(StepUnit::event));
  std::size_t steps = 0;
  while (cursor.step_forward(StepUnit::event)) ++steps;
  CHECK(steps == size);
  CHECK(cursor.at_end());
  CHECK(cursor.fraction() == 1.0);

  // By line: every stop is just before a line mark or at the end, and back retraces forward.
  cursor.seek(0);
  std::vector<std::size_t> stops;
  while (cursor.step_forward(StepUnit::line)) {
    stops.push_back(cursor.position());
    INFO("stop " << cursor.position());
    CHECK((cursor.position() == size || trace.events[cursor.position()].kind == EventKind::line));
  }
  CHECK(stops.size() == count_line_marks_after_first(trace) + (trace.events.back().kind == EventKind::line ? 0 : 1));
  for (std::size_t k = stops.size(); k-- > 0;) {
    CHECK(cursor.position() == stops[k]);
    cursor.step_back(StepUnit::line);
  }
  CHECK(cursor.position() == 0);

  // The state at a line stop shows the line that just completed.
  const TraceState at_first_stop = state_at(trace, stops.front());
  CHECK(at_first_stop.line == trace.events.front().line);

  cursor.seek(size + 100);
  CHECK(cursor.position() == size);
  cursor.seek_fraction(0.5);
  CHECK(cursor.position() == (size + 1) / 2);
  cursor.seek_fraction(-3);
  CHECK(cursor.position() == 0);

  // Playback carries fractions of a step between frames.
  for (int frame = 0; frame < 8; ++frame) cursor.play(0.25, 2.0, StepUnit::event);
  CHECK(cursor.position() == 4);
  cursor.play(1.0, 10.0, StepUnit::event);
  CHECK(cursor.position() == 14);
  CHECK_FALSE(cursor.play(1000.0, 1000.0, StepUnit::event));
  CHECK(cursor.at_end());
}

TEST_CASE("score tiles: skipped by the mask, pending, current, done", "[viz][replay]") {
  // Causal 96 x 96 with 32 x 32 blocks: tiles above the diagonal are never computed.
  const Problem problem = test::small_problem(96, 96, 16, MaskChoice::causal);
  const test::RecordedRun run = test::record_run("fa2", problem, {32, 32}, 0);
  const ScoreGrid grid = build_score_grid(run.trace);
  REQUIRE(grid.row_edges == std::vector<int>{0, 32, 64, 96});
  REQUIRE(grid.col_edges == std::vector<int>{0, 32, 64, 96});

  const TraceState start = state_at(run.trace, 0), end = state_at(run.trace, run.trace.events.size());
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) {
      INFO("cell " << r << ", " << c);
      CHECK(grid.status(r, c, start) == (c > r ? CellStatus::skipped : CellStatus::pending));
      CHECK(grid.status(r, c, end) == (c > r ? CellStatus::skipped : CellStatus::done));
    }
  // Just after the first score tile is made, it is the current one and the rest still pending.
  const std::size_t first_visit = grid.visits.front().event;
  const TraceState after_first = state_at(run.trace, first_visit + 1);
  CHECK(grid.status(0, 0, after_first) == CellStatus::current);
  CHECK(grid.status(1, 0, after_first) == CellStatus::pending);

  // Sizes that do not divide give a last, smaller cell.
  const Problem odd = test::small_problem(113, 203, 16, MaskChoice::none);
  const ScoreGrid odd_grid = build_score_grid(test::record_run("fa2", odd, {48, 40}, 0).trace);
  CHECK(odd_grid.row_edges == std::vector<int>{0, 48, 96, 113});
  CHECK(odd_grid.col_edges == std::vector<int>{0, 40, 80, 120, 160, 200, 203});
  CHECK(odd_grid.row_cell_of(112) == 2);
  CHECK(odd_grid.col_cell_of(202) == 5);
  CHECK(odd_grid.col_cell_of(203) == -1);
}

TEST_CASE("the softmax history of a query block ends at the oracle's log-sum-exp", "[viz][replay]") {
  const MaskChoice mask = GENERATE(MaskChoice::none, MaskChoice::causal);
  const Problem problem = test::small_problem(75, 130, 24, mask);
  const test::RecordedRun run = test::record_run("fa2", problem, {32, 24}, 0);
  INFO("mask " << to_string(mask) << ", seed " << run.seed);
  const OracleResult oracle = oracle_attention(problem, run.tensors);

  const SoftmaxHistory history = softmax_history(run.trace, run.trace.events.size());
  REQUIRE(history.rows == Range{64, 11});  // the last query block
  // Unmasked, every key block is visited: ceil(130 / 24) = 6 updates.
  if (mask == MaskChoice::none) CHECK(history.updates.size() == 6);
  REQUIRE(!history.updates.empty());
  for (std::size_t k = 0; k < history.updates.size(); ++k) {
    const RecordedEvent& update = run.trace.events[history.updates[k]];
    REQUIRE(update.row_max.size() == 11);
    for (int r = 0; r < 11; ++r) {
      if (k > 0) {  // the running max never falls; the rescale is exp(m_old - m_new)
        const RecordedEvent& before = run.trace.events[history.updates[k - 1]];
        CHECK(update.row_max[r] >= before.row_max[r]);
        const float m_old = before.row_max[r], m_new = update.row_max[r];
        const double expected = m_old == m_new ? 1.0 : std::exp(double(m_old) - m_new);
        CHECK(std::abs(update.rescale[r] - expected) <= 1e-6 + 1e-5 * expected);
      }
    }
  }
  const RecordedEvent& last = run.trace.events[history.updates.back()];
  for (int r = 0; r < 11; ++r) {
    const double lse = last.row_max[r] + std::log(static_cast<double>(last.row_sum[r]));
    CHECK(std::abs(lse - oracle.LSE.at(64 + r, 0, 0)) <= 1e-4);
  }

  // Before anything, there is no block.
  CHECK(softmax_history(run.trace, 0).rows.size == 0);
}

TEST_CASE("hovered score tiles show the values the schedule computed", "[viz][replay]") {
  const Problem problem = test::small_problem(40, 56, 16, MaskChoice::none);
  const test::RecordedRun run = test::record_run("fa2", problem, {16, 16});
  INFO("seed " << run.seed);
  const auto s = score_tile_values(run.trace, run.trace.events.size(), TensorId::S, 20, 37);
  REQUIRE(s.has_value());
  CHECK(s->rows == Range{16, 16});
  CHECK(s->cols == Range{32, 16});
  // S = tau q_20 . k_37, from the inputs.
  double dot = 0;
  for (int c = 0; c < 16; ++c) dot += double(run.tensors.Q.at(20, 0, c)) * run.tensors.K.at(37, 0, c);
  CHECK(std::abs(s->at(4, 5) - dot / 4.0) <= 1e-4);
  const auto p = score_tile_values(run.trace, run.trace.events.size(), TensorId::P, 20, 37);
  REQUIRE(p.has_value());
  CHECK(p->at(4, 5) > 0.0f);
  CHECK(p->at(4, 5) <= 1.0f);
  CHECK_FALSE(score_tile_values(run.trace, 0, TensorId::S, 20, 37).has_value());
}

TEST_CASE("every line a schedule marks is in its pseudocode", "[viz][pseudocode]") {
  for (const std::string& schedule : schedule_names()) {
    INFO(schedule);
    const Pseudocode* code = find_pseudocode(schedule);
    REQUIRE(code != nullptr);
    const Problem problem = test::small_problem(40, 40, 16, MaskChoice::causal);
    const test::RecordedRun run = test::record_run(schedule, problem, {16, 16}, 0);
    int marks = 0;
    for (const RecordedEvent& e : run.trace.events) {
      if (e.kind == EventKind::line) {
        ++marks;
        INFO("line " << e.line);
        CHECK(code->has_line(e.line));
      }
    }
    CHECK(marks > 0);  // the schedule marked lines at all (else the loop above checked nothing)
  }
}

TEST_CASE("a problem too large to animate says so and points to the sweep", "[viz][record]") {
  RecordRequest request;
  request.seqlen_q = request.seqlen_k = 4096;
  try {
    record_trace(request);
    FAIL("no error");
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    INFO(message);
    CHECK(message.find("seqlen_q = 4096 is too large to animate") != std::string::npos);
    CHECK(message.find("flashlab sweep") != std::string::npos);
  }
  request.seqlen_q = request.seqlen_k = 96;
  request.block_rows = request.block_cols = 32;
  const Recording recording = record_trace(request);
  CHECK(recording.trace.info.block_rows == 32);
  CHECK(!recording.trace.events.empty());
}

TEST_CASE("a recording with blocks from M has flashlab run's blocks and counts, under either block rule", "[viz][record]") {
  for (const sim::BlockRule rule : {sim::BlockRule::fitting, sim::BlockRule::paper}) {
    for (const char* schedule : {"standard", "fa1", "fa2", "fa2_backward"}) {
      RecordRequest request;
      request.schedule = schedule;
      request.seqlen_q = request.seqlen_k = 96;
      request.head_dim = 16;
      request.blocks_from_sram = true;
      request.sram_bytes = 8 * 1024;
      request.block_rule = rule;
      const Recording recording = record_trace(request);
      sim::RunOptions options;  // as `flashlab run --sram 8K --block-rule ...` does it
      options.memory = sim::MemoryKind::shape;
      options.sram_bytes = request.sram_bytes;
      options.block_rule = rule;
      const sim::RunResult run = sim::run_schedule(schedule, request_problem(request), options);
      INFO(schedule << ", rule " << sim::to_string(rule));
      CHECK(recording.trace.info.block_rows == run.blocks.block_rows);
      CHECK(recording.trace.info.block_cols == run.blocks.block_cols);
      CHECK(recording.block_rule == run.block_rule);
      CHECK(recording.counters == run.counters);
    }
  }
}

TEST_CASE("a ring's replay shows which block each device holds at each step", "[viz][replay][ring]") {
  const RingOrdering ordering = GENERATE(RingOrdering::contiguous, RingOrdering::striped, RingOrdering::zigzag);
  const Problem problem = test::small_problem(48, 48, 16, MaskChoice::causal);
  sim::BlockSizes blocks{8, 8};
  blocks.devices = 3, blocks.ordering = ordering;
  const test::RecordedRun run = test::record_run("ring", problem, blocks, 0);
  REQUIRE(run.trace.info.devices == 3);
  const RingHoldings start = ring_holdings(run.trace, 0);
  CHECK(start.step == -1);
  const RingHoldings end = ring_holdings(run.trace, run.trace.events.size());
  CHECK(end.step == 2);
  for (int step = 0; step < 3; ++step)
    for (int device = 0; device < 3; ++device) CHECK(end.blocks[step][device] == (device - step + 3) % 3);
  // Just after device 1 begins step 1: it holds device 0's block; device 2 has not begun the step.
  std::size_t position = 0;
  for (std::size_t i = 0; i < run.trace.events.size(); ++i) {
    const RecordedEvent& e = run.trace.events[i];
    if (e.kind == EventKind::ring_step && e.step == 1 && e.device == 1) position = i + 1;
  }
  REQUIRE(position > 0);
  const RingHoldings middle = ring_holdings(run.trace, position);
  CHECK(middle.step == 1);
  CHECK(middle.device == 1);
  CHECK(middle.blocks[1][1] == 0);
  CHECK(middle.blocks[1][2] == -1);
  CHECK(ring_holdings(test::record_run("fa2", problem, {8, 8}, 0).trace, 10).devices == 0);
  // The file round trip keeps the ring's steps.
  CHECK(trace_from_json_text(trace_to_json_text(run.trace)) == run.trace);
}
