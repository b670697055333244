// The visualizer's panels, in Dear ImGui's immediate-mode style.
//
// [SECTION] Index
//   [SECTION] Helpers: colours per tensor, byte sizes, problem of a trace, a lane panel's window
//   [SECTION] Lanes: recording, loading, playback
//   [SECTION] Layout: where each panel goes
//   [SECTION] Controls: schedule, problem, tiling, trace file, playback
//   [SECTION] Score tiles: the score matrix as tiles, Q/K/V/O strips, S and P on hover
//   [SECTION] Memory: HBM and SRAM boxes, transfers, SRAM occupancy against M
//   [SECTION] Online softmax: running max m, sum l and the rescale factor per row
//   [SECTION] Counters: HBM bytes per tensor so far, the whole run, the closed form
//   [SECTION] Pseudocode: the paper's algorithm with the current line highlighted
//   [SECTION] Ring: which key/value block each device holds at each step (Ring Attention)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "app.hpp"
#include "pseudocode.hpp"
#include "sim/closed_forms.hpp"

namespace flashlab::viz {

// ---------------------------------------------------------------------------------------------
// [SECTION] Helpers

namespace {

ImU32 tensor_color(TensorId id, float alpha = 1.0f) {
  ImVec4 c;
  switch (id) {
    case TensorId::Q: case TensorId::dQ: c = {0.30f, 0.55f, 0.95f, 1}; break;
    case TensorId::K: case TensorId::dK: c = {0.35f, 0.80f, 0.40f, 1}; break;
    case TensorId::V: case TensorId::dV: c = {0.20f, 0.75f, 0.75f, 1}; break;
    case TensorId::O: case TensorId::dO: case TensorId::O_partial: c = {0.95f, 0.60f, 0.20f, 1}; break;
    case TensorId::S: case TensorId::dS: case TensorId::A: c = {0.70f, 0.45f, 0.90f, 1}; break;
    case TensorId::P: case TensorId::dP: c = {0.90f, 0.40f, 0.65f, 1}; break;
    default: c = {0.75f, 0.75f, 0.45f, 1}; break;  // statistics m, l, LSE, D
  }
  c.w = alpha;
  return ImGui::ColorConvertFloat4ToU32(c);
}

const ImU32 kDoneColor = IM_COL32(55, 105, 160, 255);
const ImU32 kCurrentColor = IM_COL32(250, 170, 40, 255);
const ImU32 kPendingColor = IM_COL32(72, 72, 78, 255);
const ImU32 kSkippedColor = IM_COL32(28, 28, 32, 255);
const ImU32 kHatchColor = IM_COL32(90, 60, 60, 255);
const ImU32 kFlashColor = IM_COL32(255, 255, 255, 255);

std::string bytes_text(std::int64_t bytes) {
  char text[32];
  if (bytes < 10 * 1024) {
    std::snprintf(text, sizeof text, "%lld B", static_cast<long long>(bytes));
  } else if (bytes < 10 * 1024 * 1024) {
    std::snprintf(text, sizeof text, "%.1f KiB", bytes / 1024.0);
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  return text;
}

std::string range_text(Range r) {
  char text[48];
  std::snprintf(text, sizeof text, "[%d, %d)", r.begin, r.end());
  return text;
}

std::string event_text(const RecordedEvent& e) {
  switch (e.kind) {
    case EventKind::line: return "line " + std::to_string(e.line);
    case EventKind::ring_step:
      return "step " + std::to_string(e.step) + ": device " + std::to_string(e.device) + " holds K/V block " +
             std::to_string(e.block);
    case EventKind::softmax_update: return "softmax state of rows " + range_text(e.rows);
    case EventKind::load:
    case EventKind::store:
      return std::string(to_string(e.kind)) + " " + to_string(e.tensor) + " rows " + range_text(e.rows) + ", " +
             bytes_text(e.bytes);
    case EventKind::compute:
      return e.op + " -> " + to_string(e.tensor) + " " + std::to_string(e.rows.size) + "x" + std::to_string(e.cols.size);
    case EventKind::free: return std::string("free ") + to_string(e.tensor) + " " + std::to_string(e.rows.size) + "x" +
                                 std::to_string(e.cols.size);
  }
  return "";
}

// Tensors indexed by query rows (drawn left of the score grid) and by keys (drawn above it).
bool is_query_side(TensorId id) {
  return id == TensorId::Q || id == TensorId::O || id == TensorId::dO || id == TensorId::dQ;
}
bool is_key_side(TensorId id) {
  return id == TensorId::K || id == TensorId::V || id == TensorId::dK || id == TensorId::dV;
}

void ShowLaneError(const Lane& lane) {
  if (!lane.error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 110, 255));
    ImGui::TextWrapped("%s", lane.error.c_str());
    ImGui::PopStyleColor();
  } else {
    ImGui::TextDisabled("No trace yet: choose a schedule and a problem, then Run.");
  }
}

// Begins the window of a lane's panel. False (the window already ended) when it is collapsed or
// the lane has no trace yet (it then says why); when true the panel ends the window itself.
bool BeginLanePanel(const Lane& lane, const char* title, bool* open) {
  if (!ImGui::Begin(title, open)) {
    ImGui::End();
    return false;
  }
  if (!lane.has_trace) {
    ShowLaneError(lane);
    ImGui::End();
    return false;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// [SECTION] Lanes

void set_lane_trace(Lane& lane, Trace trace, std::optional<Counters> counted) {
  lane.trace = std::move(trace);
  lane.schedule = lane.trace.info.schedule;
  lane.counted = counted;
  lane.grid = build_score_grid(lane.trace);
  lane.hbm_tensors.clear();
  for (const RecordedEvent& e : lane.trace.events) {
    if ((e.kind == EventKind::load || e.kind == EventKind::store) &&
        std::find(lane.hbm_tensors.begin(), lane.hbm_tensors.end(), e.tensor) == lane.hbm_tensors.end())
      lane.hbm_tensors.push_back(e.tensor);
  }
  lane.cursor = TraceCursor(lane.trace);
  lane.state = state_at(lane.trace, 0);
  lane.end_state = state_at(lane.trace, lane.trace.events.size());
  lane.keeps_softmax_state = std::any_of(lane.trace.events.begin(), lane.trace.events.end(),
                                         [](const RecordedEvent& e) { return e.kind == EventKind::softmax_update; });
  lane.softmax_row = 0;
  lane.error.clear();
  lane.has_trace = true;

  const TraceInfo& info = lane.trace.info;
  lane.closed_form.reset();
  try {
    lane.closed_form = sim::closed_form(info.schedule, trace_problem(info), {info.block_rows, info.block_cols});
    lane.closed_form_note.clear();
  } catch (const std::exception& error) {
    lane.closed_form_note = std::string("no closed form: ") + error.what();
  }

  // The bounds at M; with block sizes and no M, at the SRAM those blocks need (their working set).
  lane.bound.reset(), lane.lower_bound.reset();
  try {
    const Problem problem = trace_problem(info);
    lane.bound_sram_bytes = info.sram_capacity_bytes > 0
                                ? info.sram_capacity_bytes
                                : sim::working_set_bytes(info.schedule, problem, {info.block_rows, info.block_cols});
    double kept_area = 0, total_area = 0;  // block-sparse: the kept fraction s of the score matrix
    for (int r = 0; r < lane.grid.row_cells(); ++r)
      for (int c = 0; c < lane.grid.col_cells(); ++c) {
        const double area = double(lane.grid.row_edges[r + 1] - lane.grid.row_edges[r]) *
                            (lane.grid.col_edges[c + 1] - lane.grid.col_edges[c]);
        total_area += area;
        if (lane.grid.first(r, c) != ScoreGrid::kNever) kept_area += area;
      }
    const double sparsity = total_area > 0 ? kept_area / total_area : 1.0;
    lane.bound = sim::schedule_bound(info.schedule, problem, lane.bound_sram_bytes, sparsity);
    lane.lower_bound = sim::lower_bound(problem, lane.bound_sram_bytes);
    lane.bound_note.clear();
  } catch (const std::exception& error) {
    lane.bound_note = std::string("no bound: ") + error.what();
  }
}

void run_lanes(AppState& app) {
  app.playing = false;
  app.message.clear();
  app.stale = false;
  for (int i = 0; i < (app.compare ? 2 : 1); ++i) {
    Lane& lane = app.lanes[i];
    RecordRequest request = app.request;
    request.schedule = lane.schedule;
    try {
      Recording recording = record_trace(request);
      set_lane_trace(lane, std::move(recording.trace), recording.counters);
      lane.block_rule = recording.block_rule;
    } catch (const std::exception& error) {
      lane.has_trace = false;
      lane.error = lane.schedule + ": " + error.what();
    }
  }
}

void load_lane_trace(AppState& app, const std::string& path) {
  try {
    set_lane_trace(app.lanes[0], load_replay_trace(path), std::nullopt);
    app.compare = false;
    app.relayout = true;
    app.message = "replaying " + path;
  } catch (const std::exception& error) {
    app.message = error.what();
  }
}

void update_lanes(AppState& app, float seconds) {
  Lane& lead = app.lanes[0];
  if (app.playing && lead.has_trace && !lead.cursor.play(seconds, app.speed, app.unit)) app.playing = false;
  if (app.compare && app.lanes[1].has_trace) app.lanes[1].cursor.seek_fraction(lead.cursor.fraction());
  for (Lane& lane : app.lanes) {
    if (lane.has_trace && lane.state.position != lane.cursor.position()) lane.state = state_at(lane.trace, lane.cursor.position());
  }
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Layout

namespace {

void place(ImVec2 position, ImVec2 size, ImGuiCond cond) {
  ImGui::SetNextWindowPos(position, cond);
  ImGui::SetNextWindowSize(size, cond);
}

}  // namespace

void ShowApp(AppState& app) {
  const ImVec2 display = ImGui::GetIO().DisplaySize;
  if (display.x != app.last_display.x || display.y != app.last_display.y) app.relayout = true;
  app.last_display = display;
  const ImGuiCond cond = app.relayout ? ImGuiCond_Always : ImGuiCond_FirstUseEver;

  const float controls_height = 4 * ImGui::GetFrameHeightWithSpacing() + 2 * ImGui::GetStyle().WindowPadding.y + 4;
  place({0, 0}, {display.x, controls_height}, cond);
  ShowControls(app, nullptr);

  const float top = controls_height, height = display.y - controls_height, width = display.x;
  const int lanes = app.compare ? 2 : 1;
  for (int i = 0; i < lanes; ++i) {
    Lane& lane = app.lanes[i];
    char score[96], memory[96], softmax[96], counters[96], code[96];
    const char* name = lane.schedule.c_str();
    std::snprintf(score, sizeof score, "Score tiles: %s###score%d", name, i);
    std::snprintf(memory, sizeof memory, "HBM and SRAM: %s###memory%d", name, i);
    std::snprintf(softmax, sizeof softmax, lane.trace.info.devices > 0 ? "Ring steps: %s###softmax%d" : "Online softmax: %s###softmax%d",
                  name, i);
    std::snprintf(counters, sizeof counters, "HBM traffic: %s###counters%d", name, i);
    std::snprintf(code, sizeof code, "Pseudocode: %s###code%d", name, i);
    if (!app.compare) {
      const float upper = std::floor(height * 0.56f);
      place({0, top}, {width * 0.40f, upper}, cond);
      ShowScoreTiles(lane, score, nullptr);
      place({width * 0.40f, top}, {width * 0.32f, upper}, cond);
      ShowMemory(lane, memory, nullptr);
      place({width * 0.72f, top}, {width * 0.28f, upper}, cond);
      ShowPseudocode(lane, code, nullptr);
      place({0, top + upper}, {width * 0.40f, height - upper}, cond);
      if (lane.trace.info.devices > 0) {
        ShowRing(lane, softmax, nullptr);  // a ring's steps in the softmax panel's place
      } else {
        ShowSoftmaxState(lane, softmax, nullptr);
      }
      place({width * 0.40f, top + upper}, {width * 0.60f, height - upper}, cond);
      ShowCounters(lane, counters, nullptr);
    } else {
      // Side by side: one row per schedule, the same panels in the same columns.
      const float lane_height = std::floor(height / 2), y = top + i * lane_height;
      const float columns[] = {0.0f, 0.25f, 0.46f, 0.64f, 0.84f, 1.0f};
      auto column = [&](int c) {
        place({width * columns[c], y}, {width * (columns[c + 1] - columns[c]), lane_height}, cond);
      };
      column(0), ShowScoreTiles(lane, score, nullptr);
      column(1), ShowMemory(lane, memory, nullptr);
      column(2);
      if (lane.trace.info.devices > 0) {
        ShowRing(lane, softmax, nullptr);
      } else {
        ShowSoftmaxState(lane, softmax, nullptr);
      }
      column(3), ShowCounters(lane, counters, nullptr);
      column(4), ShowPseudocode(lane, code, nullptr);
    }
  }
  app.relayout = false;
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Controls

namespace {

bool ScheduleCombo(const char* label, std::string* schedule) {
  bool changed = false;
  ImGui::SetNextItemWidth(130);
  if (ImGui::BeginCombo(label, schedule->c_str())) {
    for (const std::string& name : schedule_names()) {
      const bool selected = name == *schedule;
      if (ImGui::Selectable(name.c_str(), selected)) *schedule = name, changed = true;
      if (selected) ImGui::SetItemDefaultFocus();
    }
    ImGui::EndCombo();
  }
  return changed;
}

bool SmallInt(const char* label, int* value, int low, int high) {
  ImGui::SetNextItemWidth(90);
  const bool changed = ImGui::InputInt(label, value, 0, 0);
  *value = std::clamp(*value, low, high);
  return changed;
}

}  // namespace

void ShowControls(AppState& app, bool* open) {
  if (!ImGui::Begin("FlashLab visualizer", open, ImGuiWindowFlags_NoCollapse)) {
    ImGui::End();
    return;
  }
  RecordRequest& r = app.request;

  // Row 1: what to run.
  bool changed = ScheduleCombo("schedule", &app.lanes[0].schedule);
  ImGui::SameLine();
  if (ImGui::Checkbox("side by side with", &app.compare)) changed = true, app.relayout = true;
  ImGui::SameLine();
  changed |= ScheduleCombo("##second", &app.lanes[1].schedule);
  ImGui::SameLine(0, 24);
  changed |= SmallInt("N queries", &r.seqlen_q, 1, 1 << 20);
  ImGui::SameLine();
  changed |= SmallInt("N keys", &r.seqlen_k, 1, 1 << 20);
  ImGui::SameLine();
  changed |= SmallInt("d", &r.head_dim, 1, 512);
  ImGui::SameLine(0, 24);
  int mask = static_cast<int>(r.mask);
  ImGui::SetNextItemWidth(90);
  if (ImGui::Combo("mask", &mask, "none\0causal\0window\0")) r.mask = static_cast<MaskChoice>(mask), changed = true;
  if (r.mask == MaskChoice::window) {
    ImGui::SameLine();
    changed |= SmallInt("window", &r.window, 0, 1 << 20);
  }

  // Row 2: tiling and the trace file.
  int tiling = r.blocks_from_sram ? 1 : 0;
  changed |= ImGui::RadioButton("block sizes", &tiling, 0);
  ImGui::SameLine();
  changed |= ImGui::RadioButton("from SRAM size M", &tiling, 1);
  r.blocks_from_sram = tiling == 1;
  ImGui::SameLine(0, 16);
  if (!r.blocks_from_sram) {
    changed |= SmallInt("Br", &r.block_rows, 1, 4096);
    ImGui::SameLine();
    changed |= SmallInt("Bc", &r.block_cols, 1, 4096);
    ImGui::SameLine();
  }
  int sram_kib = static_cast<int>(r.sram_bytes / 1024);
  if (SmallInt(r.blocks_from_sram ? "M (KiB)" : "M (KiB, 0: unbounded)", &sram_kib, 0, 1 << 20)) {
    r.sram_bytes = static_cast<std::int64_t>(sram_kib) * 1024;
    changed = true;
  }
  if (r.blocks_from_sram) {
    ImGui::SameLine();
    int rule = r.block_rule == sim::BlockRule::paper ? 1 : 0;
    ImGui::SetNextItemWidth(90);
    if (ImGui::Combo("block rule", &rule, "fitting\0paper\0")) {
      r.block_rule = rule == 1 ? sim::BlockRule::paper : sim::BlockRule::fitting;
      changed = true;
    }
  }
  ImGui::SameLine(0, 16);
  if (ImGui::Button("Run")) run_lanes(app), app.relayout = true;
  ImGui::SameLine(0, 32);
  ImGui::SetNextItemWidth(220);
  ImGui::InputText("##trace file", app.trace_path, sizeof app.trace_path);
  ImGui::SameLine();
  if (ImGui::Button("Load trace")) load_lane_trace(app, app.trace_path);
  ImGui::SameLine();
  if (ImGui::Button("Save trace") && app.lanes[0].has_trace) {
    try {
      save_trace(app.trace_path, app.lanes[0].trace);
      app.message = std::string("saved ") + app.trace_path;
    } catch (const std::exception& error) {
      app.message = error.what();
    }
  }
  if (changed) app.stale = true;

  // Row 3: playback.
  Lane& lead = app.lanes[0];
  if (ImGui::Button("|<")) lead.cursor.seek(0);
  ImGui::SameLine();
  if (ImGui::Button("< step")) lead.cursor.step_back(app.unit), app.playing = false;
  ImGui::SameLine();
  if (ImGui::Button(app.playing ? "Pause" : "Play", ImVec2(60, 0))) {
    if (!app.playing && lead.cursor.at_end()) lead.cursor.seek(0);
    app.playing = !app.playing && lead.has_trace;
  }
  ImGui::SameLine();
  if (ImGui::Button("step >")) lead.cursor.step_forward(app.unit), app.playing = false;
  ImGui::SameLine();
  if (ImGui::Button(">|")) lead.cursor.seek(lead.cursor.size());
  ImGui::SameLine(0, 16);
  int unit = app.unit == StepUnit::line ? 1 : 0;
  ImGui::RadioButton("by event", &unit, 0);
  ImGui::SameLine();
  ImGui::RadioButton("by paper line", &unit, 1);
  app.unit = unit == 1 ? StepUnit::line : StepUnit::event;
  ImGui::SameLine(0, 16);
  ImGui::SetNextItemWidth(160);
  ImGui::SliderFloat("steps/s", &app.speed, 0.5f, 500.0f, "%.1f", ImGuiSliderFlags_Logarithmic);
  ImGui::SameLine(0, 16);
  int position = static_cast<int>(lead.cursor.position());
  ImGui::SetNextItemWidth(std::max(120.0f, ImGui::GetContentRegionAvail().x - 8));
  if (ImGui::SliderInt("##scrub", &position, 0, static_cast<int>(lead.cursor.size()), "event %d of the trace"))
    lead.cursor.seek(static_cast<std::size_t>(position));

  // Row 4: what just happened, or the last message.
  if (app.stale) {
    ImGui::TextColored(ImVec4(1.0f, 0.8f, 0.4f, 1.0f), "The problem or tiling changed: press Run to record it.");
  } else if (!app.message.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 200, 110, 255));
    ImGui::TextUnformatted(app.message.c_str());
    ImGui::PopStyleColor();
  } else if (lead.has_trace) {
    const TraceInfo& info = lead.trace.info;
    ImGui::Text("%s on N = %d x %d, d = %d, %s, %s; blocks %d x %d%s%s; M = %s.  Event %zu of %zu: %s", info.schedule.c_str(),
                info.seqlen_q, info.seqlen_k, info.head_dim, to_string(info.dtype),
                info.mask.causal ? "causal" : (info.mask.window_left >= 0 ? "sliding window" : "no mask"),
                info.block_rows, info.block_cols, lead.block_rule.empty() ? "" : " by the rule: ", lead.block_rule.c_str(),
                info.sram_capacity_bytes ? bytes_text(info.sram_capacity_bytes).c_str() : "unbounded",
                lead.cursor.position(), lead.cursor.size(),
                lead.state.last ? event_text(*lead.state.last).c_str() : "start");
  }
  ImGui::End();
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Score tiles

namespace {

void ScoreValuesTooltip(const Lane& lane, int row, int col) {
  ImGui::BeginTooltip();
  const int row_cell = lane.grid.row_cell_of(row), col_cell = lane.grid.col_cell_of(col);
  const CellStatus status = lane.grid.status(row_cell, col_cell, lane.state);
  ImGui::Text("score (%d, %d): tile rows %s, keys %s, %s", row, col,
              range_text({lane.grid.row_edges[row_cell], lane.grid.row_edges[row_cell + 1] - lane.grid.row_edges[row_cell]}).c_str(),
              range_text({lane.grid.col_edges[col_cell], lane.grid.col_edges[col_cell + 1] - lane.grid.col_edges[col_cell]}).c_str(),
              status == CellStatus::skipped ? "skipped: the mask hides it" : to_string(status));
  for (TensorId id : {lane.grid.tensor, TensorId::P}) {
    const auto tile = score_tile_values(lane.trace, lane.state.position, id, row, col);
    if (!tile) {
      ImGui::TextDisabled("%s: no values recorded up to this event", to_string(id));
      continue;
    }
    // A window of up to 6 x 6 values around the hovered score, inside its tile.
    const int r0 = std::clamp(row - tile->rows.begin - 2, 0, std::max(0, tile->rows.size - 6));
    const int c0 = std::clamp(col - tile->cols.begin - 2, 0, std::max(0, tile->cols.size - 6));
    const int rn = std::min(6, tile->rows.size), cn = std::min(6, tile->cols.size);
    ImGui::Text("%s tile %dx%d (event %zu), rows %d.., keys %d..:", to_string(id), tile->rows.size, tile->cols.size,
                tile->event, tile->rows.begin + r0, tile->cols.begin + c0);
    if (ImGui::BeginTable(to_string(id), cn, ImGuiTableFlags_Borders | ImGuiTableFlags_SizingFixedFit)) {
      for (int r = 0; r < rn; ++r) {
        ImGui::TableNextRow();
        for (int c = 0; c < cn; ++c) {
          ImGui::TableSetColumnIndex(c);
          const bool hovered = tile->rows.begin + r0 + r == row && tile->cols.begin + c0 + c == col;
          const float v = tile->at(r0 + r, c0 + c);
          if (hovered) ImGui::TableSetBgColor(ImGuiTableBgTarget_CellBg, IM_COL32(120, 90, 20, 255));
          if (std::isinf(v)) {
            ImGui::TextUnformatted(v < 0 ? "-inf" : "inf");
          } else {
            ImGui::Text("%7.3f", v);
          }
        }
      }
      ImGui::EndTable();
    }
  }
  ImGui::EndTooltip();
}

// A strip beside the grid for one tensor: what is in SRAM now (bright), what was written to HBM
// so far (dim), and the transfer that just happened (white frame).
void DrawTensorStrip(ImDrawList* draw, const Lane& lane, TensorId id, ImVec2 p0, ImVec2 p1, bool vertical, float px) {
  draw->AddRectFilled(p0, p1, IM_COL32(45, 45, 50, 255));
  auto span = [&](Range r, ImU32 color, bool outline) {
    const float a = r.begin * px, b = r.end() * px;
    const ImVec2 q0 = vertical ? ImVec2(p0.x, p0.y + a) : ImVec2(p0.x + a, p0.y);
    const ImVec2 q1 = vertical ? ImVec2(p1.x, p0.y + b) : ImVec2(p0.x + b, p1.y);
    if (outline) {
      draw->AddRect(ImVec2(q0.x - 1, q0.y - 1), ImVec2(q1.x + 1, q1.y + 1), color, 0, 0, 2);
    } else {
      draw->AddRectFilled(q0, q1, color);
    }
  };
  for (std::size_t i = 0; i < lane.state.position; ++i) {
    const RecordedEvent& e = lane.trace.events[i];
    if (e.kind == EventKind::store && e.tensor == id) span(e.rows, tensor_color(id, 0.45f), false);
  }
  for (const LiveTile& tile : lane.state.sram)
    if (tile.tensor == id) span(tile.rows, tensor_color(id), false);
  const RecordedEvent* last = lane.state.last;
  if (last && last->tensor == id && (last->kind == EventKind::load || last->kind == EventKind::store))
    span(last->rows, kFlashColor, true);
}

void DrawHatch(ImDrawList* draw, ImVec2 p0, ImVec2 p1) {
  draw->PushClipRect(p0, p1, true);
  const float step = 7;
  for (float x = p0.x - (p1.y - p0.y); x < p1.x; x += step)
    draw->AddLine(ImVec2(x, p1.y), ImVec2(x + (p1.y - p0.y), p0.y), kHatchColor);
  draw->PopClipRect();
}

void LegendSwatch(ImU32 color, const char* label, bool hatch = false) {
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const ImVec2 p = ImGui::GetCursorScreenPos();
  const float s = ImGui::GetTextLineHeight();
  draw->AddRectFilled(p, ImVec2(p.x + s, p.y + s), color);
  if (hatch) DrawHatch(draw, p, ImVec2(p.x + s, p.y + s));
  ImGui::Dummy(ImVec2(s, s));
  ImGui::SameLine();
  ImGui::TextUnformatted(label);
  ImGui::SameLine(0, 14);
}

}  // namespace

void ShowScoreTiles(Lane& lane, const char* title, bool* open) {
  if (!BeginLanePanel(lane, title, open)) return;
  const ScoreGrid& grid = lane.grid;
  if (grid.empty()) {
    ImGui::TextWrapped("This schedule makes no score tiles (S or A); see the memory panel.");
    ImGui::End();
    return;
  }
  const TraceInfo& info = lane.trace.info;
  std::vector<TensorId> left, above;
  for (TensorId id : lane.hbm_tensors) {
    if (is_query_side(id)) left.push_back(id);
    if (is_key_side(id)) above.push_back(id);
  }
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float line = ImGui::GetTextLineHeightWithSpacing();
  const float strip = 9, gap = 4, left_gap = 10;  // left strips leave room for two-letter labels below
  const float left_width = std::max(30.0f, left.size() * (strip + left_gap) + 6);
  const float top_height = above.size() * (strip + gap) + 6;
  const float legend_height = 2 * line + 4;
  // Square pixels per score, except that a short query side (decoding) still gets some height.
  const float grid_height = avail.y - top_height - legend_height - line;
  const float px = std::max(0.05f, std::min((avail.x - left_width - 4) / info.seqlen_k, grid_height / info.seqlen_q));
  const float py = std::max(px, 0.3f * grid_height / info.seqlen_q);
  const ImVec2 g0(origin.x + left_width, origin.y + top_height);
  const ImVec2 g1(g0.x + info.seqlen_k * px, g0.y + info.seqlen_q * py);

  // Strips: query-side tensors on the left, key-side tensors above, labelled in the corner.
  for (std::size_t i = 0; i < left.size(); ++i) {
    const float x = origin.x + 2 + i * (strip + left_gap);
    DrawTensorStrip(draw, lane, left[i], ImVec2(x, g0.y), ImVec2(x + strip, g1.y), true, py);
    draw->AddText(ImVec2(x, g1.y + 2), tensor_color(left[i]), to_string(left[i]));
  }
  for (std::size_t i = 0; i < above.size(); ++i) {
    const float y = origin.y + 2 + i * (strip + gap);
    DrawTensorStrip(draw, lane, above[i], ImVec2(g0.x, y), ImVec2(g1.x, y + strip), false, px);
    const char* name = to_string(above[i]);
    draw->AddText(ImVec2(g0.x - ImGui::CalcTextSize(name).x - 4, y - 3), tensor_color(above[i]), name);
  }

  // The tiles.
  for (int r = 0; r < grid.row_cells(); ++r) {
    for (int c = 0; c < grid.col_cells(); ++c) {
      const ImVec2 p0(g0.x + grid.col_edges[c] * px, g0.y + grid.row_edges[r] * py);
      const ImVec2 p1(g0.x + grid.col_edges[c + 1] * px, g0.y + grid.row_edges[r + 1] * py);
      switch (grid.status(r, c, lane.state)) {
        case CellStatus::done: draw->AddRectFilled(p0, p1, kDoneColor); break;
        case CellStatus::current: draw->AddRectFilled(p0, p1, kCurrentColor); break;
        case CellStatus::pending: draw->AddRectFilled(p0, p1, kPendingColor); break;
        case CellStatus::skipped:
          draw->AddRectFilled(p0, p1, kSkippedColor);
          DrawHatch(draw, p0, p1);
          break;
      }
      draw->AddRect(p0, p1, IM_COL32(20, 20, 24, 255));
    }
  }
  // The current tiles get a frame so they read even when small.
  for (const LiveTile& tile : lane.state.sram) {
    if (tile.tensor != grid.tensor) continue;
    draw->AddRect(ImVec2(g0.x + tile.cols.begin * px, g0.y + tile.rows.begin * py),
                  ImVec2(g0.x + tile.cols.end() * px, g0.y + tile.rows.end() * py), kFlashColor, 0, 0, 2);
  }
  lane.score_grid_rect = ImVec4(g0.x, g0.y, g1.x, g1.y);

  // Hover: the S and P values the schedule computed for that tile.
  ImGui::SetCursorScreenPos(g0);
  ImGui::InvisibleButton("score grid", ImVec2(std::max(1.0f, g1.x - g0.x), std::max(1.0f, g1.y - g0.y)));
  if (ImGui::IsItemHovered()) {
    const ImVec2 mouse = ImGui::GetIO().MousePos;
    const int row = std::clamp(static_cast<int>((mouse.y - g0.y) / py), 0, info.seqlen_q - 1);
    const int col = std::clamp(static_cast<int>((mouse.x - g0.x) / px), 0, info.seqlen_k - 1);
    ScoreValuesTooltip(lane, row, col);
  }

  ImGui::SetCursorScreenPos(ImVec2(origin.x, g1.y + line + 2));
  LegendSwatch(kDoneColor, "done");
  LegendSwatch(kCurrentColor, "current");
  LegendSwatch(kPendingColor, "pending");
  LegendSwatch(kSkippedColor, "skipped by the mask", true);
  ImGui::NewLine();
  ImGui::TextDisabled("%s: %d x %d tiles. Strips: bright = in SRAM now, dim = written. Hover for S and P.",
                      to_string(grid.tensor), grid.row_cells(), grid.col_cells());
  ImGui::End();
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Memory

void ShowMemory(Lane& lane, const char* title, bool* open) {
  if (!BeginLanePanel(lane, title, open)) return;
  const TraceState& state = lane.state;
  const TraceInfo& info = lane.trace.info;
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  const float line = ImGui::GetTextLineHeightWithSpacing();
  const float hbm_width = avail.x * 0.56f, arrow_width = avail.x * 0.08f, sram_width = avail.x - hbm_width - arrow_width;
  const float box_height = std::max(60.0f, avail.y - 2 * line);
  const ImVec2 hbm0 = origin, hbm1(origin.x + hbm_width, origin.y + box_height);
  const ImVec2 sram0(hbm1.x + arrow_width, origin.y), sram1(sram0.x + sram_width, origin.y + box_height);
  const ImU32 frame = IM_COL32(150, 150, 160, 255);

  // HBM: one bar per tensor over its rows; bright where a copy is in SRAM now.
  draw->AddRect(hbm0, hbm1, frame, 4);
  draw->AddText(ImVec2(hbm0.x + 6, hbm0.y + 4), frame, "HBM (slow, large)");
  const float row_height = std::min(2.2f * line, (box_height - line - 8) / std::max<std::size_t>(1, lane.hbm_tensors.size()));
  float arrow_y = -1;
  float label_width = 30;
  for (TensorId id : lane.hbm_tensors) label_width = std::max(label_width, ImGui::CalcTextSize(to_string(id)).x + 12);
  for (std::size_t i = 0; i < lane.hbm_tensors.size(); ++i) {
    const TensorId id = lane.hbm_tensors[i];
    const float y = hbm0.y + line + 6 + i * row_height;
    const float bar0 = hbm0.x + label_width, bar1 = hbm1.x - 8, bar_h = std::max(4.0f, row_height * 0.45f);
    draw->AddText(ImVec2(hbm0.x + 6, y), tensor_color(id), to_string(id));
    draw->AddRectFilled(ImVec2(bar0, y), ImVec2(bar1, y + bar_h), tensor_color(id, 0.25f));
    const int rows = is_key_side(id) ? info.seqlen_k : info.seqlen_q;
    const float scale = (bar1 - bar0) / std::max(1, rows);
    auto span = [&](Range r, ImU32 color, bool outline) {
      const ImVec2 q0(bar0 + r.begin * scale, y), q1(bar0 + std::min(r.end(), rows) * scale, y + bar_h);
      outline ? draw->AddRect(ImVec2(q0.x - 1, q0.y - 1), ImVec2(q1.x + 1, q1.y + 1), color, 0, 0, 2)
              : draw->AddRectFilled(q0, q1, color);
    };
    for (const LiveTile& tile : state.sram)
      if (tile.tensor == id) span(tile.rows, tensor_color(id), false);
    if (state.last && state.last->tensor == id &&
        (state.last->kind == EventKind::load || state.last->kind == EventKind::store)) {
      span(state.last->rows, kFlashColor, true);
      arrow_y = y + bar_h / 2;
    }
    const TensorTraffic& t = state[id];
    char text[96];
    std::snprintf(text, sizeof text, "read %s  written %s", bytes_text(t.hbm_read_bytes).c_str(),
                  bytes_text(t.hbm_write_bytes).c_str());
    if (row_height > line + bar_h) draw->AddText(ImVec2(bar0, y + bar_h + 1), IM_COL32(170, 170, 175, 255), text);
  }

  // SRAM: capacity M, the occupancy bar and the live tiles stacked by size.
  draw->AddRect(sram0, sram1, frame, 4);
  draw->AddText(ImVec2(sram0.x + 6, sram0.y + 4), frame, "SRAM (fast, M bytes)");
  const std::int64_t capacity = info.sram_capacity_bytes > 0 ? info.sram_capacity_bytes
                                                             : std::max<std::int64_t>(1, lane.counted ? lane.counted->sram_peak_bytes : state.sram_peak_bytes);
  const float fill = static_cast<float>(state.sram_bytes) / capacity;
  const ImVec2 bar0(sram0.x + 6, sram0.y + line + 4), bar1(sram1.x - 6, sram0.y + line + 4 + line);
  draw->AddRectFilled(bar0, bar1, IM_COL32(50, 50, 55, 255));
  draw->AddRectFilled(bar0, ImVec2(bar0.x + (bar1.x - bar0.x) * std::min(1.0f, fill), bar1.y),
                      info.sram_capacity_bytes > 0 && fill > 0.9f ? IM_COL32(220, 80, 60, 255) : IM_COL32(90, 160, 90, 255));
  const float tiles_top = bar1.y + 6, tiles_bottom = sram1.y - 6, tiles_height = tiles_bottom - tiles_top;
  float y = tiles_top;
  for (const LiveTile& tile : state.sram) {
    const float h = std::max(3.0f, tiles_height * static_cast<float>(tile.bytes) / capacity);
    const ImVec2 t0(sram0.x + 8, y), t1(sram1.x - 8, std::min(tiles_bottom, y + h));
    if (t0.y >= tiles_bottom) break;
    draw->AddRectFilled(t0, t1, tensor_color(tile.tensor, 0.85f));
    draw->AddRect(t0, t1, IM_COL32(20, 20, 24, 255));
    if (t1.y - t0.y >= ImGui::GetTextLineHeight()) {
      char label[64];
      std::snprintf(label, sizeof label, "%s %dx%d %s", to_string(tile.tensor), tile.rows.size, tile.cols.size,
                    bytes_text(tile.bytes).c_str());
      draw->AddText(ImVec2(t0.x + 3, t0.y), IM_COL32(10, 10, 10, 255), label);
    }
    if (state.last && tile.born + 1 == state.position) draw->AddRect(t0, t1, kFlashColor, 0, 0, 2);
    y += h;
  }

  // The transfer that just happened: an arrow between the boxes.
  if (arrow_y > 0) {
    const bool load = state.last->kind == EventKind::load;
    const float x0 = hbm1.x + 2, x1 = sram0.x - 2;
    const float tip = load ? x1 : x0, tail = load ? x0 : x1, dir = load ? -8.0f : 8.0f;
    const ImU32 color = tensor_color(state.last->tensor);
    draw->AddLine(ImVec2(tail, arrow_y), ImVec2(tip, arrow_y), color, 3);
    draw->AddTriangleFilled(ImVec2(tip, arrow_y), ImVec2(tip + dir, arrow_y - 6), ImVec2(tip + dir, arrow_y + 6), color);
  }

  ImGui::SetCursorScreenPos(ImVec2(origin.x, origin.y + box_height + 4));
  if (info.sram_capacity_bytes > 0) {
    ImGui::Text("SRAM in use %s of M = %s (%.0f%%), peak so far %s", bytes_text(state.sram_bytes).c_str(),
                bytes_text(info.sram_capacity_bytes).c_str(), 100.0f * fill, bytes_text(state.sram_peak_bytes).c_str());
  } else {
    ImGui::Text("SRAM in use %s; M unbounded, bar scaled to the run's peak %s", bytes_text(state.sram_bytes).c_str(),
                bytes_text(capacity).c_str());
  }
  ImGui::TextDisabled("%s", state.last ? event_text(*state.last).c_str() : "start: nothing moved yet");
  ImGui::End();
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Online softmax

void ShowSoftmaxState(Lane& lane, const char* title, bool* open) {
  if (!BeginLanePanel(lane, title, open)) return;
  if (lane.end_state.position > 0 && !lane.keeps_softmax_state) {
    ImGui::TextWrapped("%s keeps no online-softmax state: %s", lane.trace.info.schedule.c_str(),
                       std::count(lane.hbm_tensors.begin(), lane.hbm_tensors.end(), TensorId::A)
                           ? "A = exp(S) goes to HBM and its row sums accumulate."
                       : lane.trace.info.schedule.find("backward") != std::string::npos
                           ? "a backward pass recomputes P from the statistics the forward pass saved."
                           : "whole rows of S are normalised at once.");
    ImGui::End();
    return;
  }
  const SoftmaxHistory history = softmax_history(lane.trace, lane.state.position);
  if (history.rows.size == 0 || history.updates.empty()) {
    if (history.rows.size == 0) {
      ImGui::TextWrapped("No online-softmax state yet. (Standard attention normalises whole rows of S instead, "
                         "and backward passes reuse the saved statistics.)");
    } else {
      ImGui::TextWrapped("Query block rows %s: no softmax update yet.", range_text(history.rows).c_str());
    }
    ImGui::End();
    return;
  }
  const std::vector<RecordedEvent>& events = lane.trace.events;
  const RecordedEvent& latest = events[history.updates.back()];
  if (latest.row_max.empty()) {
    ImGui::TextWrapped("This trace was recorded shape-only: it has no row statistics.");
    ImGui::End();
    return;
  }
  ImGui::Text("Query block rows %s: %zu update(s) so far", range_text(history.rows).c_str(), history.updates.size());
  lane.softmax_row = std::clamp(lane.softmax_row, 0, history.rows.size - 1);
  ImGui::SetNextItemWidth(std::min(220.0f, ImGui::GetContentRegionAvail().x * 0.5f));
  ImGui::SliderInt("row in block", &lane.softmax_row, 0, history.rows.size - 1);

  // m and l of the chosen row over the updates; -inf (nothing visible yet) is drawn at the lowest value.
  std::vector<float> m, l;
  for (std::size_t k : history.updates) {
    m.push_back(events[k].row_max[lane.softmax_row]);
    l.push_back(events[k].row_sum[lane.softmax_row]);
  }
  float lowest = std::numeric_limits<float>::max();
  for (float v : m)
    if (std::isfinite(v)) lowest = std::min(lowest, v);
  for (float& v : m)
    if (!std::isfinite(v)) v = lowest == std::numeric_limits<float>::max() ? 0.0f : lowest;
  const float plot_height = std::max(36.0f, ImGui::GetContentRegionAvail().y * 0.22f);
  const float plot_width = ImGui::GetContentRegionAvail().x - 120;
  char overlay[64];
  std::snprintf(overlay, sizeof overlay, "m = %.4f", latest.row_max[lane.softmax_row]);
  ImGui::PlotLines("running max m", m.data(), static_cast<int>(m.size()), 0, overlay, FLT_MAX, FLT_MAX,
                   ImVec2(plot_width, plot_height));
  std::snprintf(overlay, sizeof overlay, "l = %.4f", latest.row_sum[lane.softmax_row]);
  ImGui::PlotLines("running sum l", l.data(), static_cast<int>(l.size()), 0, overlay, 0.0f, FLT_MAX,
                   ImVec2(plot_width, plot_height));

  // Every row of the block at the latest update; a rescale below 1 means the max rose.
  const ImGuiTableFlags flags = ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_ScrollY;
  if (ImGui::BeginTable("rows", 4, flags, ImVec2(0, ImGui::GetContentRegionAvail().y))) {
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("row");
    ImGui::TableSetupColumn("max m");
    ImGui::TableSetupColumn("sum l");
    ImGui::TableSetupColumn("rescale exp(m_old - m_new)");
    ImGui::TableHeadersRow();
    ImGuiListClipper clipper;  // only the rows in view are submitted: a block can have thousands
    clipper.Begin(history.rows.size);
    while (clipper.Step()) {
      for (int r = clipper.DisplayStart; r < clipper.DisplayEnd; ++r) {
        ImGui::TableNextRow();
        if (r == lane.softmax_row) ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg0, IM_COL32(70, 60, 30, 255));
        ImGui::TableSetColumnIndex(0);
        ImGui::Text("%d", history.rows.begin + r);
        ImGui::TableSetColumnIndex(1);
        ImGui::Text("%.4f", latest.row_max[r]);
        ImGui::TableSetColumnIndex(2);
        ImGui::Text("%.4f", latest.row_sum[r]);
        ImGui::TableSetColumnIndex(3);
        const float rescale = latest.rescale[r];
        if (rescale == 0.0f) {
          ImGui::Text("%.4f  (first visible keys)", rescale);
        } else if (rescale < 1.0f) {
          ImGui::TextColored(ImVec4(1.0f, 0.7f, 0.2f, 1.0f), "%.4f  (max rose)", rescale);
        } else {
          ImGui::Text("%.4f", rescale);
        }
      }
    }
    ImGui::EndTable();
  }
  ImGui::End();
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Counters

void ShowCounters(Lane& lane, const char* title, bool* open) {
  if (!BeginLanePanel(lane, title, open)) return;
  const TraceState& state = lane.state;
  const TraceState& end = lane.end_state;
  const std::int64_t so_far = state.hbm_read_bytes() + state.hbm_write_bytes();
  const std::int64_t total = end.hbm_read_bytes() + end.hbm_write_bytes();
  char overlay[96];
  std::snprintf(overlay, sizeof overlay, "HBM traffic so far %s of %s", bytes_text(so_far).c_str(), bytes_text(total).c_str());
  ImGui::ProgressBar(total > 0 ? static_cast<float>(so_far) / total : 0.0f, ImVec2(-1, 0), overlay);

  // Narrow (side by side): read + written together in each cell.
  const bool closed = lane.closed_form.has_value();
  const bool compact = ImGui::GetContentRegionAvail().x < 600;
  const ImGuiTableFlags flags = ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg | ImGuiTableFlags_SizingStretchProp;
  const int columns = (compact ? 3 : 5) + (closed ? 1 : 0);
  if (ImGui::BeginTable("traffic", columns, flags)) {
    ImGui::TableSetupColumn("tensor");
    if (compact) {
      ImGui::TableSetupColumn("so far r+w");
      ImGui::TableSetupColumn("run r+w");
    } else {
      ImGui::TableSetupColumn("read so far");
      ImGui::TableSetupColumn("written so far");
      ImGui::TableSetupColumn("run: read");
      ImGui::TableSetupColumn("run: written");
    }
    if (closed) ImGui::TableSetupColumn(compact ? "closed form" : "closed form r / w");
    ImGui::TableHeadersRow();
    auto row = [&](const char* name, ImU32 color, const TensorTraffic& now, const TensorTraffic& run,
                   const TensorTraffic* formula) {
      ImGui::TableNextRow();
      ImGui::TableSetColumnIndex(0);
      ImGui::PushStyleColor(ImGuiCol_Text, color);
      ImGui::TextUnformatted(name);
      ImGui::PopStyleColor();
      int column = 1;
      auto cell = [&](std::int64_t bytes) {
        ImGui::TableSetColumnIndex(column++);
        ImGui::TextUnformatted(bytes_text(bytes).c_str());
      };
      if (compact) {
        cell(now.hbm_read_bytes + now.hbm_write_bytes);
        cell(run.hbm_read_bytes + run.hbm_write_bytes);
      } else {
        cell(now.hbm_read_bytes), cell(now.hbm_write_bytes), cell(run.hbm_read_bytes), cell(run.hbm_write_bytes);
      }
      if (closed && formula) {
        ImGui::TableSetColumnIndex(column);
        const bool match = formula->hbm_read_bytes == run.hbm_read_bytes && formula->hbm_write_bytes == run.hbm_write_bytes;
        const ImVec4 colour = match ? ImVec4(0.5f, 0.9f, 0.5f, 1) : ImVec4(1, 0.4f, 0.4f, 1);
        if (compact) {
          ImGui::TextColored(colour, "%s %s", bytes_text(formula->hbm_read_bytes + formula->hbm_write_bytes).c_str(),
                             match ? "(=)" : "(differs)");
        } else {
          ImGui::TextColored(colour, "%s / %s %s", bytes_text(formula->hbm_read_bytes).c_str(),
                             bytes_text(formula->hbm_write_bytes).c_str(), match ? "(=)" : "(differs)");
        }
      }
    };
    TensorTraffic now_total, run_total, formula_total;
    for (int t = 0; t < kTensorCount; ++t) {
      const TensorId id = static_cast<TensorId>(t);
      const TensorTraffic& run = end[id];
      const TensorTraffic* formula = closed ? &lane.closed_form->tensor[t] : nullptr;
      now_total.hbm_read_bytes += state[id].hbm_read_bytes, now_total.hbm_write_bytes += state[id].hbm_write_bytes;
      run_total.hbm_read_bytes += run.hbm_read_bytes, run_total.hbm_write_bytes += run.hbm_write_bytes;
      if (formula) formula_total.hbm_read_bytes += formula->hbm_read_bytes, formula_total.hbm_write_bytes += formula->hbm_write_bytes;
      if (run.hbm_read_bytes + run.hbm_write_bytes == 0 && !(formula && formula->hbm_read_bytes + formula->hbm_write_bytes))
        continue;
      row(to_string(id), tensor_color(id), state[id], run, formula);
    }
    row("total", IM_COL32(230, 230, 230, 255), now_total, run_total, closed ? &formula_total : nullptr);
    ImGui::EndTable();
  }
  if (lane.counted) {
    ImGui::TextWrapped("Whole run: %.3g matmul FLOPs, %.3g exponentials, %.3g other FLOPs; SRAM peak %s",
                double(lane.counted->matmul_flops), double(lane.counted->exponentials), double(lane.counted->other_flops),
                bytes_text(lane.counted->sram_peak_bytes).c_str());
  }
  if (closed) {
    ImGui::TextDisabled("Closed form: sim/closed_forms.hpp, for N, d, the mask and the block sizes.");
  } else {
    ImGui::TextDisabled("%s", lane.closed_form_note.c_str());
  }
  if (lane.bound && lane.lower_bound) {
    // The bounds are in elements (Theta: up to a constant); the counted run in elements too.
    double counted = 0;
    for (const TensorTraffic& t : end.traffic) counted += double(t.hbm_read_elements + t.hbm_write_elements);
    const char* m_source = lane.trace.info.sram_capacity_bytes > 0 ? "M" : "M = the blocks' working set";
    ImGui::TextWrapped("Bound (%s): %s = %.3g elements at %s = %s; the run moves %.3g elements, %.2f x the bound.",
                       lane.bound->source.c_str(), lane.bound->formula.c_str(), lane.bound->elements, m_source,
                       bytes_text(lane.bound_sram_bytes).c_str(), counted,
                       lane.bound->elements > 0 ? counted / lane.bound->elements : 0.0);
    ImGui::TextWrapped("Lower bound (%s): %s = %.3g elements; the run is %.2f x it.", lane.lower_bound->source.c_str(),
                       lane.lower_bound->formula.c_str(), lane.lower_bound->elements,
                       lane.lower_bound->elements > 0 ? counted / lane.lower_bound->elements : 0.0);
  } else {
    ImGui::TextDisabled("%s", lane.bound_note.c_str());
  }
  ImGui::End();
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Pseudocode

void ShowPseudocode(Lane& lane, const char* title, bool* open) {
  if (!BeginLanePanel(lane, title, open)) return;
  const Pseudocode* code = find_pseudocode(lane.trace.info.schedule);
  if (!code) {
    ImGui::TextWrapped("No pseudocode is written for '%s'; it is at its paper's line %d.", lane.trace.info.schedule.c_str(),
                       lane.state.line);
    ImGui::End();
    return;
  }
  ImGui::TextWrapped("%s", code->title.c_str());
  ImGui::Separator();
  ImDrawList* draw = ImGui::GetWindowDrawList();
  for (const PseudocodeLine& line : code->lines) {
    char number[16] = "   ";
    if (line.number > 0) std::snprintf(number, sizeof number, "%2d ", line.number);
    const std::string text = number + line.text;
    const bool current = line.number > 0 && line.number == lane.state.line;
    const float wrap_width = ImGui::GetContentRegionAvail().x;
    if (current) {
      const ImVec2 p = ImGui::GetCursorScreenPos();
      const ImVec2 size = ImGui::CalcTextSize(text.c_str(), nullptr, false, wrap_width);
      draw->AddRectFilled(ImVec2(p.x - 4, p.y - 1), ImVec2(p.x + wrap_width, p.y + size.y + 1), IM_COL32(120, 85, 20, 255));
    }
    ImGui::PushTextWrapPos(0.0f);
    ImGui::TextUnformatted(text.c_str());
    ImGui::PopTextWrapPos();
    if (current && lane.scrolled_to_line != line.number) {  // keep the current line in view
      ImGui::SetScrollHereY(0.5f);
      lane.scrolled_to_line = line.number;
    }
  }
  ImGui::End();
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Ring

// Devices down, steps across: the block each device holds at each step; the step under way lit,
// the device at work outlined, steps not begun yet empty.
void ShowRing(Lane& lane, const char* title, bool* open) {
  if (!BeginLanePanel(lane, title, open)) return;
  const RingHoldings ring = ring_holdings(lane.trace, lane.state.position);
  ImGui::Text("%d devices; step %d of %d; K/V blocks pass to the next device each step", ring.devices, ring.step + 1,
              ring.devices);
  const ImGuiTableFlags flags = ImGuiTableFlags_Borders | ImGuiTableFlags_SizingFixedFit;
  if (ring.devices > 0 && ring.devices <= 64 && ImGui::BeginTable("ring", ring.devices + 1, flags)) {
    ImGui::TableSetupColumn("device");
    for (int step = 0; step < ring.devices; ++step) {
      char name[24];
      std::snprintf(name, sizeof name, "step %d", step);
      ImGui::TableSetupColumn(name);
    }
    ImGui::TableHeadersRow();
    for (int device = 0; device < ring.devices; ++device) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::Text("%d", device);
      for (int step = 0; step < ring.devices; ++step) {
        ImGui::TableNextColumn();
        const int block = ring.blocks[static_cast<std::size_t>(step)][static_cast<std::size_t>(device)];
        if (block < 0) continue;
        const bool now = step == ring.step, working = now && device == ring.device;
        if (now) ImGui::TableSetBgColor(ImGuiTableBgTarget_CellBg, working ? IM_COL32(230, 160, 60, 200) : IM_COL32(90, 130, 200, 150));
        ImGui::Text("KV %d", block);
      }
    }
    ImGui::EndTable();
  }
  ImGui::End();
}

}  // namespace flashlab::viz
