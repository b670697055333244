// Mapping search: the block sizes (Br, Bc) of a schedule that minimise its HBM traffic or its
// predicted time on one problem under hardware constraints, with the Pareto front of traffic
// (or time) against the SRAM the tiling holds, and where the block rules land on it.
//
// The papers' rules (FA1 Algorithm 1 line 1, FA2 Algorithm 1, Saha-Ye Algorithm 1) split M
// evenly between Q, K, V and O tiles; the search asks which tiling of the same M is cheapest
// under the schedule's own working set (closed_forms.hpp: working_set_bytes).
//
// How a candidate is costed: by the closed forms (closed_forms.hpp: closed_form), which the tests
// hold equal to counted runs, so no schedule runs per candidate. The chosen tiling is then run
// once through the real schedule (run_schedule, explicit blocks, shape memory, the arena bounded
// by M) and its counters compared with the closed form, tensor by tensor.
//
// The search space (SearchConstraints):
//   - Br and Bc multiples of multiple_of (16 for tensor-core tiles), at most max_rows/max_cols,
//     never past the smallest multiple that covers the sequence (a larger block is the same);
//   - the working set within M (the shared-memory budget);
//   - optionally a register budget: the fp32 accumulator tiles the inner loop updates
//     (accumulator_elements) within threads_per_block x registers_per_thread elements;
//   - square: Br = Bc (square_tiling has one side B always);
//   - the loop order: a schedule fixes its loop order (fa1: key blocks outer, fa2: query blocks
//     outer), so choosing the order means searching several schedules of one pass together.
// On a problem without masks, sparsity or varlen, every closed form depends on a block size only
// through its block count ceil(N / B) (square tiling: through ceil(N / B), ceil(d / B)) and the
// working set grows with B, so only the smallest block of each count is costed (exact: a test
// compares with the exhaustive search). Masked problems cost every candidate.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algorithms/problem.hpp"
#include "machines.hpp"
#include "schedules.hpp"

