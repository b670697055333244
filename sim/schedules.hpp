// The schedule registry: every schedule of algorithms/ by name, runnable on any problem with
// either memory model, an SRAM capacity, explicit or derived block sizes, and an optional trace.
//
// API (stable; the CLI, the visualizer, the notebooks and the tests all go through it):
//
//   const std::vector<ScheduleInfo>& schedules();          // every registered schedule, in
//                                                          // learning order
//   const ScheduleInfo& find_schedule(std::string_view);   // throws std::invalid_argument naming
//                                                          // the unknown name and the known ones
//   RunResult run_schedule(std::string_view name, const Problem&, const RunOptions&);
//   RunResult run_schedule(std::string_view name, const Problem&, const RunOptions&,
//                          AttentionTensors& tensors);     // data runs on the caller's tensors
//
// Units: the SRAM capacity M is in bytes (RunOptions::sram_bytes); tiles hold the problem's
// dtype (statistics m, l, LSE, D in fp32), so M / element_bytes(dtype) is M in elements, the
// unit of the papers' formulas. Block sizes are in rows (query rows Br, keys Bc).
//
// Memory models:
//   MemoryKind::data  - DataMemory: the schedule runs on real values (inputs drawn from
//                       RunOptions::seed unless the caller passes tensors); every head is run.
//                       Backward passes first get O and LSE from an FA2 forward pass (not
//                       counted), written into the tensors; caller tensors need dO, dQ, dK, dV.
//   MemoryKind::shape - ShapeMemory: shapes only, O(number of tiles). Heads that must count
//                       the same (same sequence lengths, same ALiBi on/off) are run once and
//                       multiplied, so a shape run costs one head per distinct class.
// Both return identical Counters for the same problem (a test holds them to it).
//
// Limits: a run whose work or memory (RunCost) is past algorithms/limits.hpp is refused before it
// starts, with std::invalid_argument naming the quantity and the limit; a count that would leave
// int64 is refused with SizeOverflow (checked_math.hpp) naming the problem, never wrapped.
//
// Block sizes: RunOptions::blocks when given (M then only bounds the arena; 0 = unbounded),
// else derived from M by the schedule's rule (closed_forms.hpp: derive_blocks), which is the
// paper's rule shrunk until the schedule's working set fits in M. M below the smallest working
// set, an unknown schedule, a bad problem: std::invalid_argument naming the input and the range.
// A schedule that still exceeds the arena throws SramOverflow (tile_memory.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "algorithms/12_ring_attention.hpp"
#include "algorithms/paged_kv_cache.hpp"
#include "algorithms/problem.hpp"
#include "algorithms/pseudocode.hpp"
#include "algorithms/run_backward.hpp"
#include "algorithms/tensors.hpp"
#include "algorithms/tile_memory.hpp"

