// Replaying a recorded trace: the logic behind the visualizer's panels, with no drawing in it.
//
// A position in a trace is the number of its events that have happened (0 .. size). Everything
// a panel shows at a position is computed from the events before it:
//   TraceCursor      - the position; stepping by event or by paper line, scrubbing, playback;
//   state_at         - HBM traffic per tensor so far, the tiles live in SRAM, the current line;
//   ScoreGrid        - the score matrix as tiles: done, current, pending or skipped by the mask;
//   softmax_history  - the online-softmax state (m, l, rescale) of the current query block;
//   score_tile_values - the S and P values a schedule computed for a tile, when recorded.
// A trace from a file reaches them only through load_replay_trace, which holds it to the
// visualizer's limits (limits.hpp) after the loader's own checks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "limits.hpp"
#include "sim/trace.hpp"

namespace flashlab::viz {

// ---------------------------------------------------------------------------------------------
// The cursor

enum class StepUnit { event, line };

class TraceCursor {
 public:
  TraceCursor() = default;
  explicit TraceCursor(const Trace& trace);

  std::size_t position() const { return position_; }
  std::size_t size() const { return size_; }
  bool at_end() const { return position_ == size_; }
  double fraction() const { return size_ == 0 ? 1.0 : static_cast<double>(position_) / size_; }

  void seek(std::size_t position);  // clamped to [0, size]
  void seek_fraction(double fraction);
  // One event, or one paper line: to the next position where a line has completed (just before
  // the next line mark, or the end). Return false when already at the end (start).
  bool step_forward(StepUnit unit);
  bool step_back(StepUnit unit);
  // Playback: advances by steps_per_second * seconds steps, carrying the fraction of a step to
  // the next call. Returns false once the end is reached.
  bool play(double seconds, double steps_per_second, StepUnit unit);

 private:
  std::size_t size_ = 0;
  std::size_t position_ = 0;
  std::vector<std::size_t> line_stops_;  // positions where a line has completed, ascending
  double carry_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The state at a position

struct LiveTile {
  TensorId tensor = TensorId::S;
  Range rows, cols;
  std::int64_t bytes = 0;
  std::size_t born = 0;  // index of the event that made it
};

struct TraceState {
  std::size_t position = 0;
  std::array<TensorTraffic, kTensorCount> traffic{};  // HBM traffic of the events so far
  std::int64_t loads = 0, stores = 0;
  std::int64_t sram_bytes = 0;       // in use now
  std::int64_t sram_peak_bytes = 0;  // so far
  std::vector<LiveTile> sram;        // tiles in SRAM now, oldest first
  int line = 0;                      // the paper line marked last (0: none yet)
  const RecordedEvent* last = nullptr;  // the event that just happened

  const TensorTraffic& operator[](TensorId id) const { return traffic[static_cast<int>(id)]; }
  std::int64_t hbm_read_bytes() const;
  std::int64_t hbm_write_bytes() const;
  bool live(TensorId id) const;
};

// Replays events [0, position) of the trace (position is clamped to its size).
TraceState state_at(const Trace& trace, std::size_t position);
// One step of it: event `index` (the next one) happens to `state`.
void apply_event(TraceState& state, const Trace& trace, std::size_t index);

// Whether event `index` made a new tile in SRAM (a load, or a compute that allocated its result)
// rather than updating one in place: SRAM grew by exactly the tile's size.
bool allocates(const Trace& trace, std::size_t index);

// ---------------------------------------------------------------------------------------------
// The score matrix as tiles

enum class CellStatus { pending, current, done, skipped };
const char* to_string(CellStatus status);

struct ScoreGrid {
  TensorId tensor = TensorId::S;  // the score tiles' tensor (S; A for square tiling)
  std::vector<int> row_edges;     // cell boundaries in score rows: 0, ..., seqlen_q
  std::vector<int> col_edges;     // and in keys: 0, ..., seqlen_k
  static constexpr std::size_t kNever = static_cast<std::size_t>(-1);
  std::vector<std::size_t> first_computed;  // per cell (row-major): first event making it, or kNever

  // An event that made a score tile, and the cells it covers [begin, end).
  struct Visit {
    std::size_t event = 0;
    int row_cell_begin = 0, row_cell_end = 0, col_cell_begin = 0, col_cell_end = 0;
  };
  std::vector<Visit> visits;

  int row_cells() const { return row_edges.empty() ? 0 : static_cast<int>(row_edges.size()) - 1; }
  int col_cells() const { return col_edges.empty() ? 0 : static_cast<int>(col_edges.size()) - 1; }
  bool empty() const { return visits.empty(); }
  std::size_t first(int row_cell, int col_cell) const {
    return first_computed[static_cast<std::size_t>(row_cell) * col_cells() + col_cell];
  }
  // The cell holding score (row, col), or -1.
  int row_cell_of(int row) const;
  int col_cell_of(int col) const;
  CellStatus status(int row_cell, int col_cell, const TraceState& state) const;
};

// Cells are the tiles a schedule made of S (of A when it makes no S), split where tiles of
// different shapes overlap. A cell no event ever made is skipped by the mask. Throws
// std::invalid_argument, before allocating them, when there would be more than kMaxScoreCells.
ScoreGrid build_score_grid(const Trace& trace);

// ---------------------------------------------------------------------------------------------
// The online-softmax state

struct SoftmaxHistory {
  Range rows;                         // the current query block (size 0: none yet)
  std::vector<std::size_t> updates;   // its softmax_update events before the position, in order
};

// The query block being worked on at a position: the rows of the latest softmax update, or of
// a later Q load that started a new block.
SoftmaxHistory softmax_history(const Trace& trace, std::size_t position);

// ---------------------------------------------------------------------------------------------
// Tile values (recorded for small S and P tiles in data runs)

struct TileValues {
  TensorId tensor = TensorId::S;
  Range rows, cols;
  const std::vector<float>* values = nullptr;  // row-major rows.size x cols.size
  std::size_t event = 0;
  float at(int r, int c) const { return (*values)[static_cast<std::size_t>(r) * cols.size + c]; }
};

// The latest recorded values of the tensor's tile covering score (row, col), from events before
// the position; nothing when none was recorded yet.
std::optional<TileValues> score_tile_values(const Trace& trace, std::size_t position, TensorId tensor, int row, int col);

// ---------------------------------------------------------------------------------------------
// A ring's steps (Ring Attention traces: ring_step events)

struct RingHoldings {
  int devices = 0;                      // 0: not a ring's trace
  int step = -1;                        // the latest step begun before the position (-1: none yet)
  int device = -1;                      // the device working at the position
  // [step][device]: the key/value block (its owner) the device holds, -1 until that step began.
  std::vector<std::vector<int>> blocks;
};

// Which block each device holds at each step, from the ring_step events before the position.
RingHoldings ring_holdings(const Trace& trace, std::size_t position);

// ---------------------------------------------------------------------------------------------
// The visualizer's limits

// Throws std::invalid_argument naming `source`, what is too large and the limit (limits.hpp)
// unless a frame's work on the trace is bounded: sequences up to kMaxReplaySeqlen, at most
// kMaxReplayTilePairs block pairs for the closed form, kMaxLiveTiles tiles in SRAM at once and
// kMaxScoreCells score cells.
void check_replayable(const Trace& trace, const std::string& source);

// A trace file for a lane: load_trace (which checks it against its header), then
// check_replayable. Errors name the file.
Trace load_replay_trace(const std::string& path);

}  // namespace flashlab::viz
