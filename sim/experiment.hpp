// The README's default experiment and the FA1 Figure 2 reproduction, as library functions the
// CLI prints and the tests call.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "machines.hpp"
#include "sweep.hpp"

namespace flashlab::sim {

// One row of the Saha-Ye crossover table: FA2 against square tiling at one M.
struct CrossoverRow {
  std::int64_t sram_bytes = 0;
  double m_over_d2 = 0;  // M (elements) / d^2
  std::int64_t fa2_bytes = 0, square_bytes = 0, fa1_bytes = 0;
};

struct ExperimentResult {
  Machine machine;
  SweepGrid grid;  // dtype, batch, heads shared by every part
  std::vector<SweepPoint> points;
  std::vector<SweepFit> fits;
  int crossover_seqlen = 0, crossover_head_dim = 0;
  std::vector<CrossoverRow> crossover;
  double crossover_m_over_d2 = 0;  // where square tiling stops moving less than FA2 (geometric middle)
  double seconds = 0;
};

// Sweeps N (at the machine's M), M (at fixed N) and d (at the machine's M) for every schedule,
// fits the exponents, finds the Saha-Ye crossover, and prints the tables to `out`.
// rule: how every point's blocks are derived from its M (the sweep's, SweepGrid::block_rule).
ExperimentResult run_experiment(const Machine& machine, std::ostream& out, BlockRule rule = BlockRule::fitting);
nlohmann::json experiment_to_json(const ExperimentResult& result, const std::string& command);

// FA1 Figure 2 (left): GPT-2 medium (N = 1024, d = 64, 16 heads, batch 64), forward + backward,
// HBM reads and writes of standard attention against FlashAttention on an A100, next to the
// paper's 40.3 GB and 4.4 GB. Prints the table and returns it as JSON.
nlohmann::json run_figure2(const Machine& a100, std::ostream& out);

}  // namespace flashlab::sim
