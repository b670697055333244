#include "replay.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace flashlab::viz {

// ---------------------------------------------------------------------------------------------
// [SECTION] The cursor

TraceCursor::TraceCursor(const Trace& trace) : size_(trace.events.size()) {
  for (std::size_t p = 1; p <= size_; ++p) {
    if (p == size_ || trace.events[p].kind == EventKind::line) line_stops_.push_back(p);
  }
}

void TraceCursor::seek(std::size_t position) {
  position_ = std::min(position, size_);
  carry_ = 0;
}

void TraceCursor::seek_fraction(double fraction) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  seek(static_cast<std::size_t>(std::llround(fraction * static_cast<double>(size_))));
}

bool TraceCursor::step_forward(StepUnit unit) {
  if (position_ >= size_) return false;
  if (unit == StepUnit::event) {
    ++position_;
  } else {
    position_ = *std::upper_bound(line_stops_.begin(), line_stops_.end(), position_);  // size_ is a stop
  }
  return true;
}

bool TraceCursor::step_back(StepUnit unit) {
  if (position_ == 0) return false;
  if (unit == StepUnit::event) {
    --position_;
  } else {
    auto stop = std::lower_bound(line_stops_.begin(), line_stops_.end(), position_);
    position_ = stop == line_stops_.begin() ? 0 : *std::prev(stop);
  }
  return true;
}

bool TraceCursor::play(double seconds, double steps_per_second, StepUnit unit) {
  carry_ += std::max(0.0, seconds * steps_per_second);
  while (carry_ >= 1.0) {
    carry_ -= 1.0;
    if (!step_forward(unit)) {
      carry_ = 0;
      return false;
    }
  }
  return !at_end();
}

// ---------------------------------------------------------------------------------------------
// [SECTION] The state at a position

std::int64_t TraceState::hbm_read_bytes() const {
  std::int64_t total = 0;
  for (const TensorTraffic& t : traffic) total += t.hbm_read_bytes;
  return total;
}

std::int64_t TraceState::hbm_write_bytes() const {
  std::int64_t total = 0;
  for (const TensorTraffic& t : traffic) total += t.hbm_write_bytes;
  return total;
}

bool TraceState::live(TensorId id) const {
  return std::any_of(sram.begin(), sram.end(), [id](const LiveTile& t) { return t.tensor == id; });
}

bool allocates(const Trace& trace, std::size_t index) {
  const RecordedEvent& e = trace.events[index];
  if (e.kind == EventKind::load) return true;
  if (e.kind != EventKind::compute) return false;
  const std::int64_t before = index == 0 ? 0 : trace.events[index - 1].sram_bytes;
  return e.sram_bytes - before == e.bytes && e.bytes > 0;
}

void apply_event(TraceState& state, const Trace& trace, std::size_t index) {
  const RecordedEvent& e = trace.events[index];
  TensorTraffic& traffic = state.traffic[static_cast<int>(e.tensor)];
  switch (e.kind) {
    case EventKind::load:
      traffic.hbm_read_elements += e.elements();
      traffic.hbm_read_bytes += e.bytes;
      ++state.loads;
      break;
    case EventKind::store:
      traffic.hbm_write_elements += e.elements();
      traffic.hbm_write_bytes += e.bytes;
      ++state.stores;
      break;
    case EventKind::free: {
      // Tiles with the same tensor and position are interchangeable here: free the newest.
      auto it = std::find_if(state.sram.rbegin(), state.sram.rend(), [&](const LiveTile& t) {
        return t.tensor == e.tensor && t.rows == e.rows && t.cols == e.cols;
      });
      if (it != state.sram.rend()) state.sram.erase(std::next(it).base());
      break;
    }
    case EventKind::line:
      state.line = e.line;
      break;
    case EventKind::compute:
    case EventKind::softmax_update:
    case EventKind::ring_step:
      break;
  }
  if (allocates(trace, index)) state.sram.push_back({e.tensor, e.rows, e.cols, e.bytes, index});
  state.sram_bytes = e.sram_bytes;
  state.sram_peak_bytes = std::max(state.sram_peak_bytes, e.sram_bytes);
  state.position = index + 1;
  state.last = &e;
}

