#include "search.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <iomanip>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "closed_forms.hpp"
#include "report.hpp"

namespace flashlab::sim {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// One side B (Br = Bc = B: square tiling), or two.
bool one_sided(const std::string& schedule) { return find_schedule(schedule).one_sided; }

// Closed forms depend on a block size only through its block count (see search.hpp) when no
// mask, sparsity pattern or varlen batch makes blocks differ.
bool uniform_blocks(const Problem& p) {
  return !p.mask.causal && p.mask.window_left < 0 && p.mask.window_right < 0 && !p.block_sparsity.enabled() && !p.varlen();
}

// The block sizes one dimension may take: multiples of `step` up to `limit` (0: none) and never
// past the smallest multiple that covers `length`. With reduce, key_of(v) keys a value by what
// the closed forms see of it; only the smallest value of each key is kept.
template <class Key>
std::vector<int> block_values(std::int64_t length, int step, int limit, bool reduce, Key key_of) {
  std::int64_t top = ceil_div(length, step) * step;  // the first multiple that covers the length
  if (limit > 0) top = std::min<std::int64_t>(top, limit);
  top = std::min<std::int64_t>(top, kMaxSequenceLength);
  std::vector<int> values;
  for (std::int64_t v = step; v <= top; v += step) {
    if (reduce && !values.empty() && key_of(static_cast<int>(v)) == key_of(values.back())) continue;
    values.push_back(static_cast<int>(v));
  }
  return values;
}

void require_in_range(const char* name, std::int64_t value, std::int64_t low, std::int64_t high) {
  if (value < low || value > high) {
    throw std::invalid_argument(std::string(name) + " = " + std::to_string(value) + "; allowed: " + std::to_string(low) +
                                ".." + std::to_string(high));
  }
}

}  // namespace

void validate_search(const Problem& problem, const SearchOptions& options) {
  problem.validate();
  if (options.schedules.empty()) throw std::invalid_argument("search: no schedule given; allowed: " + schedule_names());
  const Pass pass = find_schedule(options.schedules.front()).pass;
  for (const std::string& name : options.schedules) {
    if (find_schedule(name).pass != pass) {
      throw std::invalid_argument("search: schedules '" + options.schedules.front() + "' and '" + name +
                                  "' are of different passes; allowed: loop orders of one pass (fa1,fa2 or fa1_backward,fa2_backward)");
    }
  }
  const SearchConstraints& c = options.constraints;
  require_in_range("SRAM size M (bytes)", c.sram_bytes, 1, kMaxSramBytes);
  require_in_range("multiple_of", c.multiple_of, 1, 1 << 16);
  require_in_range("max_rows", c.max_rows, 0, kMaxSequenceLength);
  require_in_range("max_cols", c.max_cols, 0, kMaxSequenceLength);
  require_in_range("registers_per_thread", c.registers_per_thread, 0, 1 << 16);
  require_in_range("threads_per_block", c.threads_per_block, 1, 1 << 16);
  require_in_range("num_splits", c.num_splits, 0, kMaxSequenceLength);
  require_in_range("max_tile_steps", options.max_tile_steps, 1, std::int64_t{1} << 40);
  if (options.objective == SearchObjective::time && options.machine == nullptr) {
    throw std::invalid_argument("search: the time objective needs a machine preset (its bandwidth and FLOP rates)");
  }
}

