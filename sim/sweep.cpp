#include "sweep.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "algorithms/for_each_unit.hpp"
#include "algorithms/limits.hpp"
#include "closed_forms.hpp"
#include "decimal.hpp"
#include "report.hpp"

namespace flashlab::sim {

MaskSpec parse_mask(const std::string& text) {
  MaskSpec mask;
  mask.text = text;
  const auto colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string value = colon == std::string::npos ? "" : text.substr(colon + 1);
  auto bad = [&]() {
    return std::invalid_argument("mask '" + text + "' is not understood; allowed: none, causal, window:W (W >= 0 keys), sparse:S (0 < S <= 1)");
  };
  if (kind == "none" && value.empty()) return mask;
  if (kind == "causal" && value.empty()) return mask.causal = true, mask;
  if (kind == "window" && !value.empty()) {
    mask.causal = true;
    mask.window_left = static_cast<int>(parse_decimal(value, "mask " + text + ": window W", 0, kMaxSequenceLength));
    return mask;
  }
  if (kind == "sparse" && !value.empty()) {
    mask.kept_fraction = parse_decimal_real(value, "mask " + text + ": kept fraction S",
                                            std::numeric_limits<double>::denorm_min(), 1.0, "0 < S <= 1");
    return mask;
  }
  throw bad();
}

void SweepGrid::validate() const {
  if (schedules.empty() || seqlens.empty() || head_dims.empty() || sram_bytes.empty() || masks.empty()) {
    throw std::invalid_argument("sweep grid: schedules, seqlens, head dims, SRAM sizes and masks must each have >= 1 entry");
  }
  for (const std::string& name : schedules) find_schedule(name);
  for (int n : seqlens) {
    if (n < 1 || n > kMaxSweepSeqlen) {
      throw std::invalid_argument("seqlen " + std::to_string(n) + " is out of range; allowed: [1, " +
                                  std::to_string(kMaxSweepSeqlen) + "]");
    }
  }
  for (int d : head_dims) {
    if (d < 1 || d > kMaxSweepHeadDim) {
      throw std::invalid_argument("head_dim " + std::to_string(d) + " is out of range; allowed: [1, " +
                                  std::to_string(kMaxSweepHeadDim) + "]");
    }
  }
  for (std::int64_t m : sram_bytes) {
    if (m < kMinSweepSramBytes || m > kMaxSramBytes) {
      throw std::invalid_argument("SRAM size " + std::to_string(m) + " B is out of range; allowed: [" +
                                  std::to_string(kMinSweepSramBytes) + ", " + std::to_string(kMaxSramBytes) + "] B");
    }
  }
  for (const std::string& mask : masks) parse_mask(mask);
  if (batch < 1 || heads < 1) throw std::invalid_argument("batch and heads: allowed >= 1");
}

Problem sweep_problem(const SweepGrid& grid, int seqlen, int head_dim, const MaskSpec& mask, const BlockSizes& tiles) {
  Problem p;
  p.batch = grid.batch;
  p.heads_q = p.heads_kv = grid.heads;
  p.seqlen_q = p.seqlen_k = seqlen;
  p.head_dim = head_dim;
  p.dtype = grid.dtype;
  p.mask.causal = mask.causal;
  p.mask.window_left = mask.window_left >= 0 ? std::min(mask.window_left, seqlen) : -1;
  if (mask.kept_fraction < 1 && tiles.block_rows > 0) {
    // Kept tiles spread evenly: tile (i, j) is kept iff the fraction's running count steps up at
    // its position in a fixed permutation, so every row of tiles keeps about the same share.
    BlockSparsity& s = p.block_sparsity;
    s.block_rows = tiles.block_rows;
    s.block_cols = tiles.block_cols;
    s.row_blocks = (seqlen + tiles.block_rows - 1) / tiles.block_rows;
    s.col_blocks = (seqlen + tiles.block_cols - 1) / tiles.block_cols;
    s.keep.assign(static_cast<std::size_t>(s.row_blocks) * s.col_blocks, 0);
    for (int i = 0; i < s.row_blocks; ++i) {
      for (int j = 0; j < s.col_blocks; ++j) {
        const int k = (j + 7 * i) % s.col_blocks;  // rotate rows so columns are shared evenly
        const auto before = static_cast<long long>(std::floor(k * mask.kept_fraction));
        const auto after = static_cast<long long>(std::floor((k + 1) * mask.kept_fraction));
        s.keep[static_cast<std::size_t>(i) * s.col_blocks + j] = after > before;
      }
    }
  }
  return p;
}

namespace {

// A point before it is counted: its blocks, its problem and its run, the run's cost held to the
// limits (algorithms/limits.hpp) before the block-sparsity pattern (one entry per tile) is built.
struct PointPlan {
  SweepPoint point;
  Problem problem;
  RunOptions options;
};

PointPlan plan_point(const SweepGrid& grid, const std::string& schedule, int seqlen, int head_dim, std::int64_t sram_bytes,
                     const std::string& mask_text, bool with_pattern) {
  PointPlan plan;
  SweepPoint& point = plan.point;
  point.schedule = schedule;
  point.mask = mask_text;
  point.seqlen = seqlen;
  point.head_dim = head_dim;
  point.sram_bytes = sram_bytes;
  point.dtype = grid.dtype;
  const MaskSpec mask = parse_mask(mask_text);
  plan.problem = sweep_problem(grid, seqlen, head_dim, mask, {});
  // One policy for every entry point (run, sweep, experiment, the visualizer, flashlab.sim):
  // the blocks the schedule's rule derives from M, in an arena of M bytes.
  try {
    point.blocks = derive_blocks(schedule, plan.problem, sram_bytes, grid.block_rule);
  } catch (const std::invalid_argument& error) {
    point.fits = false;
    point.reason = error.what();
    return plan;
  }
  plan.options.memory = MemoryKind::shape;
  plan.options.block_rule = grid.block_rule;
  plan.options.sram_bytes = sram_bytes;  // the run derives point.blocks again, as `flashlab run` does
  try {
    require_within_limits(schedule, plan.problem, plan.options, run_cost(schedule, plan.problem, plan.options));
  } catch (const std::invalid_argument& error) {
    throw std::invalid_argument("sweep point M = " + std::to_string(sram_bytes) + " B, mask " + mask_text + ", blocks " +
                                std::to_string(point.blocks.block_rows) + " x " + std::to_string(point.blocks.block_cols) +
                                ": " + error.what());
  }
  if (with_pattern) plan.problem = sweep_problem(grid, seqlen, head_dim, mask, point.blocks);
  return plan;
}

}  // namespace

void require_points_within_limits(const SweepGrid& grid, const std::vector<PointSpec>& points) {
  for (const PointSpec& p : points) plan_point(grid, p.schedule, p.seqlen, p.head_dim, p.sram_bytes, p.mask, false);
}

SweepPoint count_point(const SweepGrid& grid, const std::string& schedule, int seqlen, int head_dim, std::int64_t sram_bytes,
                       const std::string& mask_text) {
  const auto start = std::chrono::steady_clock::now();
  PointPlan plan = plan_point(grid, schedule, seqlen, head_dim, sram_bytes, mask_text, true);
  SweepPoint& point = plan.point;
  if (!point.fits) return point;
  const Problem& problem = plan.problem;
  if (problem.block_sparsity.enabled()) {
    const auto& keep = problem.block_sparsity.keep;
    point.kept_fraction = static_cast<double>(std::count(keep.begin(), keep.end(), 1)) / static_cast<double>(keep.size());
  }
  const RunResult run = run_schedule(schedule, problem, plan.options);
  point.counters = run.counters;
  point.block_rule = run.block_rule;
  point.arena_bytes = run.arena_bytes;
  const double heads = static_cast<double>(grid.batch) * grid.heads;
  point.bound = schedule_bound(schedule, problem, sram_bytes, point.kept_fraction);
  point.bound.elements *= heads;
  point.lower_bound_elements = lower_bound(problem, sram_bytes).elements * heads;
  point.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return point;
}

std::vector<PointSpec> grid_points(const SweepGrid& grid) {
  std::vector<PointSpec> points;
  for (const std::string& schedule : grid.schedules)
    for (const std::string& mask : grid.masks)
      for (int d : grid.head_dims)
        for (std::int64_t m : grid.sram_bytes)
          for (int n : grid.seqlens) points.push_back({schedule, mask, n, d, m});
  return points;
}

void require_valid_jobs(int jobs) {
  if (jobs < 1 || jobs > kMaxSweepJobs) {
    throw std::invalid_argument("--jobs = " + std::to_string(jobs) + " is out of range; allowed: " +
                                decimal_range(1, kMaxSweepJobs));
  }
}

std::vector<SweepPoint> count_points(const SweepGrid& grid, const std::vector<PointSpec>& specs, int jobs,
                                     const Progress& progress) {
  require_valid_jobs(jobs);
  std::vector<SweepPoint> points(specs.size());
  std::mutex mutex;  // guards done and the progress callback
  std::size_t done = 0;
  // Points in grid order; a failure is the serial run's (for_each_unit).
  for_each_unit(specs.size(), jobs, [&](std::size_t i) {
    const PointSpec& p = specs[i];
    points[i] = count_point(grid, p.schedule, p.seqlen, p.head_dim, p.sram_bytes, p.mask);
    const std::lock_guard lock(mutex);
    ++done;
    if (progress) progress(done, specs.size());
  });
  return points;
}

std::vector<SweepPoint> run_sweep(const SweepGrid& grid, const Progress& progress, int jobs) {
  grid.validate();
  require_valid_jobs(jobs);
  const std::vector<PointSpec> specs = grid_points(grid);
  require_points_within_limits(grid, specs);  // every point, before any is counted
  return count_points(grid, specs, jobs, progress);
}

std::vector<SweepFit> fit_sweep(const std::vector<SweepPoint>& points) {
  // key: schedule, mask, variable, the two fixed values -> (x, y) pairs
  using Key = std::tuple<std::string, std::string, std::string, std::int64_t, std::int64_t>;
  std::map<Key, std::vector<const SweepPoint*>> groups;
  for (const SweepPoint& p : points) {
    if (!p.fits) continue;
    groups[{p.schedule, p.mask, "N", p.head_dim, p.sram_bytes}].push_back(&p);
    groups[{p.schedule, p.mask, "M", p.seqlen, p.head_dim}].push_back(&p);
    groups[{p.schedule, p.mask, "d", p.seqlen, p.sram_bytes}].push_back(&p);
  }
  std::vector<SweepFit> fits;
  for (const auto& [key, members] : groups) {
    const auto& [schedule, mask, variable, a, b] = key;
    std::vector<double> x, y, bound;
    std::set<double> distinct;
    for (const SweepPoint* p : members) {
      const double value = variable == "N" ? p->seqlen : variable == "M" ? static_cast<double>(p->sram_bytes) : p->head_dim;
      x.push_back(value);
      y.push_back(static_cast<double>(p->counters.hbm_bytes()));
      bound.push_back(p->bound.elements);
      distinct.insert(value);
    }
    if (distinct.size() < 3) continue;
    SweepFit fit;
    fit.schedule = schedule;
    fit.mask = mask;
    fit.variable = variable;
    fit.points = static_cast<int>(x.size());
    fit.exponent = fit_exponent(x, y);
    // The theory: the asymptotic exponent in the regime of the group's middle point, and the
    // slope of the schedule's Theta bound over the same points (the two differ where a bound
    // has two terms of comparable size, e.g. N d + N^2 d^2 s / M).
    const SweepPoint& middle = *members[members.size() / 2];
    const Exponents theory =
        theory_exponents(schedule, sram_elements_exact(middle.sram_bytes, middle.dtype), middle.head_dim);
    fit.theory = variable == "N" ? theory.n : variable == "M" ? theory.m : theory.d;
    fit.bound_slope = fit_exponent(x, bound);
    if (variable == "N") fit.fixed = {{"head_dim", a}, {"sram_bytes", b}};
    if (variable == "M") fit.fixed = {{"seqlen", a}, {"head_dim", b}};
    if (variable == "d") fit.fixed = {{"seqlen", a}, {"sram_bytes", b}};
    fits.push_back(fit);
  }
  return fits;
}

namespace {
nlohmann::json point_json(const SweepPoint& p, const Machine* machine) {
  nlohmann::json j{{"schedule", p.schedule}, {"mask", p.mask}, {"seqlen", p.seqlen}, {"head_dim", p.head_dim},
                   {"sram_bytes", p.sram_bytes}, {"status", p.fits ? "ok" : "does_not_fit"}};
  if (!p.fits) {
    j["reason"] = p.reason;
    return j;
  }
  const nlohmann::json counters = to_json(p.counters);
  j["block_rows"] = p.blocks.block_rows;
  j["block_cols"] = p.blocks.block_cols;
  j["kept_fraction"] = p.kept_fraction;
  j["block_rule"] = p.block_rule;
  j["arena_bytes"] = p.arena_bytes;
  for (const char* field : {"hbm_bytes", "hbm_read_bytes", "hbm_write_bytes", "hbm_elements", "matmul_flops", "exponentials",
                            "other_flops", "sram_peak_bytes"}) {
    j[field] = counters[field];
  }
  j["bound"] = {{"formula", p.bound.formula}, {"source", p.bound.source}, {"elements", p.bound.elements}};
  j["lower_bound_elements"] = p.lower_bound_elements;
  j["counted_over_bound"] = static_cast<double>(hbm_elements(p.counters)) / p.bound.elements;
  if (machine) j["roofline"] = to_json(roofline(p.counters, *machine));
  j["seconds"] = p.seconds;
  return j;
}
}  // namespace

nlohmann::json sweep_to_json(const SweepGrid& grid, const std::vector<SweepPoint>& points, const std::vector<SweepFit>& fits,
                             const Machine* machine, const std::string& command) {
  nlohmann::json json{{"format", "flashlab-sweep"}, {"version", 1},          {"command", command},
                      {"dtype", to_string(grid.dtype)}, {"batch", grid.batch}, {"heads", grid.heads},
                      {"block_rule", to_string(grid.block_rule)}};
  json["machine"] = machine ? to_json(*machine) : nlohmann::json(nullptr);
  json["points"] = nlohmann::json::array();
  for (const SweepPoint& p : points) json["points"].push_back(point_json(p, machine));
  json["fits"] = nlohmann::json::array();
  for (const SweepFit& f : fits) {
    json["fits"].push_back({{"schedule", f.schedule}, {"mask", f.mask}, {"variable", f.variable}, {"fixed", f.fixed},
                            {"points", f.points}, {"exponent", f.exponent}, {"theory", f.theory},
                            {"bound_slope", f.bound_slope}});
  }
  return json;
}

namespace {
// A CSV text field (RFC 4180): quoted, with quotes doubled, where it holds a comma, quote or line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}
}  // namespace

std::string sweep_to_csv(const std::vector<SweepPoint>& points, const Machine* machine) {
  std::ostringstream csv;
  csv << "schedule,mask,seqlen,head_dim,sram_bytes,status,block_rows,block_cols,kept_fraction,hbm_bytes,hbm_read_bytes,"
         "hbm_write_bytes,hbm_elements,matmul_flops,exponentials,other_flops,sram_peak_bytes,bound_elements,"
         "lower_bound_elements,roofline_seconds,bound_by\n";
  for (const SweepPoint& p : points) {
    csv << csv_field(p.schedule) << ',' << csv_field(p.mask) << ',' << p.seqlen << ',' << p.head_dim << ',' << p.sram_bytes << ','
        << (p.fits ? "ok" : "does_not_fit");
    if (!p.fits) {
      csv << ",,,,,,,,,,,,,,,\n";
      continue;
    }
    const Counters& c = p.counters;
    csv << ',' << p.blocks.block_rows << ',' << p.blocks.block_cols << ',' << p.kept_fraction << ',' << c.hbm_bytes() << ','
        << c.hbm_read_bytes() << ',' << c.hbm_write_bytes() << ',' << hbm_elements(c) << ',' << c.matmul_flops << ','
        << c.exponentials << ',' << c.other_flops << ',' << c.sram_peak_bytes << ',' << p.bound.elements << ','
        << p.lower_bound_elements << ',';
    if (machine) {
      const Roofline r = roofline(c, *machine);
      csv << r.seconds << ',' << csv_field(r.bound_by);
    } else {
      csv << ',';
    }
    csv << '\n';
  }
  return csv.str();
}

}  // namespace flashlab::sim

namespace flashlab::sim {
void print_fits(std::ostream& out, const std::vector<SweepFit>& fits) {
  out << "fitted log-log exponents of HBM bytes (theory in brackets)\n";
  for (const SweepFit& f : fits) {
    char line[256];
    std::snprintf(line, sizeof line, "  %-18s %-10s in %s at %-36s %6.3f  [%5.2f]  (%d points)\n", f.schedule.c_str(), f.mask.c_str(),
                  f.variable.c_str(), f.fixed.dump().c_str(), f.exponent, f.theory, f.points);
    out << line;
  }
}
}  // namespace flashlab::sim