RingHoldings ring_holdings(const Trace& trace, std::size_t position) {
  RingHoldings ring;
  ring.devices = trace.info.devices;
  if (ring.devices <= 0) return ring;
  const auto devices = static_cast<std::size_t>(ring.devices);
  ring.blocks.assign(devices, std::vector<int>(devices, -1));
  position = std::min(position, trace.events.size());
  for (std::size_t i = 0; i < position; ++i) {
    const RecordedEvent& e = trace.events[i];
    if (e.kind != EventKind::ring_step) continue;  // the loader holds step, device, block < devices
    ring.blocks[static_cast<std::size_t>(e.step)][static_cast<std::size_t>(e.device)] = e.block;
    ring.step = std::max(ring.step, e.step);
    ring.device = e.device;
  }
  return ring;
}

TraceState state_at(const Trace& trace, std::size_t position) {
  TraceState state;
  position = std::min(position, trace.events.size());
  for (std::size_t i = 0; i < position; ++i) apply_event(state, trace, i);
  return state;
}

// ---------------------------------------------------------------------------------------------
// [SECTION] The score matrix as tiles

const char* to_string(CellStatus status) {
  switch (status) {
    case CellStatus::pending: return "pending";
    case CellStatus::current: return "current";
    case CellStatus::done: return "done";
    case CellStatus::skipped: return "skipped";
  }
  return "?";
}

namespace {

int cell_of(const std::vector<int>& edges, int index) {
  if (edges.size() < 2 || index < edges.front() || index >= edges.back()) return -1;
  return static_cast<int>(std::upper_bound(edges.begin(), edges.end(), index) - edges.begin()) - 1;
}

int edge_index(const std::vector<int>& edges, int value) {
  return static_cast<int>(std::lower_bound(edges.begin(), edges.end(), value) - edges.begin());
}

bool covers(const Range& range, int index) { return index >= range.begin && index < range.end(); }

}  // namespace

int ScoreGrid::row_cell_of(int row) const { return cell_of(row_edges, row); }
int ScoreGrid::col_cell_of(int col) const { return cell_of(col_edges, col); }

CellStatus ScoreGrid::status(int row_cell, int col_cell, const TraceState& state) const {
  const std::size_t first_event = first(row_cell, col_cell);
  if (first_event == kNever) return CellStatus::skipped;
  // Current: a score or probability tile covering the cell is in SRAM.
  const int row = row_edges[row_cell], col = col_edges[col_cell];
  for (const LiveTile& tile : state.sram) {
    if ((tile.tensor == tensor || tile.tensor == TensorId::P) && covers(tile.rows, row) && covers(tile.cols, col))
      return CellStatus::current;
  }
  return first_event < state.position ? CellStatus::done : CellStatus::pending;
}

ScoreGrid build_score_grid(const Trace& trace) {
  ScoreGrid grid;
  auto made_tiles_of = [&](TensorId id) {
    std::vector<std::size_t> events;
    for (std::size_t i = 0; i < trace.events.size(); ++i) {
      const RecordedEvent& e = trace.events[i];
      if (e.tensor == id && (e.kind == EventKind::compute || e.kind == EventKind::load) && allocates(trace, i))
        events.push_back(i);
    }
    return events;
  };
  std::vector<std::size_t> made = made_tiles_of(TensorId::S);
  if (made.empty()) {
    grid.tensor = TensorId::A;
    made = made_tiles_of(TensorId::A);
  }
  grid.row_edges = {0, trace.info.seqlen_q};
  grid.col_edges = {0, trace.info.seqlen_k};
  for (std::size_t i : made) {
    const RecordedEvent& e = trace.events[i];
    grid.row_edges.insert(grid.row_edges.end(), {e.rows.begin, e.rows.end()});
    grid.col_edges.insert(grid.col_edges.end(), {e.cols.begin, e.cols.end()});
  }
  for (auto* edges : {&grid.row_edges, &grid.col_edges}) {
    std::sort(edges->begin(), edges->end());
    edges->erase(std::unique(edges->begin(), edges->end()), edges->end());
  }
  const std::int64_t cells = std::int64_t{grid.row_cells()} * grid.col_cells();
  if (cells > kMaxScoreCells)
    throw std::invalid_argument("the score grid would have " + std::to_string(grid.row_cells()) + " x " +
                                std::to_string(grid.col_cells()) + " = " + std::to_string(cells) +
                                " cells (one per distinct tile edge); allowed: at most " + std::to_string(kMaxScoreCells));
  grid.first_computed.assign(static_cast<std::size_t>(grid.row_cells()) * grid.col_cells(), ScoreGrid::kNever);
  for (std::size_t i : made) {
    const RecordedEvent& e = trace.events[i];
    ScoreGrid::Visit visit{i, edge_index(grid.row_edges, e.rows.begin), edge_index(grid.row_edges, e.rows.end()),
                           edge_index(grid.col_edges, e.cols.begin), edge_index(grid.col_edges, e.cols.end())};
    for (int r = visit.row_cell_begin; r < visit.row_cell_end; ++r)
      for (int c = visit.col_cell_begin; c < visit.col_cell_end; ++c) {
        std::size_t& first = grid.first_computed[static_cast<std::size_t>(r) * grid.col_cells() + c];
        first = std::min(first, i);
      }
    grid.visits.push_back(visit);
  }
  return grid;
}