namespace {

bool within_registers(const SearchConstraints& c, std::int64_t accumulators) {
  return c.registers_per_thread == 0 ||
         accumulators <= static_cast<std::int64_t>(c.registers_per_thread) * c.threads_per_block;
}

// The closed form of one tiling, costed for the objective.
SearchCandidate cost(const std::string& schedule, const Problem& problem, const BlockSizes& blocks, const SearchOptions& options) {
  SearchCandidate candidate;
  candidate.schedule = schedule;
  candidate.blocks = blocks;
  const Counters counters = closed_form(schedule, problem, blocks, options.constraints.sram_bytes);
  candidate.hbm_bytes = counters.hbm_bytes();
  candidate.working_set_bytes = working_set_bytes(schedule, problem, blocks);
  candidate.accumulator_elements = accumulator_elements(schedule, problem, blocks);
  if (options.machine != nullptr) {
    const Roofline r = roofline(counters, *options.machine);
    candidate.seconds = r.seconds;
    candidate.bound_by = r.bound_by;
  }
  candidate.objective = options.objective == SearchObjective::time ? candidate.seconds : static_cast<double>(candidate.hbm_bytes);
  return candidate;
}

// Strictly better in the objective (HBM bytes compared as integers).
bool better(const SearchCandidate& a, const SearchCandidate& b, SearchObjective objective) {
  return objective == SearchObjective::time ? a.seconds < b.seconds : a.hbm_bytes < b.hbm_bytes;
}
bool no_worse(const SearchCandidate& a, const SearchCandidate& b, SearchObjective objective) { return !better(b, a, objective); }

// Every tiling within the constraints, in (schedule, Br, Bc) order. The working set and the
// accumulators grow with Br and with Bc, so each row of Bc values stops at the first that does
// not fit, and Br stops when even the smallest Bc does not.
std::vector<BlockSizes> candidates_of(const std::string& schedule, const Problem& problem, const SearchOptions& options) {
  const SearchConstraints& c = options.constraints;
  const bool reduce = !options.exhaustive && uniform_blocks(problem);
  const std::int64_t nq = problem.seqlen_q, nk = problem.seqlen_k, d = problem.head_dim, dv = problem.value_dim();
  const auto fits = [&](const BlockSizes& b) {
    return working_set_bytes(schedule, problem, b) <= c.sram_bytes && within_registers(c, accumulator_elements(schedule, problem, b));
  };
  std::vector<BlockSizes> out;
  // The largest multiple of the step up to `top` that still fits (the working set grows with
  // each side), so that the value lists stop there instead of at N.
  const std::int64_t step = c.multiple_of;
  const auto largest_fitting = [&](std::int64_t top, auto blocks_of) -> int {
    std::int64_t low = 0, high = top / step;  // in units of the step; 0: none fits
    while (low < high) {
      const std::int64_t mid = low + (high - low + 1) / 2;
      if (fits(blocks_of(static_cast<int>(mid * step)))) low = mid; else high = mid - 1;
    }
    return static_cast<int>(low * step);
  };
  const auto cover = [&](std::int64_t length, int limit) {  // the smallest multiple that covers the length, within the limit
    std::int64_t top = std::min<std::int64_t>(ceil_div(length, step) * step, kMaxSequenceLength);
    return limit > 0 ? std::min<std::int64_t>(top, limit) : top;
  };
  if (one_sided(schedule) || c.square) {  // one side B = Br = Bc (square tiling also slices d and d_v by B)
    const int limit = c.max_rows > 0 && c.max_cols > 0 ? std::min(c.max_rows, c.max_cols) : std::max(c.max_rows, c.max_cols);
    const int side = largest_fitting(cover(std::max(nq, nk), limit), [&](int b) { return BlockSizes{b, b, c.num_splits}; });
    if (side == 0) return out;
    const auto key = [&](int b) {
      return std::array<std::int64_t, 4>{ceil_div(nq, b), ceil_div(nk, b), ceil_div(d, b), ceil_div(dv, b)};
    };
    for (int b : block_values(std::max(nq, nk), c.multiple_of, side, reduce && find_schedule(schedule).key_block_count_decides, key)) {
      const BlockSizes blocks{b, b, c.num_splits};
      if (!fits(blocks)) break;
      out.push_back(blocks);
    }
    return out;
  }
  const int first = static_cast<int>(step);
  const int row_cap = largest_fitting(cover(nq, c.max_rows), [&](int r) { return BlockSizes{r, first, c.num_splits}; });
  const int col_cap = largest_fitting(cover(nk, c.max_cols), [&](int col) { return BlockSizes{first, col, c.num_splits}; });
  if (row_cap == 0 || col_cap == 0) return out;
  const std::vector<int> rows = block_values(nq, c.multiple_of, row_cap, reduce, [&](int b) { return ceil_div(nq, b); });
  // A schedule whose key blocks restart at every chunk (split_kv) counts more than ceil(N_k / Bc).
  const bool by_count = find_schedule(schedule).key_block_count_decides;
  const std::vector<int> cols =
      block_values(nk, c.multiple_of, col_cap, reduce && by_count, [&](int b) { return ceil_div(nk, b); });
  for (int r : rows) {
    if (!fits({r, cols.front(), c.num_splits})) break;
    for (int col : cols) {
      const BlockSizes blocks{r, col, c.num_splits};
      if (!fits(blocks)) break;
      out.push_back(blocks);
    }
  }
  return out;
}

// The closed-form work of costing one tiling: its tile steps over every distinct sequence.
std::int64_t costing_steps(const std::string& schedule, const Problem& problem, const BlockSizes& blocks) {
  const int sequences = problem.varlen() ? problem.batch : 1;
  std::int64_t steps = 0;
  for (int b = 0; b < sequences; ++b) steps = saturating_add(steps, tile_steps(schedule, problem, b, blocks));
  return steps;
}

// Pareto front of (objective, working set), both minimised: sorted by working set, a tiling is
// on the front when it beats the best objective of every smaller-or-equal working set.
std::vector<SearchCandidate> pareto_front(std::vector<SearchCandidate> all, SearchObjective objective) {
  std::stable_sort(all.begin(), all.end(), [&](const SearchCandidate& a, const SearchCandidate& b) {
    if (a.working_set_bytes != b.working_set_bytes) return a.working_set_bytes < b.working_set_bytes;
    return better(a, b, objective);
  });
  std::vector<SearchCandidate> front;
  for (const SearchCandidate& candidate : all) {
    if (front.empty() || better(candidate, front.back(), objective)) front.push_back(candidate);
  }
  return front;
}

// A tiling waiting to be costed: its closed-form work, and a lower bound on its objective.
struct Pending {
  std::size_t schedule;
  BlockSizes blocks;
  std::int64_t steps;
  double bound;
};

double objective_of(const Counters& counters, const SearchOptions& options) {
  if (options.objective == SearchObjective::time) return roofline(counters, *options.machine).seconds;
  return static_cast<double>(counters.hbm_bytes());
}

// The work of the lower bounds: one closed form per distinct Br (with one key block) and per
// distinct Bc (with one query block).
std::int64_t bound_steps(const Problem& problem, const SearchOptions& options, const std::vector<Pending>& pending) {
  std::set<std::pair<std::size_t, int>> rows, cols;
  std::int64_t steps = 0;
  for (const Pending& p : pending) {
    const std::string& schedule = options.schedules[p.schedule];
    if (rows.insert({p.schedule, p.blocks.block_rows}).second) {
      steps = saturating_add(steps, costing_steps(schedule, problem, {p.blocks.block_rows, problem.seqlen_k, p.blocks.num_splits}));
    }
    if (cols.insert({p.schedule, p.blocks.block_cols}).second) {
      steps = saturating_add(steps, costing_steps(schedule, problem, {problem.seqlen_q, p.blocks.block_cols, p.blocks.num_splits}));
    }
  }
  return steps;
}

// Past the budget on a problem whose blocks are uniform: every objective falls (or stays) as Br
// or Bc grows (more blocks only repeat reads and updates), so obj(Br, Bc) >= max(obj(Br, N_k),
// obj(N_q, Bc)), two one-dimensional closed forms of O(N / B) work. Tilings are costed in order
// of that bound; one whose bound is no better than a costed tiling of no larger working set
// cannot be on the front nor the best, and is pruned uncosted. What the budget leaves over is
// skipped, and best_exact / front_complete say whether a skipped tiling could have mattered.
std::vector<SearchCandidate> cost_with_bounds(const Problem& problem, const SearchOptions& options, std::vector<Pending>& pending,
                                              SearchResult& result) {
  std::map<std::pair<std::size_t, int>, double> by_rows, by_cols;
  for (Pending& p : pending) {
    const std::string& schedule = options.schedules[p.schedule];
    const auto one_dimensional = [&](std::map<std::pair<std::size_t, int>, double>& memo, int key, BlockSizes blocks) {
      auto [it, inserted] = memo.try_emplace({p.schedule, key}, 0.0);
      if (inserted) it->second = objective_of(closed_form(schedule, problem, blocks, options.constraints.sram_bytes), options);
      return it->second;
    };
    const int splits = options.constraints.num_splits;
    p.bound = std::max(one_dimensional(by_rows, p.blocks.block_rows, {p.blocks.block_rows, problem.seqlen_k, splits}),
                       one_dimensional(by_cols, p.blocks.block_cols, {problem.seqlen_q, p.blocks.block_cols, splits}));
  }
  std::vector<std::int64_t> working_sets(pending.size());
  for (std::size_t i = 0; i < pending.size(); ++i) {
    working_sets[i] = working_set_bytes(options.schedules[pending[i].schedule], problem, pending[i].blocks);
  }
  std::vector<std::size_t> order(pending.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return pending[a].bound != pending[b].bound ? pending[a].bound < pending[b].bound : working_sets[a] < working_sets[b];
  });
  // The front so far: working set -> objective, the objective falling as the working set grows.
  std::map<std::int64_t, double> front;
  const auto best_within = [&](std::int64_t working_set) {  // the least objective of a working set <= this
    auto it = front.upper_bound(working_set);
    return it == front.begin() ? std::numeric_limits<double>::infinity() : std::prev(it)->second;
  };
  std::vector<SearchCandidate> costed;
  std::vector<std::size_t> skipped;
  std::int64_t spent = 0;
  for (std::size_t i : order) {
    const Pending& p = pending[i];
    if (best_within(working_sets[i]) <= p.bound) {
      ++result.candidates_pruned;
      continue;
    }
    if (saturating_add(spent, p.steps) > options.max_tile_steps) {
      skipped.push_back(i);
      continue;
    }
    spent += p.steps;
    costed.push_back(cost(options.schedules[p.schedule], problem, p.blocks, options));
    const double objective = costed.back().objective;
    if (best_within(working_sets[i]) <= objective) continue;
    auto it = front.insert_or_assign(working_sets[i], objective).first;
    for (++it; it != front.end() && it->second >= objective;) it = front.erase(it);
  }
  result.candidates_skipped = static_cast<std::int64_t>(skipped.size());
  const double best = front.empty() ? std::numeric_limits<double>::infinity() : std::prev(front.end())->second;
  result.best_exact = std::all_of(skipped.begin(), skipped.end(), [&](std::size_t i) { return pending[i].bound >= best; });
  result.front_complete = std::all_of(skipped.begin(), skipped.end(), [&](std::size_t i) {
    return best_within(working_sets[i]) <= pending[i].bound;
  });
  return costed;
}