namespace flashlab::sim {

struct ClosedFormHead;  // closed_forms.hpp
struct BoundInputs;     // bounds.hpp
struct Exponents;       // bounds.hpp

enum class MemoryKind { data, shape };
const char* to_string(MemoryKind kind);
MemoryKind memory_kind_from_string(const std::string& name);  // "data" or "shape"

// Block sizes of a tiled schedule, in rows. 0 = not given (derive from M).
struct BlockSizes {
  int block_rows = 0;  // Br: query rows per block (square tiling: the tile side B)
  int block_cols = 0;  // Bc: keys per block (memory-efficient: keys per chunk)
  int num_splits = 0;  // split_kv only: KV chunks (0: 4); kept when the other two are derived
  // ring, ring_backward only (the sequence split over devices, 12_ring_attention.hpp); kept when
  // the block sizes are derived: the ring's devices P (0: 4) and which positions each holds.
  int devices = 0;
  RingOrdering ordering = RingOrdering::zigzag;
  bool given() const { return block_rows > 0 || block_cols > 0; }
  bool operator==(const BlockSizes&) const = default;
};

// How block sizes are derived from M when none are given (closed_forms.hpp: derive_blocks):
//   fitting - the paper's shape, shrunk until the schedule's whole working set fits in M;
//   paper   - the paper's rule as written (FA1 Algorithm 1 line 1: Bc = ceil(M / 4d),
//             Br = min(Bc, d); FA2 swaps rows and columns; Saha-Ye: B = floor(sqrt(M / 4))),
//             whose own accounting gives M/4 to each of Q_i, K_j, V_j, O_i and nothing to S, P
//             or the statistics; the run's arena then grows to the working set it really holds.
//             Schedules without a paper rule (standard, memory_efficient) use the fitting one.
enum class BlockRule { fitting, paper };
const char* to_string(BlockRule rule);
BlockRule block_rule_from_string(const std::string& name);  // "fitting" or "paper"

struct RunOptions {
  MemoryKind memory = MemoryKind::shape;
  BlockRule block_rule = BlockRule::fitting;  // derived blocks only
  std::int64_t sram_bytes = 0;   // M in bytes: the arena capacity (0: unbounded; then blocks must be given)
  BlockSizes blocks;             // explicit block sizes; not given: derived from sram_bytes
  TraceSink* trace = nullptr;    // receives the events of every head that is run
  std::uint64_t seed = 1;        // data runs without caller tensors: the inputs' seed
  bool every_head = false;       // shape runs: run every head instead of one per class
  PagedKvCache kv_cache;         // split_kv only: the KV cache's pages (page_size 0: contiguous)
  // Backward passes with GQA/MQA: how a group's dK, dV are combined (run_backward.hpp).
  GroupReduction group_reduction = GroupReduction::fp32_partials;
};

struct RunResult {
  std::string schedule;
  BlockSizes blocks;                // the block sizes used
  std::string block_rule;           // how: "given", "fitting" or "paper" (BlockRule)
  std::int64_t arena_bytes = 0;     // the SRAM arena the run had: M, or the paper rule's working set
  Counters counters;                // summed over every (sequence, head) of the problem
  std::int64_t heads_total = 0;     // (sequence, query head) pairs in the problem
  std::int64_t heads_run = 0;       // of those, actually executed (the rest multiplied)
  AttentionTensors tensors;         // data runs without caller tensors: inputs and outputs
};

// What a schedule needs and computes, for printers, the CLI and the oracle check.
enum class Pass { forward, backward, decode };

// The loop whose iterations are independent: what one thread block of a GPU kernel runs (FA2
// Section 3.2: the forward's query blocks; FA2 Algorithm 2: the backward's key blocks), in the
// lines of the schedule's pseudocode. An iteration begins at a mark of `start_line` and ends at
// a mark of `end_line` (one that comes with no start since the previous end, e.g. a key block no
// query sees, is an iteration of its own); marks outside [first_line, last_line] are outside the
// loop (the backward's D and dQ conversion: kernels of their own). All 0: none besides the heads
// (FA1: one thread block per head). The three-level model (sim/hierarchy.hpp) splits a head's
// events into thread blocks by it.
struct ParallelLoop {
  int first_line = 0, last_line = 0, start_line = 0, end_line = 0;
  bool exists() const { return first_line > 0; }
};

struct ScheduleInfo {
  std::string name;         // registry key: "fa2"
  std::string source;       // "algorithms/04_fa2_forward.hpp"
  std::string paper;        // "FA2 Algorithm 1"
  std::string description;  // one line
  Pass pass = Pass::forward;
  bool tiled = true;        // false: Theta(N d + N^2) at any block size (standard); derived like the rest
  // GQA/MQA: the query heads of one KV head run as one unit that reads K and V once (packed
  // query heads, as decoding kernels do): split_kv. The others read K, V once per query head.
  bool shares_kv_in_group = false;
  // One block side B = Br = Bc (square tiling, which also slices d and dv by B); the others two.
  bool one_sided = false;
  // Without a mask, the counts depend on Bc only through ceil(N_k / Bc) (search.hpp); false when
  // key blocks restart at every KV chunk (split_kv) or block pair (ring).
  bool key_block_count_decides = true;
  // The sequence is split over devices (BlockSizes::devices, ordering): ring, ring_backward.
  bool splits_over_devices = false;
  // What the schedule cannot run, or "" (null: it runs every valid problem); run_schedule and
  // closed_form refuse such a problem with std::invalid_argument carrying this text.
  std::string (*unsupported)(const Problem&) = nullptr;