// ---------------------------------------------------------------------------------------------
// [SECTION] The online-softmax state

SoftmaxHistory softmax_history(const Trace& trace, std::size_t position) {
  SoftmaxHistory history;
  position = std::min(position, trace.events.size());
  // The block: walk back to the latest softmax update or Q load.
  for (std::size_t i = position; i-- > 0;) {
    const RecordedEvent& e = trace.events[i];
    if (e.kind == EventKind::softmax_update || (e.kind == EventKind::load && e.tensor == TensorId::Q)) {
      history.rows = e.rows;
      break;
    }
  }
  if (history.rows.size == 0) return history;
  for (std::size_t i = 0; i < position; ++i) {
    const RecordedEvent& e = trace.events[i];
    if (e.kind == EventKind::softmax_update && e.rows == history.rows) history.updates.push_back(i);
  }
  return history;
}

// ---------------------------------------------------------------------------------------------
// [SECTION] Tile values

std::optional<TileValues> score_tile_values(const Trace& trace, std::size_t position, TensorId tensor, int row, int col) {
  position = std::min(position, trace.events.size());
  for (std::size_t i = position; i-- > 0;) {
    const RecordedEvent& e = trace.events[i];
    if (e.kind == EventKind::compute && e.tensor == tensor && !e.values.empty() && covers(e.rows, row) &&
        covers(e.cols, col))
      return TileValues{e.tensor, e.rows, e.cols, &e.values, i};
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// [SECTION] The visualizer's limits

void check_replayable(const Trace& trace, const std::string& source) {
  const TraceInfo& info = trace.info;
  auto refuse = [&](const std::string& what) { throw std::invalid_argument(source + ": " + what); };
  for (const auto& [name, value] : {std::pair{"seqlen_q", info.seqlen_q}, std::pair{"seqlen_k", info.seqlen_k}}) {
    if (value > kMaxReplaySeqlen)
      refuse(std::string("problem: ") + name + " = " + std::to_string(value) + "; allowed: 1 .. " +
             std::to_string(kMaxReplaySeqlen) + " for the visualizer (count larger problems with `flashlab sweep`)");
  }
  // Within these sequences the products below stay far inside int64.
  const std::int64_t row_blocks = (std::int64_t{info.seqlen_q} + info.block_rows - 1) / info.block_rows;
  const std::int64_t col_blocks = (std::int64_t{info.seqlen_k} + info.block_cols - 1) / info.block_cols;
  if (row_blocks * col_blocks > kMaxReplayTilePairs)
    refuse("block_rows x block_cols = " + std::to_string(info.block_rows) + " x " + std::to_string(info.block_cols) +
           " make " + std::to_string(row_blocks) + " x " + std::to_string(col_blocks) + " = " +
           std::to_string(row_blocks * col_blocks) + " block pairs; allowed: at most " +
           std::to_string(kMaxReplayTilePairs) + " (the closed form walks every pair)");
  TraceState state;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    apply_event(state, trace, i);
    if (state.sram.size() > kMaxLiveTiles)
      refuse("event " + std::to_string(i) + ": " + std::to_string(state.sram.size()) +
             " tiles live in SRAM at once; allowed: at most " + std::to_string(kMaxLiveTiles));
  }
  try {
    build_score_grid(trace);
  } catch (const std::invalid_argument& error) {
    refuse(error.what());
  }
}

Trace load_replay_trace(const std::string& path) {
  Trace trace = load_trace(path);
  check_replayable(trace, "trace file " + path);
  return trace;
}

}  // namespace flashlab::viz