namespace flashlab::sim {

// hbm_bytes: the closed form's HBM bytes; time: its roofline time on a machine (machines.hpp;
// the closed forms carry no other FLOPs, so the roofline's other term is left out).
enum class SearchObjective { hbm_bytes, time };
const char* to_string(SearchObjective objective);
SearchObjective search_objective_from_string(const std::string& name);  // "hbm" or "time"

struct SearchConstraints {
  std::int64_t sram_bytes = 0;  // M: the working set's budget in bytes (required, >= 1)
  int multiple_of = 1;          // Br, Bc multiples of this
  int max_rows = 0;             // Br at most this (0: no limit beyond the sequence)
  int max_cols = 0;             // Bc at most this (0: no limit beyond the sequence)
  bool square = false;          // Br = Bc
  int registers_per_thread = 0; // fp32 accumulator elements per thread (0: no register budget)
  int threads_per_block = 128;  // the threads that share the accumulators
  int num_splits = 0;           // split_kv: KV chunks (0: 4), as in BlockSizes
};

// The closed-form tile steps (closed_forms.hpp: tile_steps) a search spends at most, summed over
// the tilings it costs (a few seconds). Past it, on a problem of uniform blocks, tilings are
// costed in order of a lower bound and pruned by it; otherwise the coarsest first. Tilings the
// budget leaves out are counted, and the result says whether they could have mattered.
inline constexpr std::int64_t kMaxSearchTileSteps = std::int64_t{1} << 26;

struct SearchOptions {
  std::vector<std::string> schedules;  // one, or several of the same pass (loop orders compared)
  SearchObjective objective = SearchObjective::hbm_bytes;
  SearchConstraints constraints;
  const Machine* machine = nullptr;    // the roofline's rates; required for the time objective
  bool exhaustive = false;             // cost every candidate even where block counts suffice
  bool verify = true;                  // run the best tiling through the real schedule
  std::int64_t max_tile_steps = kMaxSearchTileSteps;  // closed-form work budget (see below)
};

struct SearchCandidate {
  std::string schedule;
  BlockSizes blocks;
  std::int64_t hbm_bytes = 0;
  std::int64_t working_set_bytes = 0;
  std::int64_t accumulator_elements = 0;
  double seconds = 0;    // roofline of the closed form (0 without a machine)
  std::string bound_by;  // the roofline's limit ("" without a machine)
  double objective = 0;  // hbm_bytes or seconds
};

// A block rule's tiling (closed_forms.hpp: derive_blocks) placed against the search.
struct RuleTiling {
  std::string schedule;
  std::string rule;             // "fitting" or "paper"
  SearchCandidate tiling;
  bool within_constraints = false;  // a candidate the search could pick (multiples, M, registers)
  std::int64_t rank = 0;        // 1 + the candidates with a strictly better objective
  bool on_front = false;        // no front point is at least as good in both and better in one
  double ratio_to_best = 0;     // its objective / the best's
};

struct SearchVerification {
  bool done = false;
  bool closed_form_equal = false;  // the run's counters equal the closed form, per tensor
  std::int64_t hbm_bytes = 0;      // counted by the run
  std::int64_t arena_bytes = 0;    // the arena it ran in (M)
  std::int64_t sram_peak_bytes = 0;
  double seconds = 0;              // wall time of the run
};

struct SearchResult {
  Problem problem;
  SearchOptions options;             // machine: not kept (see machine_key)
  std::string machine_key;
  std::int64_t candidates_total = 0;   // tilings within the constraints
  std::int64_t candidates_costed = 0;  // of those, costed by a closed form
  std::int64_t tile_steps_total = 0;   // the closed-form work of costing every candidate
  std::int64_t candidates_pruned = 0;  // not costed: a bound proves them neither best nor on the front
  std::int64_t candidates_skipped = 0; // not costed: past the budget of closed-form work
  bool best_exact = true;              // no skipped tiling could beat the best
  bool front_complete = true;          // no skipped tiling could be on the front
  SearchCandidate best;
  std::vector<SearchCandidate> front;  // Pareto front, working set ascending, objective descending
  std::vector<RuleTiling> rules;       // per schedule: the fitting rule, then the paper rule where it has one
  SearchVerification verification;
  double search_seconds = 0;           // wall time of the search (costing, front, rules)
};

// The accumulator tiles of the inner loop, fp32 elements (the register model): the score tile
// and the output accumulator (S_ij and O_i: forward passes; S_ij and dK_j, dV_j: backward
// passes; S_ij: standard attention; square tiling: S_ij and O_ic), with r = min(Br, Nq),
// c = min(Bc, Nk).
std::int64_t accumulator_elements(const std::string& schedule, const Problem& problem, const BlockSizes& blocks);
// Per schedule kind, for the registry entries: standard attention (S_ij), square tiling (S_ij and
// a B-wide slice of O), the tiled backward passes (S_ij; dK_j, dV_j), the tiled forward ones (S_ij; O_i).
std::int64_t standard_accumulator_elements(const Problem& problem, const BlockSizes& blocks);
std::int64_t square_tiling_accumulator_elements(const Problem& problem, const BlockSizes& blocks);
std::int64_t backward_accumulator_elements(const Problem& problem, const BlockSizes& blocks);
std::int64_t forward_accumulator_elements(const Problem& problem, const BlockSizes& blocks);

// Throws std::invalid_argument naming the input and the allowed range: an unknown schedule,
// schedules of different passes, constraints out of range, the time objective without a machine,
// or no tiling within the constraints.
SearchResult search_tilings(const Problem& problem, const SearchOptions& options);
// The input checks of search_tilings alone (the command line's checks-only mode).
void validate_search(const Problem& problem, const SearchOptions& options);


// Printers. The JSON follows docs/schemas/search.schema.json ("format": "flashlab-search").
nlohmann::json to_json(const SearchCandidate& candidate);
nlohmann::json search_to_json(const SearchResult& result, const std::string& command);
void print_search(std::ostream& out, const SearchResult& result, std::size_t max_front_rows = 24);

}  // namespace flashlab::sim