  // The schedule's module: every pointer is set by its registry entry (schedules.cpp), and the
  // public functions of closed_forms.hpp, bounds.hpp and search.hpp look them up by name.
  // Block sizes from M (closed_forms.hpp: derive_blocks), the schedule's own rule from its file in
  // algorithms/: the paper's tile side for M elements (the fitting rule's largest side), and the
  // blocks of a side; and its working set there.
  std::int64_t (*paper_block_side)(std::int64_t m_elements, std::int64_t head_dim) = nullptr;
  BlockSizes (*blocks_of_side)(int side, int head_dim) = nullptr;
  bool has_paper_block_rule = true;  // false: BlockRule::paper uses the fitting rule
  // The oracle (closed_forms.hpp, namespace oracle): the counts of one query head; for
  // shares_kv_in_group, also those of one KV head (its K, V reads; null otherwise).
  Counters (*head_counts)(const ClosedFormHead&, const BlockSizes&) = nullptr;
  Counters (*kv_head_counts)(const ClosedFormHead&, const BlockSizes&, const PagedKvCache&) = nullptr;
  std::int64_t (*working_set_bytes)(const Problem&, const BlockSizes&) = nullptr;
  std::int64_t (*tile_steps)(const ClosedFormHead&, const BlockSizes&) = nullptr;
  std::int64_t (*scratch_elements)(const ClosedFormHead&, const BlockSizes&) = nullptr;
  // The upper bound (bounds.hpp): its formula, where it is proved, its value, and the exponents
  // of N, M, d it predicts in the regime of M elements.
  const char* bound_formula = "";
  const char* bound_source = "";
  double (*bound)(const BoundInputs&) = nullptr;
  Exponents (*theory_exponents)(double m_elements, double head_dim) = nullptr;
  // Its pseudocode (algorithms/pseudocode.hpp), from its file in algorithms/; the visualizer renders it.
  const Pseudocode& (*pseudocode)() = nullptr;
  // The accumulators a tile holds at once (search.hpp: accumulator_elements), for the register budget.
  std::int64_t (*accumulator_elements)(const Problem&, const BlockSizes&) = nullptr;
  ParallelLoop parallel_loop = {};

  // Internal: the schedule for one head, per memory model (set by the registry).
  struct HeadCall;
  void (*run_data)(DataMemory&, const HeadCall&) = nullptr;
  void (*run_shape)(ShapeMemory&, const HeadCall&) = nullptr;
};

struct ScheduleInfo::HeadCall {
  const HeadProblem& head;
  const BlockSizes& blocks;
  const HeadTensors& x;
  bool with_data;
  // shares_kv_in_group schedules: every query head of the KV group (head, x are the first).
  std::span<const HeadProblem> group_heads = {};
  std::span<const HeadTensors> group_x = {};
  PagedKvCache kv_cache = {};  // split_kv: the KV cache's layout (RunOptions::kv_cache)
};

const std::vector<ScheduleInfo>& schedules();
const ScheduleInfo& find_schedule(std::string_view name);
// Throws std::invalid_argument with the schedule's own refusal when it cannot run the problem.
void require_supported(const ScheduleInfo& info, const Problem& problem);
// The ring's tiling from block sizes (devices 0: 4).
RingTiling ring_tiling(const BlockSizes& blocks);
std::string schedule_names(const char* separator = ", ");

RunResult run_schedule(std::string_view name, const Problem& problem, const RunOptions& options);
RunResult run_schedule(std::string_view name, const Problem& problem, const RunOptions& options,
                       AttentionTensors& tensors);

// What a run takes, known before it starts (the limits: algorithms/limits.hpp). Shape runs: the
// tile steps of the units run (closed_forms.hpp: tile_steps). Data runs: tile steps of every
// head, the host memory of the problem's tensors (unless the caller's), the HBM scratch and the
// SRAM tiles, and the multiply-adds of the score and output products.
struct RunCost {
  std::int64_t tile_steps = 0;
  std::int64_t data_bytes = 0;
  std::int64_t multiply_adds = 0;
};
RunCost run_cost(std::string_view name, const Problem& problem, const RunOptions& options, bool caller_tensors = false);
// Throws std::invalid_argument naming the schedule, the problem, the quantity and its limit when
// a cost is past its limit. run_schedule calls it before any work; a caller that adds work of
// its own (the command line's oracle check) adds it to the cost and calls it first.
void require_within_limits(std::string_view name, const Problem& problem, const RunOptions& options, const RunCost& cost);

// Counters multiplied by a head count (traffic and FLOPs scale; the SRAM peak does not).
Counters scaled(const Counters& counters, std::int64_t factor);

// Inputs for data runs: standard normal Q, K, V (and dO for backward passes) rounded to the
// dtype; outputs NaN until a schedule writes them.
AttentionTensors random_tensors(const Problem& problem, std::uint64_t seed, bool with_backward);

}  // namespace flashlab::sim
