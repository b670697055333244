// The visualizer's state and panels (Dear ImGui). Plain state in two structs; one free function
// per panel; the replay logic they draw from is in replay.hpp and has no ImGui in it.
#pragma once

#include <imgui.h>

#include <optional>
#include <string>

#include "record.hpp"
#include "sim/bounds.hpp"
#include "replay.hpp"

namespace flashlab::viz {

// One schedule's trace and where its replay stands.
struct Lane {
  std::string schedule = "fa2";
  bool has_trace = false;
  Trace trace;
  std::optional<Counters> counted;      // the memory model's counters of the whole run
  std::optional<Counters> closed_form;  // sim/closed_forms.hpp, when it knows the schedule
  std::string closed_form_note;         // why there is none
  std::optional<sim::Bound> bound;      // sim/bounds.hpp: the schedule's asymptotic bound
  std::optional<sim::Bound> lower_bound;  // and the lower bound of every exact algorithm
  std::int64_t bound_sram_bytes = 0;    // the M the bounds are taken at
  std::string block_rule;               // how the blocks were chosen: given, fitting or paper (recorded runs)
  std::string bound_note;
  ScoreGrid grid;
  std::vector<TensorId> hbm_tensors;    // tensors the trace moves, in first-use order
  TraceCursor cursor;
  TraceState state;                     // at the cursor, refreshed once per frame
  TraceState end_state;                 // after the last event: the whole run
  bool keeps_softmax_state = false;     // the trace has online-softmax updates
  int softmax_row = 0;                  // the row of the query block whose m and l are plotted
  int scrolled_to_line = 0;             // the pseudocode line last scrolled into view
  std::string error;
  ImVec4 score_grid_rect{0, 0, 0, 0};   // where the score tiles were drawn (x0, y0, x1, y1)
};

struct AppState {
  RecordRequest request;  // the problem and the tiling, shared by both lanes
  bool compare = false;   // a second schedule side by side on the same problem
  Lane lanes[2];
  bool playing = false;
  float speed = 6.0f;     // steps per second
  StepUnit unit = StepUnit::line;
  char trace_path[512] = "trace.json";
  std::string message;    // the last error or note, shown in the controls
  bool stale = false;     // the controls changed since the traces were recorded
  bool relayout = true;   // place the windows again (first frame, compare toggled, resize)
  ImVec2 last_display{0, 0};
};

// Records the trace of each lane's schedule on the request's problem. Errors (bad input, too
// large to animate, SRAM overflow) go to the lane's error, never out.
void run_lanes(AppState& app);
// Replays a trace file in lane 0; a bad file leaves a message naming the problem.
void load_lane_trace(AppState& app, const std::string& path);
// Puts a trace into a lane: resets its cursor and derived views. The trace has passed
// check_replayable (record_trace and load_replay_trace see to it).
void set_lane_trace(Lane& lane, Trace trace, std::optional<Counters> counted);
// Advances playback by the frame's time and refreshes each lane's state.
void update_lanes(AppState& app, float seconds);

// The whole interface for one frame.
void ShowApp(AppState& app);

// Panels (each a window; the lane's name makes the title unique).
void ShowControls(AppState& app, bool* open);
void ShowScoreTiles(Lane& lane, const char* title, bool* open);
void ShowMemory(Lane& lane, const char* title, bool* open);
void ShowSoftmaxState(Lane& lane, const char* title, bool* open);
void ShowCounters(Lane& lane, const char* title, bool* open);
void ShowPseudocode(Lane& lane, const char* title, bool* open);
void ShowRing(Lane& lane, const char* title, bool* open);

}  // namespace flashlab::viz
