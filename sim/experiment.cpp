#include "experiment.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>

#include "bounds.hpp"
#include "report.hpp"
#include "schedules.hpp"

namespace flashlab::sim {

namespace {

constexpr int kHeadDim = 128;                    // the N and M sweeps
constexpr int kSeqlensN[] = {1024, 2048, 4096, 8192, 16384};
constexpr int kSeqlenM = 4096;                   // the M sweep: d^2 <= M <= N d in elements
constexpr int kHeadDims[] = {32, 64, 128, 256};  // the d sweep, at N = 4096 and the machine's M
constexpr int kCrossoverSeqlen = 1024;

struct Series {
  std::string schedule, mask;
  bool in_m_sweep;
};
const Series kSeries[] = {
    {"standard", "none", true},          {"fa1", "none", true},          {"fa2", "none", true},
    {"fa2", "causal", true},             {"block_sparse", "sparse:0.25", true},
    {"memory_efficient", "none", true},  {"square_tiling", "none", true},
    {"standard_backward", "none", true}, {"fa1_backward", "none", true}, {"fa2_backward", "none", true},
    {"split_kv", "none", true},
};

std::string fmt(const char* format, double value) {
  char text[64];
  std::snprintf(text, sizeof text, format, value);
  return text;
}

}  // namespace

ExperimentResult run_experiment(const Machine& machine, std::ostream& out, BlockRule rule) {
  const auto start = std::chrono::steady_clock::now();
  ExperimentResult result;
  result.machine = machine;
  result.grid.dtype = machine.dtype;
  result.grid.block_rule = rule;
  const std::int64_t m_machine = machine.sram_bytes;
  // M from d^2 to N d elements at d = 128, N = 4096, in bytes of the machine's dtype.
  std::vector<std::int64_t> m_sweep;
  for (std::int64_t m = std::int64_t{kHeadDim} * kHeadDim; m <= std::int64_t{kSeqlenM} * kHeadDim; m *= 2) m_sweep.push_back(sram_bytes_of_elements(m, machine.dtype));

  std::vector<PointSpec> specs;
  for (const Series& s : kSeries) {
    for (int n : kSeqlensN) specs.push_back({s.schedule, s.mask, n, kHeadDim, m_machine});
    if (s.in_m_sweep) {
      for (std::int64_t m : m_sweep) {
        if (m != m_machine) specs.push_back({s.schedule, s.mask, kSeqlenM, kHeadDim, m});
      }
    }
    for (int d : kHeadDims) {
      if (d != kHeadDim) specs.push_back({s.schedule, s.mask, kSeqlenM, d, m_machine});
    }
  }
  // Saha-Ye crossover: FA2 and square tiling (and FA1) from M = d^2 / 8 to 8 d^2 at N = 1024.
  const std::int64_t d2 = std::int64_t{kHeadDim} * kHeadDim;
  std::vector<PointSpec> crossover_specs;
  for (std::int64_t m = d2 / 8; m <= 8 * d2; m *= 2) {
    for (const char* schedule : {"fa2", "square_tiling", "fa1"}) {
      crossover_specs.push_back({schedule, "none", kCrossoverSeqlen, kHeadDim, sram_bytes_of_elements(m, machine.dtype)});
    }
  }
  // A machine's M can make the tiling degenerate (1 x 1 tiles): refused before any point runs.
  require_points_within_limits(result.grid, specs);
  require_points_within_limits(result.grid, crossover_specs);

  for (const PointSpec& p : specs) {
    result.points.push_back(count_point(result.grid, p.schedule, p.seqlen, p.head_dim, p.sram_bytes, p.mask));
  }
  result.fits = fit_sweep(result.points);

  result.crossover_seqlen = kCrossoverSeqlen;
  result.crossover_head_dim = kHeadDim;
  double last_win = 0, first_loss = 0;
  for (std::int64_t m = d2 / 8; m <= 8 * d2; m *= 2) {
    CrossoverRow row;
    row.sram_bytes = sram_bytes_of_elements(m, machine.dtype);
    row.m_over_d2 = static_cast<double>(m) / static_cast<double>(d2);
    const SweepPoint fa2 = count_point(result.grid, "fa2", kCrossoverSeqlen, kHeadDim, row.sram_bytes, "none");
    const SweepPoint square = count_point(result.grid, "square_tiling", kCrossoverSeqlen, kHeadDim, row.sram_bytes, "none");
    const SweepPoint fa1 = count_point(result.grid, "fa1", kCrossoverSeqlen, kHeadDim, row.sram_bytes, "none");
    row.fa2_bytes = fa2.fits ? fa2.counters.hbm_bytes() : -1;
    row.square_bytes = square.fits ? square.counters.hbm_bytes() : -1;
    row.fa1_bytes = fa1.fits ? fa1.counters.hbm_bytes() : -1;
    if (row.square_bytes >= 0 && row.fa2_bytes >= 0) {
      if (row.square_bytes < row.fa2_bytes) last_win = row.m_over_d2;
      else if (first_loss == 0) first_loss = row.m_over_d2;
    }
    result.crossover.push_back(row);
  }
  result.crossover_m_over_d2 = last_win > 0 && first_loss > 0 ? std::sqrt(last_win * first_loss) : 0;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // --- the tables ---------------------------------------------------------------------------
  out << "FlashLab default experiment on " << machine.name << " (" << to_string(machine.dtype) << ", M = "
      << machine.sram_bytes << " B per thread block; blocks by the " << to_string(rule) << " rule)\n";
  out << "HBM traffic of one head (forward unless named), counted shape-only; fitted exponents of traffic "
         "[theory]:\n\n";
  char header[256];
  std::snprintf(header, sizeof header, "%-18s %-11s %10s %10s %10s   %-15s %-15s %-15s %s\n", "schedule", "mask", "N=1024",
                "N=4096", "N=16384", "in N", "in M", "in d", "roofline N=16384");
  out << header;
  for (const Series& s : kSeries) {
    std::map<int, const SweepPoint*> at_n;
    for (const SweepPoint& p : result.points) {
      if (p.schedule == s.schedule && p.mask == s.mask && p.head_dim == kHeadDim && p.sram_bytes == m_machine) at_n[p.seqlen] = &p;
    }
    auto traffic = [&](int n) {
      const SweepPoint* p = at_n.count(n) ? at_n[n] : nullptr;
      return p && p->fits ? human_bytes(static_cast<double>(p->counters.hbm_bytes())) : std::string("-");
    };
    auto exponent = [&](const std::string& variable) {
      for (const SweepFit& f : result.fits) {
        if (f.schedule != s.schedule || f.mask != s.mask || f.variable != variable) continue;
        const bool wanted = (variable == "N" && f.fixed["head_dim"] == kHeadDim && f.fixed["sram_bytes"] == m_machine) ||
                            (variable == "M" && f.fixed["seqlen"] == kSeqlenM && f.fixed["head_dim"] == kHeadDim) ||
                            (variable == "d" && f.fixed["seqlen"] == kSeqlenM && f.fixed["sram_bytes"] == m_machine);
        if (wanted) return fmt("%6.2f", f.exponent) + fmt(" [%5.2f]", f.theory);
      }
      return std::string("-");
    };
    std::string roof = "-";
    if (at_n.count(16384) && at_n[16384]->fits) {
      const Roofline r = roofline(at_n[16384]->counters, machine);
      roof = fmt("%.3g ms", r.seconds * 1e3) + " (" + r.bound_by + ")";
    }
    char line[320];
    std::snprintf(line, sizeof line, "%-18s %-11s %10s %10s %10s   %-15s %-15s %-15s %s\n", s.schedule.c_str(), s.mask.c_str(),
                  traffic(1024).c_str(), traffic(4096).c_str(), traffic(16384).c_str(), exponent("N").c_str(),
                  exponent("M").c_str(), exponent("d").c_str(), roof.c_str());
    out << line;
  }
  out << "\nN sweep at d = " << kHeadDim << " and the machine's M; M sweep at N = " << kSeqlenM << ", d = " << kHeadDim
      << ", M from d^2 to N d elements; d sweep at N = " << kSeqlenM << " and the machine's M.\n"
      << "Every point's blocks come from its own M, as flashlab run derives them; standard attention goes by\n"
         "row blocks (S read twice), so its working set fits M and its traffic stays Theta(N d + N^2).\n\n";

  out << "Saha-Ye crossover (N = " << kCrossoverSeqlen << ", d = " << kHeadDim
      << "): square tiling against FA2; the lower bound min(N^2 d / sqrt(M), N^2 d^2 / M) turns at M = d^2\n";
  std::snprintf(header, sizeof header, "  %10s %8s %12s %12s %12s  %s\n", "M (bytes)", "M / d^2", "FA1", "FA2", "square", "less traffic");
  out << header;
  for (const CrossoverRow& row : result.crossover) {
    auto b = [](std::int64_t v) { return v < 0 ? std::string("no fit") : human_bytes(static_cast<double>(v)); };
    char line[256];
    std::snprintf(line, sizeof line, "  %10lld %8.3g %12s %12s %12s  %s\n", static_cast<long long>(row.sram_bytes), row.m_over_d2,
                  b(row.fa1_bytes).c_str(), b(row.fa2_bytes).c_str(), b(row.square_bytes).c_str(),
                  row.square_bytes >= 0 && row.square_bytes < row.fa2_bytes ? "square tiling" : "FA2");
    out << line;
  }
  out << "  crossover at M ~ " << fmt("%.2g", result.crossover_m_over_d2) << " d^2 (theory: Theta(d^2))\n\n";
  out << result.points.size() + 3 * result.crossover.size() << " counts in " << fmt("%.2f", result.seconds) << " s\n";
  return result;
}

nlohmann::json experiment_to_json(const ExperimentResult& result, const std::string& command) {
  nlohmann::json json = sweep_to_json(result.grid, result.points, result.fits, &result.machine, command);
  json["format"] = "flashlab-experiment";
  nlohmann::json rows = nlohmann::json::array();
  for (const CrossoverRow& row : result.crossover) {
    rows.push_back({{"sram_bytes", row.sram_bytes}, {"m_over_d2", row.m_over_d2}, {"fa1_bytes", row.fa1_bytes},
                    {"fa2_bytes", row.fa2_bytes}, {"square_tiling_bytes", row.square_bytes}});
  }
  json["crossover"] = {{"seqlen", result.crossover_seqlen}, {"head_dim", result.crossover_head_dim}, {"rows", rows},
                       {"m_over_d2", result.crossover_m_over_d2}};
  json["seconds"] = result.seconds;
  return json;
}

namespace {

// The traffic a perfect cache would leave: every tensor read at most once and written at most once
// in full (each direction's bytes scaled down to the tensor's size, keeping its bytes per element).
double perfect_cache_bytes(const Counters& c, const Problem& p) {
  const double heads = static_cast<double>(p.batch) * p.heads_q, n = p.seqlen_q, d = p.head_dim;
  double total = 0;
  for (int i = 0; i < kTensorCount; ++i) {
    const TensorTraffic& t = c.tensor[i];
    const TensorId id = static_cast<TensorId>(i);
    const bool square = id == TensorId::S || id == TensorId::P || id == TensorId::dS || id == TensorId::dP || id == TensorId::A;
    const double size = heads * (square ? n * n : is_statistic(id) || id == TensorId::l || id == TensorId::m ? n : n * d);
    const auto once = [&](std::int64_t elements, std::int64_t bytes) {
      return elements == 0 ? 0.0 : std::min<double>(static_cast<double>(elements), size) * static_cast<double>(bytes) / static_cast<double>(elements);
    };
    total += once(t.hbm_read_elements, t.hbm_read_bytes) + once(t.hbm_write_elements, t.hbm_write_bytes);
  }
  return total;
}

// What one row of Figure 2 assumes, with the blocks it ran: the algorithms, the block rule, what
// is kept where, and the per-head count in closed form (N = 1024, d = 64, e = 2 bytes; Tr, Tc:
// query and key blocks; tests/sim/test_figure2.cpp holds every number to these formulas).
std::vector<std::string> figure2_assumptions(const std::string& forward, const BlockSizes& f, const BlockSizes& b,
                                             std::int64_t sram_bytes) {
  const std::string blocks = std::to_string(f.block_rows) + " x " + std::to_string(f.block_cols) + " forward, " +
                             std::to_string(b.block_rows) + " x " + std::to_string(b.block_cols) + " backward";
  const std::string every_access = "every global-memory access counted: no L2 or other cache between SRAM and HBM";
  if (forward == "standard") {
    return {"FA1 Algorithm 0 forward, Algorithm 3 backward from P (the residual pass that writes P is the forward's)",
            "blocks Br x Bc = " + blocks + ": d x d, the fitting rule of every entry point, in row blocks whose "
                "working set (three tiles) fits M = " + std::to_string(sram_bytes) + " B",
            "mask fused into S and no dropout kernel; a row spans several key blocks, so 14 N x N passes: 5 forward (S "
            "written once and read twice, for the row's max and sum and then for P; P written and read once) and 9 "
            "backward (P read three times, dP written once and read twice, dS written once and read twice)",
            "Q, K, V re-read once per query block of the forward; Q, K, V, dO once per block of the backward",
            every_access,
            "per head: forward e (2 + 2 Tr) N d + 5 e N^2 + 4 N; backward e (9 N^2 + (2 Tr + 2 Tc + 4) N d)"};
  }
  if (forward == "fa1") {
    return {"FA1 Algorithm 1 forward, Algorithm 4 backward",
            "blocks Br x Bc = " + blocks + ": the paper's shape (Bc = ceil(M / 4d), Br = min(Bc, d)) shrunk until the "
                "whole working set fits M = " + std::to_string(sram_bytes) + " B",
            "the running O, l, m (forward) and dQ (backward) in fp32 in HBM, read and written once per key block; dK, dV "
            "zeroed (line 5) and written (line 24)",
            every_access,
            "per head: forward e (Tc + 2) N d + (8 Tc + e) N d + 4 N (4 Tc + 3); backward (8 + e) N d + 6 e N d + "
            "(3 e + 8) Tc N d + 8 Tc N"};
  }
  return {"FA2 Algorithm 1 forward, Algorithm 2 backward (dQ read-modify-write in fp32 HBM, as the paper writes it)",
          "blocks Br x Bc = " + blocks + ": forward FA2's swapped shape (Br = ceil(M / 4d), Bc = min(Br, d)), backward "
              "K/V blocks outside with FA1's (Bc = ceil(M / 4d), Br = min(Bc, d)), each shrunk until the whole working set "
              "fits M = " + std::to_string(sram_bytes) + " B",
          every_access,
          "per head: forward e (2 + 2 Tr) N d + 4 N; backward (8 + e) N d + 6 e N d + 4 N + (2 e + 8) Tc N d "
          "+ 8 Tc N"};
}

}  // namespace

nlohmann::json run_figure2(const Machine& a100, std::ostream& out) {
  Problem problem;  // GPT-2 medium: seqlen 1024, head dim 64, 16 heads, batch 64, fp16
  problem.batch = 64;
  problem.heads_q = problem.heads_kv = 16;
  problem.seqlen_q = problem.seqlen_k = 1024;
  problem.head_dim = 64;
  problem.dtype = DType::fp16;
  struct Pair {
    const char* label;
    const char* forward;
    const char* backward;
    double paper_gb;
  };
  const Pair pairs[] = {{"standard attention", "standard", "standard_backward", 40.3},
                        {"FlashAttention (FA1)", "fa1", "fa1_backward", 4.4},
                        {"FlashAttention-2", "fa2", "fa2_backward", 0}};
  out << "FA1 Figure 2 (left): GPT-2 medium, N = 1024, d = 64, 16 heads, batch 64, fp16, forward + backward, "
      << a100.name << ", M = " << a100.sram_bytes << " B\n";
  char header[256];
  std::snprintf(header, sizeof header, "%-22s %10s %10s %10s %14s %10s %12s %12s %s\n", "", "forward", "backward", "total",
                "perfect cache", "paper", "GFLOPs", "roofline", "blocks (fwd; bwd)");
  out << header;
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::pair<std::string, std::vector<std::string>>> assumptions;
  for (const Pair& pair : pairs) {
    RunOptions options;
    options.sram_bytes = a100.sram_bytes;
    const RunResult forward = run_schedule(pair.forward, problem, options);
    const RunResult backward = run_schedule(pair.backward, problem, options);
    Counters total = forward.counters;
    total += backward.counters;
    const Roofline r = roofline(total, a100);
    const double gb = static_cast<double>(total.hbm_bytes()) / 1e9;
    char line[320];
    const double cached = perfect_cache_bytes(forward.counters, problem) + perfect_cache_bytes(backward.counters, problem);
    std::snprintf(line, sizeof line, "%-22s %9.2fG %9.2fG %9.2fG %13.2fG %10s %12.1f %9.2f ms %dx%d; %dx%d\n", pair.label,
                  static_cast<double>(forward.counters.hbm_bytes()) / 1e9, static_cast<double>(backward.counters.hbm_bytes()) / 1e9,
                  gb, cached / 1e9, pair.paper_gb > 0 ? fmt("%.1fG", pair.paper_gb).c_str() : "-",
                  static_cast<double>(total.matmul_flops) / 1e9, r.seconds * 1e3, forward.blocks.block_rows,
                  forward.blocks.block_cols, backward.blocks.block_rows, backward.blocks.block_cols);
    out << line;
    rows.push_back({{"attention", pair.label},
                    {"forward_schedule", pair.forward},
                    {"backward_schedule", pair.backward},
                    {"forward_hbm_bytes", forward.counters.hbm_bytes()},
                    {"backward_hbm_bytes", backward.counters.hbm_bytes()},
                    {"total_hbm_bytes", total.hbm_bytes()},
                    {"perfect_cache_bytes", cached},
                    {"paper_gb", pair.paper_gb},
                    {"matmul_flops", total.matmul_flops},
                    {"roofline", to_json(r)},
                    {"forward_blocks", to_json(forward.blocks)},
                    {"backward_blocks", to_json(backward.blocks)}});
    std::vector<std::string> assumed = figure2_assumptions(pair.forward, forward.blocks, backward.blocks, a100.sram_bytes);
    rows.back()["assumes"] = assumed;
    assumptions.emplace_back(pair.label, std::move(assumed));
  }
  for (const auto& [label, assumed] : assumptions) {
    out << label << " assumes:\n";
    for (const std::string& line : assumed) out << "  - " << line << "\n";
  }
  out << "perfect cache: every tensor read and written at most once in full (what an L2 that held every re-read would leave)\n"
      << "the paper measured DRAM traffic of its kernels and PyTorch's unfused pipeline; these count the schedules as "
         "stated above (see docs/simulator.md)\n"
      << "paper (FA1 Figure 2, A100): standard 40.3 GB, 66.6 GFLOPs, 41.7 ms; FlashAttention 4.4 GB, 75.2 GFLOPs, 7.3 ms"
         " (see docs/simulator.md for what matches and why)\n";
  return rows;
}

}  // namespace flashlab::sim