// A block rule's tiling against the candidates and the front.
RuleTiling place_rule(const std::string& schedule, BlockRule rule, const Problem& problem, const SearchOptions& options,
                      const std::vector<SearchCandidate>& all, const std::vector<SearchCandidate>& front,
                      const SearchCandidate& best) {
  RuleTiling placed;
  placed.schedule = schedule;
  placed.rule = to_string(rule);
  BlockSizes blocks = derive_blocks(schedule, problem, options.constraints.sram_bytes, rule);
  blocks.num_splits = options.constraints.num_splits;
  placed.tiling = cost(schedule, problem, blocks, options);
  const SearchConstraints& c = options.constraints;
  const auto multiple = [&](int v) { return v % c.multiple_of == 0; };
  placed.within_constraints = multiple(blocks.block_rows) && multiple(blocks.block_cols) &&
                              (c.max_rows == 0 || blocks.block_rows <= c.max_rows) &&
                              (c.max_cols == 0 || blocks.block_cols <= c.max_cols) &&
                              (!c.square || blocks.block_rows == blocks.block_cols) &&
                              placed.tiling.working_set_bytes <= c.sram_bytes &&
                              within_registers(c, placed.tiling.accumulator_elements);
  placed.rank = 1 + std::count_if(all.begin(), all.end(), [&](const SearchCandidate& x) {
                  return better(x, placed.tiling, options.objective);
                });
  placed.on_front = std::none_of(front.begin(), front.end(), [&](const SearchCandidate& f) {
    const bool at_least_as_good = no_worse(f, placed.tiling, options.objective) && f.working_set_bytes <= placed.tiling.working_set_bytes;
    const bool better_in_one = better(f, placed.tiling, options.objective) || f.working_set_bytes < placed.tiling.working_set_bytes;
    return at_least_as_good && better_in_one;
  });
  placed.ratio_to_best = best.objective > 0 ? placed.tiling.objective / best.objective : 1.0;
  return placed;
}

}  // namespace

