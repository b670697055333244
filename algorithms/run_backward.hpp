// Runs a per-head backward schedule (05, 06, 07) over a whole problem: every sequence of a
// (varlen) batch, every query head, and the GQA/MQA reduction of dK and dV.
//
// A backward schedule works on one (sequence, query head) and writes dQ of that head and the
// dK, dV that this head contributes to its KV head. With MHA those go straight to the outputs.
// With GQA and MQA (group size g > 1) the g query heads of a KV head each write their dK, dV into
// an fp32 HBM buffer of their own, and sum_group_gradients() then adds the g buffers in increasing
// head order and writes the result once, rounded to the problem's dtype (the flash-attention
// wrappers do the same with an expanded dK, dV and a sum over the group). The order is fixed, so
// the result is bitwise repeatable; the reduction's traffic is counted like any schedule's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "problem.hpp"
#include "run_schedule.hpp"
#include "tensors.hpp"
#include "tile_memory.hpp"

namespace flashlab {

// The HBM views of sequence b (any head: shapes only) with no data, for shape-only runs
// (the simulator's sweeps) where no host buffer exists.
inline HeadTensors shape_only_head_tensors(const Problem& problem, int batch_index) {
  const int rows_q = problem.seqlen_q_of(batch_index), rows_k = problem.seqlen_k_of(batch_index);
  const int d = problem.head_dim, dv = problem.value_dim();
  const DType dtype = problem.dtype;
  auto view = [](TensorId id, DType type, int rows, int cols) { return HbmMatrix{id, type, nullptr, rows, cols, cols}; };
  HeadTensors x;
  x.Q = view(TensorId::Q, dtype, rows_q, d);
  x.K = view(TensorId::K, dtype, rows_k, d);
  x.V = view(TensorId::V, dtype, rows_k, dv);
  x.O = view(TensorId::O, dtype, rows_q, dv);
  x.LSE = view(TensorId::LSE, DType::fp32, rows_q, 1);
  x.dO = view(TensorId::dO, dtype, rows_q, dv);
  x.dQ = view(TensorId::dQ, dtype, rows_q, d);
  x.dK = view(TensorId::dK, dtype, rows_k, d);
  x.dV = view(TensorId::dV, dtype, rows_k, dv);
  return x;
}

// destination = parts[0] + parts[1] + ... in this order, block_rows rows at a time: the GQA
// reduction of the per-query-head dK (or dV) of one KV head.
template <class Memory>
void sum_group_gradients(Memory& mem, const std::vector<HbmMatrix>& parts, const HbmMatrix& destination, int block_rows) {
  for (int row_begin = 0; row_begin < destination.rows; row_begin += block_rows) {
    const Range rows{row_begin, std::min(block_rows, destination.rows - row_begin)};
    Tile sum = mem.load(parts.front(), rows);
    for (std::size_t h = 1; h < parts.size(); ++h) {
      Tile part = mem.load(parts[h], rows);
      mem.add(sum, part);
    }
    mem.store(destination, rows, sum);
  }
}

// Rows per block of the GQA reduction: two fp32 tiles of that many rows must fit in SRAM.
inline int group_reduction_block_rows(std::int64_t sram_capacity_bytes, int dim) {
  constexpr int kPreferredRows = 64;
  if (sram_capacity_bytes <= 0) return kPreferredRows;
  const std::int64_t fitting = sram_elements(sram_capacity_bytes, DType::fp32) / (2LL * dim);
  return static_cast<int>(std::clamp<std::int64_t>(fitting, 1, kPreferredRows));
}

// The fp32 HBM buffer a gradient (dQ) is accumulated in: the output itself when it is fp32.
inline HbmMatrix fp32_gradient_accumulator(HbmScratch& scratch, const HbmMatrix& output) {
  if (output.dtype == DType::fp32) return output;
  return scratch.matrix(output.id, DType::fp32, output.rows, output.cols);
}

// Before the main loop: a gradient = 0 in HBM (dQ: FA1 Algorithm 4, line 5; FA2 Algorithm 2,
// line 3), block_rows rows at a time.
template <class Memory>
void zero_gradient(Memory& mem, const HbmMatrix& gradient, int block_rows) {
  for (int row_begin = 0; row_begin < gradient.rows; row_begin += block_rows) {
    const Range rows{row_begin, std::min(block_rows, gradient.rows - row_begin)};
    Tile zero = mem.zeros(gradient.id, rows, {0, gradient.cols});
    mem.store(gradient, rows, zero);
  }
}

// How the query heads of a KV group (GQA/MQA) combine their dK, dV:
//   fp32_partials - each head writes its share to an fp32 buffer of its own, then a reduction
//                   pass reads the g buffers and writes their sum once in the dtype
//                   (sum_group_gradients; the flash-attention wrappers' expanded dK, dV summed
//                   over the group);
//   in_place      - one fp32 accumulator per KV head, zeroed once, that every head adds its
//                   dK_j, dV_j into with atomics at L2 (no read), then converted once to the
//                   dtype (in the output itself when the dtype is fp32): FlashAttention-3's GQA
//                   backward (dk_accum, dv_accum).
enum class GroupReduction { fp32_partials, in_place };
inline const char* to_string(GroupReduction reduction) {
  return reduction == GroupReduction::in_place ? "in_place" : "fp32_partials";
}
inline GroupReduction group_reduction_from_string(const std::string& name) {
  if (name == "fp32_partials") return GroupReduction::fp32_partials;
  if (name == "in_place") return GroupReduction::in_place;
  throw std::invalid_argument("dK/dV group reduction '" + name + "' is unknown; allowed: fp32_partials, in_place");
}

// Writes a head's dK_j (or dV_j): stored, or added into the group's accumulator (in_place).
template <class Memory>
void write_key_gradient(Memory& mem, const HeadTensors& x, const HbmMatrix& destination, Range cols, const Tile& gradient) {
  if (x.add_key_gradients) {
    mem.atomic_add(destination, cols, gradient);
  } else {
    mem.store(destination, cols, gradient);
  }
}

// dK_j = 0 and dV_j = 0 written to HBM for the key block `cols`: FA1 Algorithm 4's line 5, block
// by block, and FA2 Algorithm 2's result for a key block no query sees. Nothing to write when
// the head adds into its group's accumulator, which is zeroed once for the group.
template <class Memory>
void zero_key_gradients(Memory& mem, const HeadTensors& x, Range cols) {
  if (x.add_key_gradients) return;
  Tile dk_zero = mem.zeros(TensorId::dK, cols, {0, x.dK.cols});
  mem.store(x.dK, cols, dk_zero);
  Tile dv_zero = mem.zeros(TensorId::dV, cols, {0, x.dV.cols});
  mem.store(x.dV, cols, dv_zero);
}

// After the main loop: dQ rounded once from its fp32 accumulator to the output's dtype.
template <class Memory>
void convert_gradient(Memory& mem, const HbmMatrix& accumulator, const HbmMatrix& output, int block_rows) {
  if (accumulator.dtype == output.dtype) return;  // fp32 output: accumulated in place
  for (int row_begin = 0; row_begin < output.rows; row_begin += block_rows) {
    const Range rows{row_begin, std::min(block_rows, output.rows - row_begin)};
    Tile block = mem.load(accumulator, rows);
    mem.store(output, rows, block);
  }
}

// The heads [first_head, first_head + heads) of sequence b that share one KV head, run one by one:
// the one place that routes a group's dK, dV (the simulator's registry runs every schedule
// through it, and run_backward below). views(h) gives head h's HBM views; run_head(head, x)
// runs one head on a fresh memory model and returns its counters; with_memory(f) calls f on a
// fresh memory model and returns its counters. A backward pass (backward) with heads > 1 combines
// the group's dK, dV: fp32_partials gives each head an fp32 buffer of its own and sums them in
// increasing head order (sum_group_gradients); in_place zeroes one fp32 accumulator per KV
// head, lets every head add into it (HeadTensors::add_key_gradients) and converts it once. The
// reductions' rows follow M (group_reduction_block_rows).
template <class Memory, class Views, class RunHead, class WithMemory>
Counters run_head_group(const Problem& problem, int b, int first_head, int heads, bool backward, GroupReduction reduction,
                        std::int64_t sram_capacity_bytes, Views&& views, RunHead&& run_head, WithMemory&& with_memory) {
  const bool grouped = backward && heads > 1;
  Counters total;
  HbmScratch group_buffers(Memory::with_data);
  if (grouped && reduction == GroupReduction::in_place) {
    const HeadTensors outputs = views(first_head + heads - 1);
    const HbmMatrix dK = fp32_gradient_accumulator(group_buffers, outputs.dK);
    const HbmMatrix dV = fp32_gradient_accumulator(group_buffers, outputs.dV);
    const int dk_rows = group_reduction_block_rows(sram_capacity_bytes, dK.cols);
    const int dv_rows = group_reduction_block_rows(sram_capacity_bytes, dV.cols);
    total += with_memory([&](Memory& mem) { zero_gradient(mem, dK, dk_rows), zero_gradient(mem, dV, dv_rows); });
    for (int h = first_head; h < first_head + heads; ++h) {
      HeadTensors x = views(h);
      x.dK = dK, x.dV = dV, x.add_key_gradients = true;
      total += run_head(head_problem(problem, b, h), x);
    }
    total += with_memory([&](Memory& mem) { convert_gradient(mem, dK, outputs.dK, dk_rows), convert_gradient(mem, dV, outputs.dV, dv_rows); });
    return total;
  }
  std::vector<HbmMatrix> dk_parts, dv_parts;
  for (int h = first_head; h < first_head + heads; ++h) {  // query heads in increasing order
    HeadTensors x = views(h);
    if (grouped) {  // this head's share of dK, dV goes to its own fp32 buffer
      x.dK = dk_parts.emplace_back(group_buffers.matrix(TensorId::dK, DType::fp32, x.K.rows, x.K.cols));
      x.dV = dv_parts.emplace_back(group_buffers.matrix(TensorId::dV, DType::fp32, x.V.rows, x.V.cols));
    }
    total += run_head(head_problem(problem, b, h), x);
  }
  if (grouped) {
    const HeadTensors outputs = views(first_head + heads - 1);
    total += with_memory([&](Memory& mem) {
      sum_group_gradients(mem, dk_parts, outputs.dK, group_reduction_block_rows(sram_capacity_bytes, outputs.dK.cols));
      sum_group_gradients(mem, dv_parts, outputs.dV, group_reduction_block_rows(sram_capacity_bytes, outputs.dV.cols));
    });
  }
  return total;
}

// Calls schedule(memory, head_problem, head_tensors) for every (sequence b, query head h), with a
// fresh memory model per head, then reduces dK and dV over each GQA group (fp32_partials, through
// run_head_group). tensors == nullptr runs shape-only (Memory must then be ShapeMemory). Returns
// the counters summed over heads and reductions.
template <class Memory, class Schedule>
Counters run_backward(const Problem& problem, AttentionTensors* tensors, std::int64_t sram_capacity_bytes,
                      Schedule&& schedule) {
  problem.validate();
  if (tensors == nullptr && Memory::with_data) {
    throw std::invalid_argument("run_backward: tensors = null; allowed only with a shape-only memory model");
  }
  const MemoryConfig config{problem.dtype, sram_capacity_bytes};
  const int group = problem.group_size();
  const auto with_memory = [&](auto&& f) {
    Memory memory(config);
    f(memory);
    return memory.counters();
  };
  const auto run_head = [&](const HeadProblem& head, const HeadTensors& x) {
    return with_memory([&](Memory& memory) { schedule(memory, head, x); });
  };
  Counters total;
  for (int b = 0; b < problem.batch; ++b) {
    const auto views = [&](int h) { return tensors ? head_tensors(*tensors, problem, b, h) : shape_only_head_tensors(problem, b); };
    for (int kv = 0; kv < problem.heads_kv; ++kv)
      total += run_head_group<Memory>(problem, b, kv * group, group, true, GroupReduction::fp32_partials, sram_capacity_bytes,
                                      views, run_head, with_memory);
  }
  return total;
}

}  // namespace flashlab
