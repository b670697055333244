// The workspace of the backward rungs (FA2 and FA3 generations), in one device allocation:
//   LSE in base 2 and D = rowsum(dO * O), [heads_q][rows_pitch] floats each (the preprocess's),
//     each sequence's rows starting on 16 bytes (backward_rows_first_row: the FA3 rung loads them
//     by TMA, whose innermost coordinate must be 16-byte aligned): rows_pitch = total_rows_q + 3 *
//     batch rounded up to 4;
//   the fp32 dQ accumulator, [heads_q][dq_rows][padded head dim], each sequence padded by
//     dq_row_padding rows so that its last query block's tile fits;
//   the deterministic mode's turn counters, one int per (batch, head, query block of
//     counter_block_rows rows);
//   scheduler_ints ints for a persistent kernel's tile draws (the FA3 backward's: one).
// The counters and the scheduler's ints start at zero: the caller clears [counters_offset, total).
// Each part starts on a 256-byte boundary. Checked arithmetic (algorithms/checked_math.hpp): a
// layout past int64 is refused with SizeOverflow naming `name`, never wrapped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithms/checked_math.hpp"
#include "algorithms/host_device.hpp"
#include "algorithms/problem.hpp"

namespace flashlab::kernels {

// The first row of sequence b (first_row_q: its first packed row, or b * seqlen_q) in the LSE and
// D arrays: on 16 bytes, with at most 3 b rows of slack before it, so that rounding up never
// overlaps the sequence before and the last one ends within rows_pitch.
FLASHLAB_HOST_DEVICE std::int64_t backward_rows_first_row(std::int64_t first_row_q, std::int64_t b) {
  return (first_row_q + 3 * b + 3) / 4 * 4;
}

struct BackwardWorkspaceLayout {
  std::size_t delta_offset = 0, dq_offset = 0, counters_offset = 0, scheduler_offset = 0, total = 0;  // LSE at offset 0
  std::int64_t dq_rows = 0;  // rows per head of the dQ accumulator
  std::int64_t rows_pitch = 0;  // floats per head of LSE and D
  int query_blocks = 0;      // counters per (batch, head): ceil(seqlen_q / counter_block_rows)
};

inline BackwardWorkspaceLayout backward_workspace_layout(const Problem& problem, int padded_head_dim, int dq_row_padding,
                                                         int counter_block_rows, bool deterministic, const char* name,
                                                         int scheduler_ints = 0) {
  using Count = CheckedInt64;
  const auto align = [](Count bytes) { return (bytes + 255) / 256 * 256; };
  const Count rows = problem.total_rows_q(), heads = problem.heads_q, float_bytes = sizeof(float);
  const Count rows_pitch = (rows + Count(3) * problem.batch + 3) / 4 * 4;
  const Count delta_offset = align(rows_pitch * heads * float_bytes);
  const Count dq_offset = delta_offset + align(rows_pitch * heads * float_bytes);
  const Count dq_rows = rows + Count(dq_row_padding) * problem.batch;
  const Count counters_offset = dq_offset + align(dq_rows * heads * Count(padded_head_dim) * float_bytes);
  const Count query_blocks = (Count(problem.seqlen_q) + counter_block_rows - 1) / counter_block_rows;
  const Count counters = deterministic ? Count(problem.batch) * heads * query_blocks : Count(0);
  const Count scheduler_offset = counters_offset + align(counters * static_cast<std::int64_t>(sizeof(int)));
  const Count total = scheduler_offset + align(Count(scheduler_ints) * static_cast<std::int64_t>(sizeof(int)));
  const std::string offset = std::string(name) + ": workspace offset";
  BackwardWorkspaceLayout layout;
  layout.delta_offset = checked_size(delta_offset.value(), offset.c_str());
  layout.dq_offset = checked_size(dq_offset.value(), offset.c_str());
  layout.counters_offset = checked_size(counters_offset.value(), offset.c_str());
  layout.scheduler_offset = checked_size(scheduler_offset.value(), offset.c_str());
  layout.total = checked_size(total.value(), (std::string(name) + ": workspace bytes").c_str());
  layout.dq_rows = dq_rows.value();
  layout.rows_pitch = rows_pitch.value();
  layout.query_blocks = static_cast<int>(query_blocks.value());
  return layout;
}

}  // namespace flashlab::kernels
