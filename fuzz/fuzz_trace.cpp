// Fuzz target: a trace file as the visualizer reads it (sim/trace.cpp), then everything the
// visualizer computes from it before and while drawing (viz/panels.cpp set_lane_trace and the
// panels), without drawing: the score grid, the cursor, the state at positions, the softmax
// history, recorded tile values, the pseudocode line, the closed form and the bounds.
//
// A loader may refuse a file only with TraceFormatError; any other exception escapes and is a
// finding, as are crashes, sanitizer reports, hangs (-timeout) and memory past -rss_limit_mb.
// A trace that loads must also survive a round trip: written and read again, it writes the same
// text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "sim/bounds.hpp"
#include "sim/closed_forms.hpp"
#include "sim/trace.hpp"
#include "viz/pseudocode.hpp"
#include "viz/replay.hpp"

using namespace flashlab;
using namespace flashlab::viz;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_trace: %s\n", what);
  std::abort();
}

void round_trip(const Trace& trace) {
  const std::string text = trace_to_json_text(trace);
  if (trace_to_json_text(trace_from_json_text(text, "round trip")) != text) fail("a loaded trace does not survive a round trip");
}

// What set_lane_trace and the panels of one frame compute, at a few positions.
void replay(const Trace& trace) {
  const ScoreGrid grid = build_score_grid(trace);
  TraceCursor cursor(trace);
  const std::size_t size = trace.events.size();
  const TraceState end_state = state_at(trace, size);
  const Pseudocode* pseudocode = find_pseudocode(trace.info.schedule);
  for (const double fraction : {0.0, 0.37, 0.5, 1.0}) {
    cursor.seek_fraction(fraction);
    const TraceState state = state_at(trace, cursor.position());
    if (pseudocode != nullptr) (void)pseudocode->has_line(state.line);
    const SoftmaxHistory history = softmax_history(trace, cursor.position());
    for (const std::size_t update : history.updates) (void)trace.events.at(update);
    for (int r = 0; r < grid.row_cells(); ++r) {
      for (int c = 0; c < grid.col_cells(); ++c) (void)grid.status(r, c, state);
    }
    // Hovering a cell: its score (row, col) and the values recorded for it.
    if (grid.row_cells() > 0 && grid.col_cells() > 0) {
      const int row = grid.row_edges[grid.row_cells() / 2], col = grid.col_edges[grid.col_cells() / 2];
      (void)grid.row_cell_of(row), (void)grid.col_cell_of(col);
      for (const TensorId tensor : {TensorId::S, TensorId::P, grid.tensor}) {
        if (const auto tile = score_tile_values(trace, cursor.position(), tensor, row, col)) {
          (void)tile->at(row - tile->rows.begin, col - tile->cols.begin);
        }
      }
    }
  }
  for (std::size_t i = 0; i < size; ++i) (void)allocates(trace, i);
  cursor.seek(0);
  while (cursor.step_forward(StepUnit::line)) {
  }
  while (cursor.step_back(StepUnit::event) && cursor.position() + 64 > size) {
  }
  (void)cursor.play(0.5, 6.0, StepUnit::line);
  (void)end_state.hbm_read_bytes(), (void)end_state.hbm_write_bytes();

  // The traffic panel's closed form and bounds: refusals are notes there, so they are caught.
  const TraceInfo& info = trace.info;
  try {
    (void)sim::closed_form(info.schedule, trace_problem(info), {info.block_rows, info.block_cols});
  } catch (const std::exception&) {
  }
  try {
    const Problem problem = trace_problem(info);
    const std::int64_t sram = info.sram_capacity_bytes > 0
                                  ? info.sram_capacity_bytes
                                  : sim::working_set_bytes(info.schedule, problem, {info.block_rows, info.block_cols});
    (void)sim::schedule_bound(info.schedule, problem, sram);
    (void)sim::lower_bound(problem, sram);
  } catch (const std::exception&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Trace trace;
  try {
    trace = trace_from_json_text(text, "fuzz input");
  } catch (const TraceFormatError&) {
    return 0;  // refused, naming the problem: the documented outcome for a bad file
  }
  round_trip(trace);
  replay(trace);
  return 0;
}
