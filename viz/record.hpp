// Recording a trace for the visualizer: one schedule of the registry (sim/schedules.hpp) run on
// real data for one (sequence, head), every event kept. The app replays what the real schedule
// did; nothing here re-implements one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim/schedules.hpp"
#include "sim/trace.hpp"
#include "limits.hpp"

namespace flashlab::viz {

enum class MaskChoice { none, causal, window };
const char* to_string(MaskChoice mask);

struct RecordRequest {
  std::string schedule = "fa2";
  int seqlen_q = 256;
  int seqlen_k = 256;
  int head_dim = 64;
  MaskChoice mask = MaskChoice::none;
  int window = 64;                   // sliding window: keys within `window` before the query (and itself)
  bool blocks_from_sram = false;     // true: derive block sizes from sram_bytes by block_rule
  sim::BlockRule block_rule = sim::BlockRule::fitting;  // as `flashlab run --block-rule`
  int block_rows = 64;               // Br
  int block_cols = 64;               // Bc
  std::int64_t sram_bytes = 0;       // M in bytes (bounds the arena; 0: unbounded)
  DType dtype = DType::fp32;
  std::uint64_t seed = 1;
  int devices = 4;                   // ring schedules: the ring's devices and ordering
  RingOrdering ordering = RingOrdering::zigzag;
};

// The one-head problem a request describes.
Problem request_problem(const RecordRequest& request);

struct Recording {
  Trace trace;
  Counters counters;       // what the memory model counted on the run
  std::string block_rule;  // "given", "fitting" or "paper" (sim::RunResult::block_rule)
};

// Runs the schedule with the recording sink. Throws std::invalid_argument for a bad request
// (naming the input and its range), including a problem too large to animate, which suggests
// the shape-only sweep instead; SramOverflow when the schedule does not fit in M.
Recording record_trace(const RecordRequest& request);

// The registry's schedule names, in learning order.
std::vector<std::string> schedule_names();

}  // namespace flashlab::viz
