// Shared by the viz tests: run a registry schedule on fresh random inputs with the recorder.
#pragma once

#include <string>

#include "algorithms/00_oracle.hpp"
#include "reference/reference_check.hpp"
#include "sim/schedules.hpp"
#include "sim/trace.hpp"
#include "viz/record.hpp"

namespace flashlab::test {

struct RecordedRun {
  Trace trace;
  Counters counters;        // what the memory model counted
  AttentionTensors tensors; // inputs and outputs of the run
  std::uint64_t seed = 0;
};

inline Problem small_problem(int seqlen_q, int seqlen_k, int head_dim, viz::MaskChoice mask, int window = 24) {
  viz::RecordRequest request;
  request.seqlen_q = seqlen_q, request.seqlen_k = seqlen_k, request.head_dim = head_dim;
  request.mask = mask, request.window = window;
  return viz::request_problem(request);
}

inline RecordedRun record_run(const std::string& schedule, const Problem& problem, sim::BlockSizes blocks,
                              std::int64_t value_elements = viz::kRecordedTileValues) {
  RecordedRun run;
  run.seed = reference::fresh_seed();
  const bool backward = sim::find_schedule(schedule).pass == sim::Pass::backward;
  run.tensors = reference::random_inputs(problem, run.seed, backward);
  TraceRecorder recorder(TraceRecorder::kDefaultMaxEvents, value_elements);
  sim::RunOptions options;
  options.memory = sim::MemoryKind::data;
  options.blocks = blocks;
  options.trace = &recorder;
  const sim::RunResult result = sim::run_schedule(schedule, problem, options, run.tensors);
  run.counters = result.counters;
  TraceInfo info;
  info.schedule = schedule;
  info.seqlen_q = problem.seqlen_q, info.seqlen_k = problem.seqlen_k;
  info.head_dim = problem.head_dim, info.head_dim_v = problem.value_dim();
  info.dtype = problem.dtype, info.mask = problem.mask;
  info.block_rows = blocks.block_rows, info.block_cols = blocks.block_cols;
  info.devices = result.blocks.devices;  // a ring's devices (0 for the others)
  run.trace = recorder.finish(info);
  return run;
}

}  // namespace flashlab::test
