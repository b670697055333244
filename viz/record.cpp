#include "record.hpp"

#include <stdexcept>

#include "replay.hpp"

namespace flashlab::viz {

const char* to_string(MaskChoice mask) {
  switch (mask) {
    case MaskChoice::none: return "none";
    case MaskChoice::causal: return "causal";
    case MaskChoice::window: return "window";
  }
  return "?";
}

Problem request_problem(const RecordRequest& request) {
  Problem problem;
  problem.seqlen_q = request.seqlen_q;
  problem.seqlen_k = request.seqlen_k;
  problem.head_dim = request.head_dim;
  problem.dtype = request.dtype;
  if (request.mask == MaskChoice::causal) problem.mask.causal = true;
  if (request.mask == MaskChoice::window) {
    if (request.window < 0)
      throw std::invalid_argument("window = " + std::to_string(request.window) + "; allowed: >= 0");
    problem.mask.window_left = request.window;
    problem.mask.window_right = 0;
  }
  return problem;
}

namespace {

std::string too_large(const std::string& what, const std::string& detail) {
  return what + " is too large to animate (" + detail +
         "); count it shape-only with the sweep instead (`flashlab sweep`), which keeps no events";
}

}  // namespace

Recording record_trace(const RecordRequest& request) {
  for (const auto& [name, value] : {std::pair{"seqlen_q", request.seqlen_q}, std::pair{"seqlen_k", request.seqlen_k}}) {
    if (value > kMaxAnimatedSeqlen)
      throw std::invalid_argument(too_large(std::string(name) + " = " + std::to_string(value),
                                            "allowed: 1 .. " + std::to_string(kMaxAnimatedSeqlen)));
  }
  const Problem problem = request_problem(request);
  problem.validate();

  sim::RunOptions options;
  options.memory = sim::MemoryKind::data;
  options.sram_bytes = request.sram_bytes;
  if (!request.blocks_from_sram) options.blocks = {request.block_rows, request.block_cols};
  if (sim::find_schedule(request.schedule).splits_over_devices) {
    options.blocks.devices = request.devices;
    options.blocks.ordering = request.ordering;
  }
  options.block_rule = request.block_rule;
  options.seed = request.seed;
  TraceRecorder recorder(kMaxAnimatedEvents, kRecordedTileValues);
  options.trace = &recorder;
  const sim::RunResult run = sim::run_schedule(request.schedule, problem, options);

  TraceInfo info = trace_info(run.schedule, problem, request.sram_bytes, run.blocks.block_rows, run.blocks.block_cols);
  info.devices = run.blocks.devices;  // a ring's (0 for the others)
  if (recorder.overflowed())
    throw std::invalid_argument(too_large("this problem", std::to_string(recorder.seen_events()) +
                                                              " events, more than the " +
                                                              std::to_string(kMaxAnimatedEvents) + " an animation keeps"));
  Trace trace = recorder.finish(std::move(info));
  check_replayable(trace, "the recorded trace");  // holds by the limits above; every lane's trace passes it
  return {std::move(trace), run.counters, run.block_rule};
}

std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const sim::ScheduleInfo& info : sim::schedules()) names.push_back(info.name);
  return names;
}

}  // namespace flashlab::viz
