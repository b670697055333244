// Sweeps: a grid of schedules x N x d x M x mask, each point counted shape-only, with its bound,
// its roofline time on a machine, and the log-log exponents fitted along N, M and d.
//
// Output schema (version 1; the JSON is what scripts/plot_sweep.py reads):
//   {"format": "flashlab-sweep", "version": 1, "command": "<the exact command line>",
//    "machine": <preset> | null, "dtype": "bf16", "batch": 1, "heads": 1, "block_rule": "fitting",
//    "points": [{"schedule", "mask", "seqlen", "head_dim", "sram_bytes",
//                "status": "ok" | "does_not_fit", "reason" (does_not_fit only),
//                "block_rows", "block_cols", "block_rule", "arena_bytes", "kept_fraction",
//                "hbm_bytes", "hbm_read_bytes", "hbm_write_bytes", "hbm_elements",
//                "matmul_flops", "exponentials", "other_flops", "sram_peak_bytes",
//                "bound": {"formula", "source", "elements"}, "lower_bound_elements",
//                "counted_over_bound", "roofline": {...} (with a machine), "seconds"}],
//    "fits": [{"schedule", "mask", "variable": "N" | "M" | "d", "fixed": {...},
//              "points", "exponent", "theory", "bound_slope"}]}   theory: the asymptotic
//              exponent in the regime of the group's middle point; bound_slope: the slope of the
//              schedule's Theta bound (bounds.hpp) fitted over the same points
// The JSON Schema of this output: docs/schemas/sweep.schema.json.
// CSV: a single header row, then one row per point, the scalar columns above in that order (no
// comment lines, so pandas and csv.DictReader read it with default options; the provenance, the
// format and the command, is in the JSON). Text fields are quoted where they hold a comma or quote.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bounds.hpp"
#include "machines.hpp"
#include "schedules.hpp"

namespace flashlab::sim {

// "none", "causal", "window:W" (causal with a left window of W keys), "sparse:S" (block
// sparsity with a fraction S in (0, 1] of the tiles kept, at the tile granularity).
struct MaskSpec {
  std::string text = "none";
  bool causal = false;
  int window_left = -1;
  double kept_fraction = 1;  // < 1: block-sparse
};
MaskSpec parse_mask(const std::string& text);  // throws std::invalid_argument

struct SweepGrid {
  std::vector<std::string> schedules;
  std::vector<int> seqlens;  // N = seqlen_q = seqlen_k
  std::vector<int> head_dims;
  std::vector<std::int64_t> sram_bytes;
  std::vector<std::string> masks{"none"};
  DType dtype = DType::bf16;
  int batch = 1;
  int heads = 1;
  BlockRule block_rule = BlockRule::fitting;  // how every point's blocks are derived from its M
  void validate() const;  // throws std::invalid_argument naming the bad entry
};

struct SweepPoint {
  std::string schedule, mask;
  int seqlen = 0, head_dim = 0;
  std::int64_t sram_bytes = 0;
  DType dtype = DType::bf16;
  bool fits = true;
  std::string block_rule;       // "fitting" or "paper" (schedules.hpp: BlockRule), as the run reports it
  std::int64_t arena_bytes = 0; // the run's SRAM arena: M, or the paper rule's working set
  std::string reason;  // why it does not fit
  BlockSizes blocks;
  double kept_fraction = 1;
  Counters counters;
  Bound bound;
  double lower_bound_elements = 0;
  double seconds = 0;  // wall time of the count
};

struct SweepFit {
  std::string schedule, mask, variable;  // variable: "N", "M" or "d"
  nlohmann::json fixed;                  // the other two variables' values
  int points = 0;
  double exponent = 0;     // fitted to the counted HBM bytes
  double theory = 0;       // the asymptotic exponent (bounds.hpp: theory_exponents) in the group's regime
  double bound_slope = 0;  // the slope of the schedule's Theta bound over the same points
};

// The problem of one grid point (mask applied; block sparsity at the given tile granularity).
Problem sweep_problem(const SweepGrid& grid, int seqlen, int head_dim, const MaskSpec& mask, const BlockSizes& tiles);

// Counts one point shape-only. A point whose run is past the limits (algorithms/limits.hpp)
// throws std::invalid_argument naming the point, the quantity and the limit, before it runs.
SweepPoint count_point(const SweepGrid& grid, const std::string& schedule, int seqlen, int head_dim, std::int64_t sram_bytes,
                       const std::string& mask);

// One point of a grid, not yet counted.
struct PointSpec {
  std::string schedule, mask;
  int seqlen = 0, head_dim = 0;
  std::int64_t sram_bytes = 0;
};
std::vector<PointSpec> grid_points(const SweepGrid& grid);  // in run_sweep's order
// Holds every point to the limits first, so that a sweep is refused before any work, not
// part-way (run_sweep and the experiment call it).
void require_points_within_limits(const SweepGrid& grid, const std::vector<PointSpec>& points);

// progress(done, total) is called once per counted point, from one thread at a time, with done
// increasing by one each call.
using Progress = std::function<void(std::size_t done, std::size_t total)>;

// Parallel counting: 1 <= jobs <= kMaxSweepJobs threads. Points are independent, so the result
// is the serial one, in grid order, whatever `jobs` is (only each point's wall time differs). A
// point that throws stops the count; the exception rethrown is the first point's in grid order.
constexpr int kMaxSweepJobs = 256;
void require_valid_jobs(int jobs);  // throws std::invalid_argument naming the range
std::vector<SweepPoint> count_points(const SweepGrid& grid, const std::vector<PointSpec>& specs, int jobs = 1,
                                     const Progress& progress = {});
std::vector<SweepPoint> run_sweep(const SweepGrid& grid, const Progress& progress = {}, int jobs = 1);

// Fits along each variable where >= 3 points differ only in it.
std::vector<SweepFit> fit_sweep(const std::vector<SweepPoint>& points);

nlohmann::json sweep_to_json(const SweepGrid& grid, const std::vector<SweepPoint>& points, const std::vector<SweepFit>& fits,
                             const Machine* machine, const std::string& command);
std::string sweep_to_csv(const std::vector<SweepPoint>& points, const Machine* machine);

}  // namespace flashlab::sim

namespace flashlab::sim {
// A table of fitted exponents next to the theory's.
void print_fits(std::ostream& out, const std::vector<SweepFit>& fits);
}  // namespace flashlab::sim
