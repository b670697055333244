// The forward schedules behind one switch, so a test can run every one of them on the same
// problem, with data (DataMemory) or shape-only (ShapeMemory on tensors without data).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "algorithms/02_standard_attention.hpp"
#include "algorithms/03_fa1_forward.hpp"
#include "algorithms/04_fa2_forward.hpp"
#include "algorithms/08_split_kv_decode.hpp"
#include "algorithms/09_block_sparse.hpp"
#include "algorithms/run_schedule.hpp"

namespace flashlab::testing {

enum class ForwardSchedule { standard, fa1, fa2, split_kv, block_sparse };
inline constexpr std::array kForwardSchedules{ForwardSchedule::standard, ForwardSchedule::fa1,
                                              ForwardSchedule::fa2, ForwardSchedule::split_kv,
                                              ForwardSchedule::block_sparse};

inline const char* name(ForwardSchedule schedule) {
  switch (schedule) {
    case ForwardSchedule::standard:
      return "02 standard attention";
    case ForwardSchedule::fa1:
      return "03 FA1 forward";
    case ForwardSchedule::fa2:
      return "04 FA2 forward";
    case ForwardSchedule::split_kv:
      return "08 split-KV decode";
    case ForwardSchedule::block_sparse:
      return "09 block-sparse FA1";
  }
  return "?";
}

// Block sizes that divide none of the official shapes, unless a test says otherwise.
struct ForwardBlocks {
  int rows = 48;
  int cols = 40;
  int num_splits = 3;
  int split_length = 0;
};

template <class Memory>
void run_forward_head(ForwardSchedule schedule, Memory& mem, const HeadProblem& head,
                      const HeadTensors& x, const ForwardBlocks& blocks) {
  switch (schedule) {
    case ForwardSchedule::standard:
      standard_attention(mem, head, BlockTiling{blocks.rows, blocks.cols}, x);
      break;
    case ForwardSchedule::fa1:
      fa1_forward(mem, head, BlockTiling{blocks.rows, blocks.cols}, x);
      break;
    case ForwardSchedule::fa2:
      fa2_forward(mem, head, BlockTiling{blocks.rows, blocks.cols}, x);
      break;
    case ForwardSchedule::split_kv:
      split_kv_forward(
          mem, head,
          SplitKvTiling{blocks.rows, blocks.cols, blocks.num_splits, blocks.split_length}, x);
      break;
    case ForwardSchedule::block_sparse:
      fa1_block_sparse_forward(mem, head, BlockTiling{blocks.rows, blocks.cols}, x);
      break;
  }
}

// Runs a schedule on every (sequence, head) of a problem, writing tensors.O and tensors.LSE.
inline Counters run_forward(ForwardSchedule schedule, const Problem& problem,
                            AttentionTensors& tensors, const ForwardBlocks& blocks = {},
                            std::int64_t sram_bytes = 0) {
  return run_per_head<DataMemory>(problem, tensors, sram_bytes,
                                  [&](auto& mem, const HeadProblem& head, const HeadTensors& x) {
                                    run_forward_head(schedule, mem, head, x, blocks);
                                  });
}

// The HBM views of sequence b (any head) with shapes and no data: what the simulator hands a
// schedule.
inline HeadTensors shape_only_head_tensors(const Problem& problem, int b) {
  const int sq = problem.seqlen_q_of(b), sk = problem.seqlen_k_of(b), d = problem.head_dim,
            dv = problem.value_dim();
  const auto view = [&](TensorId id, DType dtype, int rows, int cols) {
    return HbmMatrix{id, dtype, nullptr, rows, cols, cols};
  };
  HeadTensors x;
  x.Q = view(TensorId::Q, problem.dtype, sq, d);
  x.K = view(TensorId::K, problem.dtype, sk, d);
  x.V = view(TensorId::V, problem.dtype, sk, dv);
  x.O = view(TensorId::O, problem.dtype, sq, dv);
  x.LSE = view(TensorId::LSE, DType::fp32, sq, 1);
  return x;
}

inline Counters run_forward_shape_only(ForwardSchedule schedule, const Problem& problem,
                                       const ForwardBlocks& blocks = {},
                                       std::int64_t sram_bytes = 0) {
  problem.validate();
  Counters total;
  for (int b = 0; b < problem.batch; ++b) {
    for (int h = 0; h < problem.heads_q; ++h) {
      ShapeMemory memory(MemoryConfig{problem.dtype, sram_bytes});
      run_forward_head(schedule, memory, head_problem(problem, b, h),
                       testing::shape_only_head_tensors(problem, b), blocks);
      total += memory.counters();
    }
  }
  return total;
}

}  // namespace flashlab::testing
