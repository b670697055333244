// The exact counts every schedule must produce, in one place, as formulas of the problem
// (N, d, mask), the block sizes and the SRAM size M; and the rule that derives block sizes from M.
//
// These are written from the papers' algorithms, not from the code: the tests hold every counted
// run (data and shape-only) to them exactly, for sizes that divide and sizes that do not.
// Sums over query blocks appear where a mask makes blocks differ (causal, window, block-sparse);
// without a mask every sum collapses to the ceilings written in the comments.
//
// Units: elements and bytes; M in bytes; statistics (m, l, LSE, D) are fp32.
#pragma once

#include <cstdint>
#include <string_view>

#include "algorithms/problem.hpp"
#include "algorithms/tile_memory.hpp"
#include "schedules.hpp"

namespace flashlab::sim {

// The HBM traffic (per tensor, elements and bytes), tile transfers, matmul FLOPs and
// exponentials a schedule must count on a whole problem (every sequence and head; for backward
// passes with GQA/MQA the reduction of dK, dV over each group, whose row blocks depend on M).
// other_flops and sram_peak_bytes are left 0 (see working_set_bytes for the peak). Masks:
// none, causal (both alignments), sliding windows and block sparsity; softcap adds exponentials
// not counted here.
// kv_cache: split_kv's paged KV cache (08_split_kv_decode.hpp): per key block of a KV group, one
// int32 block-table entry per page it touches, and with whole-page reads the rest of those pages.
// group_reduction: backward passes with GQA/MQA, fp32 parts per query head then the reduction
// (fp32_partials), or one fp32 accumulator per KV head added into with atomics, zeroed before and
// converted after (in_place; FA1's line-5 zeroing and FA2's zeros for unseen key blocks go).
Counters closed_form(std::string_view schedule, const Problem& problem, const BlockSizes& blocks,
                     std::int64_t sram_bytes = 0, const PagedKvCache& kv_cache = {},
                     GroupReduction group_reduction = GroupReduction::fp32_partials);

// The SRAM a schedule holds at its peak on an unmasked problem with these block sizes, in bytes
// (a masked problem never needs more).
std::int64_t working_set_bytes(std::string_view schedule, const Problem& problem, const BlockSizes& blocks);

// The cost model of one head of sequence batch_index, for the run limits (algorithms/limits.hpp),
// upper bounds: the tile steps a shape-only run takes ((query block, key block) pairs and the
// passes over rows or keys; square tiling: per slice of d), and the HBM scratch (elements) a
// data run allocates beyond the problem's tensors (S and P of standard attention, A of square
// tiling, fp32 state and summaries of the others).
std::int64_t tile_steps(std::string_view schedule, const Problem& problem, int batch_index, const BlockSizes& blocks);
std::int64_t scratch_elements(std::string_view schedule, const Problem& problem, int batch_index, const BlockSizes& blocks);

// Block sizes from M (bytes): the paper's rule (FA1: Bc = ceil(M / 4d), Br = min(Bc, d); FA2
// swaps the roles of rows and columns; square tiling: B = floor(sqrt(M / 4)); M in elements),
// shrunk until working_set_bytes fits in M. Throws std::invalid_argument when even the smallest
// blocks do not fit (naming M and the smallest working set).
// With BlockRule::paper, the rule as written, unshrunk (its working set may exceed M); standard
// and memory_efficient have no paper rule and use the fitting one.
BlockSizes derive_blocks(std::string_view schedule, const Problem& problem, std::int64_t sram_bytes,
                         BlockRule rule = BlockRule::fitting);
// Whether the schedule has a paper rule that BlockRule::paper uses.
bool has_paper_block_rule(std::string_view schedule);

// The per-schedule pieces of the oracle above, named so that each registry entry
// (schedules.cpp) points at its own: the counts of one query head (and, for a schedule that
// shares K, V across a GQA group, of one KV head's K, V reads) and the cost model of the run
// limits. The oracle is written apart from algorithms/: nothing here calls a schedule. (The
// block-size rules and working sets are the schedules' own, beside them in algorithms/.)
struct ClosedFormHead;  // one head of one sequence in the papers' letters (closed_forms.cpp)
namespace oracle {
Counters standard_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters fa1_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters fa1_skipping_counts(const ClosedFormHead& h, const BlockSizes& b);  // fa1_skip, block_sparse
Counters fa2_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters fa1_backward_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters fa2_backward_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters fa2_backward_atomic_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters standard_backward_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters split_kv_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters split_kv_kv_head_counts(const ClosedFormHead& h, const BlockSizes& b, const PagedKvCache& cache);
Counters memory_efficient_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters square_tiling_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters ring_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters ring_kv_head_counts(const ClosedFormHead& h, const BlockSizes& b, const PagedKvCache& cache);
Counters ring_backward_counts(const ClosedFormHead& h, const BlockSizes& b);
Counters ring_backward_kv_head_counts(const ClosedFormHead& h, const BlockSizes& b, const PagedKvCache& cache);

std::int64_t block_pair_tile_steps(const ClosedFormHead& h, const BlockSizes& b);  // (Tr + 1)(Tc + 1)
std::int64_t split_kv_tile_steps(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t square_tiling_tile_steps(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t ring_tile_steps(const ClosedFormHead& h, const BlockSizes& b);

std::int64_t no_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t standard_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t standard_backward_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t square_tiling_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t fa1_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t fa1_backward_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t fa2_backward_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t split_kv_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t memory_efficient_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t ring_scratch(const ClosedFormHead& h, const BlockSizes& b);
std::int64_t ring_backward_scratch(const ClosedFormHead& h, const BlockSizes& b);

}  // namespace oracle

}  // namespace flashlab::sim