const char* to_string(SearchObjective objective) { return objective == SearchObjective::time ? "time" : "hbm"; }

SearchObjective search_objective_from_string(const std::string& name) {
  if (name == "hbm") return SearchObjective::hbm_bytes;
  if (name == "time") return SearchObjective::time;
  throw std::invalid_argument("objective '" + name + "' is unknown; allowed: hbm, time");
}

std::int64_t standard_accumulator_elements(const Problem& problem, const BlockSizes& blocks) {
  const std::int64_t r = std::min(blocks.block_rows, problem.seqlen_q), c = std::min(blocks.block_cols, problem.seqlen_k);
  return r * c;  // S_ij (its O, dK, dV are whole products)
}
std::int64_t square_tiling_accumulator_elements(const Problem& problem, const BlockSizes& blocks) {
  const std::int64_t r = std::min(blocks.block_rows, problem.seqlen_q);
  return r * std::min<std::int64_t>(blocks.block_rows, problem.seqlen_k) + r * std::min<std::int64_t>(blocks.block_rows, problem.value_dim());
}
std::int64_t backward_accumulator_elements(const Problem& problem, const BlockSizes& blocks) {
  const std::int64_t r = std::min(blocks.block_rows, problem.seqlen_q), c = std::min(blocks.block_cols, problem.seqlen_k);
  return r * c + c * (problem.head_dim + problem.value_dim());  // S_ij; dK_j, dV_j (FA2 Algorithm 2, lines 7-8)
}
std::int64_t forward_accumulator_elements(const Problem& problem, const BlockSizes& blocks) {
  const std::int64_t r = std::min(blocks.block_rows, problem.seqlen_q), c = std::min(blocks.block_cols, problem.seqlen_k);
  return r * c + r * problem.value_dim();  // S_ij; O_i (FA2 Algorithm 1, lines 4-10)
}

