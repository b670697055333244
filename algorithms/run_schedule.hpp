// Runs a per-head schedule over every (sequence, query head) of a problem.
#pragma once

#include "problem.hpp"
#include "tensors.hpp"
#include "tile_memory.hpp"

namespace flashlab {

// The HBM views of sequence b, query head h: Q and O of head h, K and V of its KV head (GQA).
HeadTensors head_tensors(AttentionTensors& tensors, const Problem& problem, int batch_index, int head_index);

// Calls schedule(memory, head_problem, head_tensors) for each (b, h) with a fresh memory model
// per head, and returns the counters summed over heads.
template <class Memory = DataMemory, class Schedule>
Counters run_per_head(const Problem& problem, AttentionTensors& tensors, std::int64_t sram_capacity_bytes,
                      Schedule&& schedule) {
  problem.validate();
  Counters total;
  for (int b = 0; b < problem.batch; ++b) {
    for (int h = 0; h < problem.heads_q; ++h) {
      Memory memory(MemoryConfig{problem.dtype, sram_capacity_bytes});
      schedule(memory, head_problem(problem, b, h), head_tensors(tensors, problem, b, h));
      total += memory.counters();
    }
  }
  return total;
}

}  // namespace flashlab
