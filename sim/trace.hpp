// The trace recorder: a TraceSink that keeps the events of one schedule run in a bounded store,
// and the versioned JSON form of a trace that the visualizer and the notebooks read.
//
//   TraceRecorder recorder;                       // bound: kDefaultMaxEvents events
//   DataMemory mem(config, &recorder);
//   fa2_forward(mem, head, tiling, tensors);
//   Trace trace = recorder.finish(info);          // throws TraceOverflow if the bound was hit
//   save_trace("fa2.json", trace);
//
// A trace that outgrows its bounds (events, kept tile values; algorithms/limits.hpp caps both) is
// never cut short silently: the recorder keeps counting the events it could not store and
// finish() refuses to hand back a partial trace. record() never throws (it is noexcept, as every
// TraceSink's is): it also runs in tiles' destructors, during stack unwinding; even running out of
// memory is only noted there and reported by finish().
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithms/limits.hpp"
#include "algorithms/problem.hpp"
#include "algorithms/tensors.hpp"
#include "algorithms/tile_memory.hpp"
#include "json_input.hpp"

namespace flashlab {

// The JSON layout written by this build. A reader accepts exactly this version.
inline constexpr int kTraceFormatVersion = 1;
inline constexpr const char* kTraceFormatName = "flashlab-trace";

// What a trace may hold. A trace file is untrusted input: the loader refuses more than this, by
// name, before anything reads the events (the header's sizes are bounded by Problem::validate;
// the events by kMaxTraceEvents of algorithms/limits.hpp, the recorder's bound too).
inline constexpr std::int64_t kMaxTraceFileBytes = 512 << 20;   // a 1M-event trace is ~150 MB without values
inline constexpr std::int64_t kMaxTraceElementBytes = 4;        // no tile element is wider than fp32

// One event as stored: a TraceEvent that owns its strings, so it outlives the run and survives a
// JSON round trip.
struct RecordedEvent {
  EventKind kind = EventKind::compute;
  TensorId tensor = TensorId::S;
  Range rows, cols;
  std::string op;               // compute: "matmul", "exp", "row_max", ...
  int line = 0;                 // line: the paper's algorithm line
  std::int64_t sram_bytes = 0;  // SRAM in use after the event
  std::int64_t bytes = 0;       // the tile's size; load and store: the HBM bytes moved
  std::vector<float> row_max, row_sum, rescale;  // softmax_update: per row of the query block
  std::vector<float> values;                     // compute: the tile's values, when recorded
  int step = 0, device = 0, block = 0;           // ring_step: device `device` holds block `block` at `step`

  std::int64_t elements() const { return static_cast<std::int64_t>(rows.size) * cols.size; }
  bool operator==(const RecordedEvent&) const = default;
};

// What was run, so a reader can label and draw the trace without the code that made it.
struct TraceInfo {
  std::string schedule;  // the schedule's name, e.g. "fa2_forward"
  int seqlen_q = 1;
  int seqlen_k = 1;
  int head_dim = 64;
  int head_dim_v = 64;
  DType dtype = DType::fp32;
  Mask mask;
  std::int64_t sram_capacity_bytes = 0;  // M in bytes; 0: unbounded
  int block_rows = 0;                    // the schedule's tiling (a file holds >= 1)
  int block_cols = 0;
  int devices = 0;                       // a ring's devices (its ring_step events); 0: not a ring
  bool operator==(const TraceInfo&) const;
};

// The header of a trace of one head of `problem` run by `schedule` with these blocks and SRAM.
TraceInfo trace_info(const std::string& schedule, const Problem& problem, std::int64_t sram_capacity_bytes,
                     int block_rows, int block_cols);

// The one-head problem a trace header describes (its shape, dtype and mask), as the loader
// checks it and the visualizer's closed form and bounds use it.
Problem trace_problem(const TraceInfo& info);

struct Trace {
  TraceInfo info;
  std::vector<RecordedEvent> events;
  bool operator==(const Trace&) const = default;
};

// A run produced more events than the recorder's bound.
class TraceOverflow : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A trace file that cannot be read: not JSON, not a trace, another version, or a bad field.
// Bad input (a std::invalid_argument, through JsonInputError).
class TraceFormatError : public JsonInputError {
 public:
  using JsonInputError::JsonInputError;
};

class TraceRecorder : public TraceSink {
 public:
  static constexpr std::size_t kDefaultMaxEvents = 1'000'000;

  // max_events: the bound on stored events, 1..kMaxTraceEvents. value_elements_limit: compute
  // events of score and probability tiles (S, P) with at most this many elements keep their
  // values, 0..kMaxTraceValueElements (0: none). max_values: the values the whole trace keeps.
  // Out-of-range bounds throw std::invalid_argument naming them and the range.
  explicit TraceRecorder(std::size_t max_events = kDefaultMaxEvents, std::int64_t value_elements_limit = 0,
                         std::int64_t max_values = kMaxTraceValues);

  void record(const TraceEvent& event) noexcept override;

  std::size_t max_events() const { return max_events_; }
  std::size_t seen_events() const { return seen_events_; }  // stored or not
  bool overflowed() const { return seen_events_ > max_events_ || stored_values_ > max_values_ || out_of_memory_; }
  const std::vector<RecordedEvent>& events() const { return events_; }

  // The whole trace of a finished run. Throws TraceOverflow, naming the count and the bound that
  // was passed (events, kept values, or memory), when the run did not fit.
  Trace finish(TraceInfo info);

 private:
  std::size_t max_events_;
  std::int64_t max_values_;
  std::size_t seen_events_ = 0;
  std::int64_t stored_values_ = 0;  // past max_values_: nothing more is stored
  bool out_of_memory_ = false;
  std::vector<RecordedEvent> events_;
};

// JSON text of a trace (see docs/visualizer.md for the layout), and back. Non-finite floats
// (the running max of a fully masked row is -inf) are written as the strings "-inf", "inf", "nan".
std::string trace_to_json_text(const Trace& trace, int indent = -1);
// source names the input in error messages ("trace file fa2.json"). The trace read is checked
// by validate_trace.
Trace trace_from_json_text(const std::string& text, const std::string& source = "trace");

// Throws TraceFormatError, naming source, the event, the field and what is allowed, unless the
// trace is one a schedule could have recorded in shape: at most kMaxTraceEvents events; a header
// that is a valid Problem with block sizes >= 1; every tile inside its tensor's shape (rows and
// columns of the header's sequences and head dims); bytes >= 0 and at most what the tile holds;
// SRAM in use >= 0 and within M when M is bounded; values sized to their tile; softmax updates
// carrying row_max, row_sum and rescale together, sized to their block, on all updates or none.
void validate_trace(const Trace& trace, const std::string& source = "trace");

// Files. save_trace writes through sim/output_file.hpp (whole or not at all; throws
// OutputFileError). load_trace throws TraceFormatError when the file cannot be read (missing,
// a directory, over kMaxTraceFileBytes) or is not a valid trace of this version.
void save_trace(const std::string& path, const Trace& trace);
Trace load_trace(const std::string& path);

TensorId tensor_from_string(const std::string& name);     // throws std::invalid_argument
EventKind event_kind_from_string(const std::string& name);  // throws std::invalid_argument

}  // namespace flashlab