std::int64_t accumulator_elements(const std::string& schedule, const Problem& problem, const BlockSizes& blocks) {
  return find_schedule(schedule).accumulator_elements(problem, blocks);
}

SearchResult search_tilings(const Problem& problem, const SearchOptions& options) {
  validate_search(problem, options);
  const auto start = Clock::now();
  SearchResult result;
  result.problem = problem;
  result.options = options;
  result.options.machine = nullptr;
  if (options.machine != nullptr) result.machine_key = options.machine->key;

  // Every tiling within the constraints, with its costing work.
  std::vector<Pending> pending;
  std::int64_t total_steps = 0;
  for (std::size_t s = 0; s < options.schedules.size(); ++s) {
    for (const BlockSizes& blocks : candidates_of(options.schedules[s], problem, options)) {
      pending.push_back({s, blocks, costing_steps(options.schedules[s], problem, blocks), 0});
      total_steps = saturating_add(total_steps, pending.back().steps);
    }
  }
  if (pending.empty()) {
    throw std::invalid_argument("search: no tiling of " + options.schedules.front() + " has its working set within M = " +
                                std::to_string(options.constraints.sram_bytes) +
                                " B under these constraints (multiple of " + std::to_string(options.constraints.multiple_of) +
                                "); allowed: a larger M or looser constraints");
  }
  result.candidates_total = static_cast<std::int64_t>(pending.size());
  result.tile_steps_total = total_steps;
  std::vector<SearchCandidate> all;
  const bool one_side = std::any_of(options.schedules.begin(), options.schedules.end(), one_sided);
  if (total_steps <= options.max_tile_steps) {  // every tiling costed
    for (const Pending& p : pending) all.push_back(cost(options.schedules[p.schedule], problem, p.blocks, options));
  } else if (uniform_blocks(problem) && !one_side && bound_steps(problem, options, pending) <= options.max_tile_steps) {
    all = cost_with_bounds(problem, options, pending, result);
  } else {  // no bound to prune with: the tilings that use most of M first (the best are there), the rest left out
    std::vector<std::int64_t> working_sets;
    for (const Pending& p : pending) working_sets.push_back(working_set_bytes(options.schedules[p.schedule], problem, p.blocks));
    std::vector<std::size_t> order(pending.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return working_sets[a] > working_sets[b]; });
    std::vector<Pending> sorted;
    for (std::size_t i : order) sorted.push_back(pending[i]);
    pending = std::move(sorted);
    std::int64_t spent = 0;
    for (const Pending& p : pending) {
      if (saturating_add(spent, p.steps) > options.max_tile_steps) {
        ++result.candidates_skipped;
        continue;
      }
      spent += p.steps;
      all.push_back(cost(options.schedules[p.schedule], problem, p.blocks, options));
    }
    result.best_exact = result.front_complete = result.candidates_skipped == 0;
  }
  if (all.empty()) {
    throw std::invalid_argument("search: costing even the coarsest tiling takes more than max_tile_steps = " +
                                std::to_string(options.max_tile_steps) +
                                " closed-form tile steps; allowed: a larger budget (--max-tile-steps), M or block limits");
  }
  result.candidates_costed = static_cast<std::int64_t>(all.size());
  // The best: the least objective, then the least working set; the first in (schedule, Br, Bc) order.
  result.best = *std::min_element(all.begin(), all.end(), [&](const SearchCandidate& a, const SearchCandidate& b) {
    if (better(a, b, options.objective)) return true;
    if (better(b, a, options.objective)) return false;
    return a.working_set_bytes < b.working_set_bytes;
  });
  result.front = pareto_front(all, options.objective);
  for (const std::string& schedule : options.schedules) {
    result.rules.push_back(place_rule(schedule, BlockRule::fitting, problem, options, all, result.front, result.best));
    if (has_paper_block_rule(schedule)) {
      result.rules.push_back(place_rule(schedule, BlockRule::paper, problem, options, all, result.front, result.best));
    }
  }
  result.search_seconds = seconds_since(start);

  if (options.verify) {  // the best tiling through the real schedule, in the arena M bounds
    const auto run_start = Clock::now();
    RunOptions run;
    run.memory = MemoryKind::shape;
    run.sram_bytes = options.constraints.sram_bytes;
    run.blocks = result.best.blocks;
    const RunResult counted = run_schedule(result.best.schedule, problem, run);
    const Counters expected = closed_form(result.best.schedule, problem, counted.blocks, counted.arena_bytes);
    result.verification.done = true;
    result.verification.closed_form_equal = expected.tensor == counted.counters.tensor;
    result.verification.hbm_bytes = counted.counters.hbm_bytes();
    result.verification.arena_bytes = counted.arena_bytes;
    result.verification.sram_peak_bytes = counted.counters.sram_peak_bytes;
    result.verification.seconds = seconds_since(run_start);
  }
  return result;
}

// ---------------------------------------------------------------------------------------------
// Printers.

nlohmann::json to_json(const SearchCandidate& c) {
  nlohmann::json json{{"schedule", c.schedule},
                      {"blocks", to_json(c.blocks)},
                      {"hbm_bytes", c.hbm_bytes},
                      {"working_set_bytes", c.working_set_bytes},
                      {"accumulator_elements", c.accumulator_elements}};
  if (!c.bound_by.empty()) json["seconds"] = c.seconds, json["bound_by"] = c.bound_by;
  return json;
}

nlohmann::json search_to_json(const SearchResult& result, const std::string& command) {
  const SearchConstraints& c = result.options.constraints;
  const Problem& p = result.problem;
  nlohmann::json front = nlohmann::json::array(), rules = nlohmann::json::array();
  for (const SearchCandidate& f : result.front) front.push_back(to_json(f));
  for (const RuleTiling& r : result.rules) {
    rules.push_back({{"schedule", r.schedule}, {"rule", r.rule}, {"tiling", to_json(r.tiling)},
                     {"within_constraints", r.within_constraints}, {"rank", r.rank}, {"on_front", r.on_front},
                     {"ratio_to_best", r.ratio_to_best}});
  }
  nlohmann::json json{
      {"format", "flashlab-search"},
      {"version", 1},
      {"command", command},
      {"schedules", result.options.schedules},
      {"objective", to_string(result.options.objective)},
      {"problem", {{"batch", p.batch}, {"heads_q", p.heads_q}, {"heads_kv", p.heads_kv}, {"seqlen_q", p.seqlen_q},
                   {"seqlen_k", p.seqlen_k}, {"head_dim", p.head_dim}, {"head_dim_v", p.value_dim()},
                   {"dtype", to_string(p.dtype)}, {"causal", p.mask.causal}}},
      {"constraints", {{"sram_bytes", c.sram_bytes}, {"multiple_of", c.multiple_of}, {"max_rows", c.max_rows},
                       {"max_cols", c.max_cols}, {"square", c.square}, {"registers_per_thread", c.registers_per_thread},
                       {"threads_per_block", c.threads_per_block}}},
      {"machine", result.machine_key.empty() ? nlohmann::json(nullptr) : nlohmann::json(result.machine_key)},
      {"candidates_total", result.candidates_total},
      {"candidates_costed", result.candidates_costed},
      {"candidates_pruned", result.candidates_pruned},
      {"candidates_skipped", result.candidates_skipped},
      {"best_exact", result.best_exact},
      {"front_complete", result.front_complete},
      {"exhaustive", result.options.exhaustive || !uniform_blocks(p)},
      {"best", to_json(result.best)},
      {"front", front},
      {"rules", rules},
      {"search_seconds", result.search_seconds}};
  if (result.verification.done) {
    const SearchVerification& v = result.verification;
    json["verification"] = {{"closed_form_equal", v.closed_form_equal}, {"hbm_bytes", v.hbm_bytes},
                            {"arena_bytes", v.arena_bytes}, {"sram_peak_bytes", v.sram_peak_bytes}, {"seconds", v.seconds}};
  }
  return json;
}

namespace {

std::string blocks_text(const BlockSizes& b) { return std::to_string(b.block_rows) + " x " + std::to_string(b.block_cols); }

void print_row(std::ostream& out, const SearchCandidate& c, const SearchCandidate& best, bool with_time, const std::string& label) {
  std::ostringstream ratio;
  ratio << std::fixed << std::setprecision(3) << (best.objective > 0 ? c.objective / best.objective : 1.0);
  out << std::left << std::setw(22) << label << std::setw(13) << blocks_text(c.blocks) << std::right << std::setw(12)
      << human_bytes(static_cast<double>(c.hbm_bytes)) << std::setw(12) << human_bytes(static_cast<double>(c.working_set_bytes))
      << std::setw(12) << c.accumulator_elements;
  if (with_time) {
    std::ostringstream time;
    time << std::setprecision(4) << c.seconds * 1e3 << " ms";
    out << std::setw(13) << time.str() << "  " << std::left << std::setw(7) << c.bound_by;
  }
  out << std::right << std::setw(8) << ratio.str() << "\n";
}

}  // namespace

void print_search(std::ostream& out, const SearchResult& result, std::size_t max_front_rows) {
  const bool with_time = !result.machine_key.empty();
  const SearchConstraints& c = result.options.constraints;
  const Problem& p = result.problem;
  std::string names;
  for (const std::string& s : result.options.schedules) names += (names.empty() ? "" : ", ") + s;
  out << "search over Br x Bc of " << names << ": N " << p.seqlen_q << " x " << p.seqlen_k << ", d " << p.head_dim << "/"
      << p.value_dim() << ", " << to_string(p.dtype) << (p.mask.causal ? ", causal" : "") << ", batch " << p.batch << ", heads "
      << p.heads_q << "/" << p.heads_kv << "\n";
  out << "constraints: working set <= M = " << c.sram_bytes << " B, multiples of " << c.multiple_of;
  if (c.max_rows > 0) out << ", Br <= " << c.max_rows;
  if (c.max_cols > 0) out << ", Bc <= " << c.max_cols;
  if (c.square) out << ", Br = Bc";
  if (c.registers_per_thread > 0) {
    out << ", accumulators <= " << c.registers_per_thread << " x " << c.threads_per_block << " threads";
  }
  out << "; objective " << (result.options.objective == SearchObjective::time ? "roofline time on " + result.machine_key : "HBM bytes")
      << "\n";
  out << result.candidates_costed << " tilings costed by closed forms in " << std::setprecision(3) << result.search_seconds << " s"
      << (result.options.exhaustive || !uniform_blocks(p) ? "" : " (the smallest block of each block count)") << "\n";
  if (result.candidates_pruned > 0) {
    out << result.candidates_pruned << " more pruned uncosted: their lower bound is no better than a costed tiling of no larger working set\n";
  }
  if (result.candidates_skipped > 0) {
    out << result.candidates_skipped << " left out past " << result.options.max_tile_steps << " closed-form tile steps: the best is "
        << (result.best_exact ? "exact" : "NOT proven best") << ", the front " << (result.front_complete ? "complete" : "incomplete")
        << "\n";
  }
  out << "\n";
  out << std::left << std::setw(22) << "tiling" << std::setw(13) << "Br x Bc" << std::right << std::setw(12) << "HBM" << std::setw(12)
      << "working set" << std::setw(12) << "accum elts";
  if (with_time) out << std::setw(13) << "time" << "  " << std::left << std::setw(7) << "bound" << std::right;
  out << std::setw(8) << "/ best" << "\n";
  print_row(out, result.best, result.best, with_time, "best (" + result.best.schedule + ")");
  for (const RuleTiling& r : result.rules) {
    print_row(out, r.tiling, result.best, with_time, r.rule + " rule (" + r.schedule + ")");
  }
  out << "\nPareto front (" << result.front.size() << " tilings; objective vs working set, both minimised):\n";
  const std::size_t shown = std::min(result.front.size(), max_front_rows);
  for (std::size_t i = result.front.size() - shown; i < result.front.size(); ++i) {
    print_row(out, result.front[i], result.best, with_time, "  " + result.front[i].schedule);
  }
  if (shown < result.front.size()) out << "  ... " << result.front.size() - shown << " with smaller working sets (--json has all)\n";
  out << "\n";
  for (const RuleTiling& r : result.rules) {
    out << r.rule << " rule of " << r.schedule << " (" << blocks_text(r.tiling.blocks) << "): rank " << r.rank << " of "
        << result.candidates_costed << " costed, " << (r.on_front ? "on" : "off") << " the front, " << std::setprecision(3)
        << r.ratio_to_best << "x the best"
        << (r.within_constraints ? "" : r.tiling.working_set_bytes > c.sram_bytes ? " (its working set exceeds M)" : " (outside the constraints)")
        << "\n";
  }
  if (result.verification.done) {
    const SearchVerification& v = result.verification;
    out << "verified: " << result.best.schedule << " " << blocks_text(result.best.blocks) << " run shape-only in an arena of "
        << v.arena_bytes << " B: HBM " << human_bytes(static_cast<double>(v.hbm_bytes)) << ", SRAM peak " << v.sram_peak_bytes
        << " B, " << (v.closed_form_equal ? "equal to the closed form per tensor" : "DIFFERS from the closed form") << " ("
        << std::setprecision(3) << v.seconds << " s)\n";
  }
}

}  // namespace flashlab::sim
