// flashlab: the IO simulator's command line.
//
//   flashlab run --schedule fa2 --seqlen 4096 --head-dim 128 --sram 228K   one run: counters (+ error vs the oracle with --data)
//   flashlab check                                                         every CPU schedule vs the double oracle
//   flashlab sweep --schedules fa1,fa2 --seqlens 1024,2048 --head-dims 64 --sram 64K,128K --json s.json --csv s.csv
//                  [--jobs 4] [--quiet]                                   points counted on 4 threads; no progress lines
//   flashlab trace --schedule fa2 --seqlen 128 --head-dim 16 --sram 8K --out fa2.json
//   flashlab machines                                                      the presets and their sources
//   flashlab experiment --out-dir out                                      the README's default experiment
//   flashlab figure2                                                       FA1 Figure 2's HBM column (GPT-2 medium, A100)
//   flashlab kernel-tiles --machine h200 --json tiles.json                 the GPU kernels' tilings (those an H200 runs)
//   flashlab search --schedule fa2 -n 16384 -d 128 --machine h200 --multiple-of 16
//                                                                          the tilings of M with the least HBM traffic or time
//   flashlab ring --machine h200 --devices 8 --seqlen-per-device 32768 --heads 32 -d 128 --causal
//                                                                          Ring Attention: HBM per device, link bytes per step, overlap
//   flashlab ring --machine h200 --sweep --sweep-devices 2,4,8             the seqlen per device where the transfers hide
//   flashlab hardware --kernel fa2 --seqlen 16384 --heads 16 --head-dim 128 --machine h200
//                                                                          a GPU kernel through the three-level model
//                                                                          (DRAM, L2, SRAM) and its time model
//   flashlab --version                                                     the CMake project's version
//
// Bad input (unknown schedule or machine, malformed JSON, sizes out of range, M below the smallest
// working set): one line on stderr naming the problem, exit status 2, no output file written.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithms/00_oracle.hpp"
#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "kernels/tilings.hpp"
#include "sim/bounds.hpp"
#include "sim/check.hpp"
#include "sim/cli/decimal_options.hpp"
#include "sim/cli/cli.hpp"
#include "sim/closed_forms.hpp"
#include "sim/decimal.hpp"
#include "sim/experiment.hpp"
#include "sim/hardware_report.hpp"
#include "sim/hierarchy.hpp"
#include "sim/machines.hpp"
#include "sim/output_file.hpp"
#include "sim/progress.hpp"
#include "sim/report.hpp"
#include "sim/ring.hpp"
#include "sim/schedules.hpp"
#include "sim/serving.hpp"
#include "sim/search.hpp"
#include "sim/sweep.hpp"
#include "sim/time_model.hpp"
#include "sim/trace.hpp"

using namespace flashlab;
using namespace flashlab::sim;

namespace {

// cli::Mode::checks_only: each command returns 0 where its work would begin (cli.hpp).
bool checks_only = false;

// A problem the user gave, an error in it is bad input (exit 2).
struct BadInput : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Output paths are checked before any work (sim/output_file.hpp); an empty path: no file.
void require_writable(const std::string& path) {
  if (!path.empty()) check_output_path(path);
}

std::string command_line(int argc, char** argv) {
  std::string text;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.find_first_of(" \t'\"") != std::string::npos) arg = "'" + arg + "'";
    text += (i ? " " : "") + arg;
  }
  return text;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  std::string part;
  while (std::getline(stream, part, ',')) {
    if (!part.empty()) parts.push_back(part);
  }
  return parts;
}

std::vector<int> split_ints(const std::string& text, const char* option, int low, int high) {
  std::vector<int> values;
  for (const std::string& part : split(text)) values.push_back(static_cast<int>(parse_decimal(part, option, low, high)));
  if (values.empty()) {
    throw BadInput(std::string(option) + ": no values given; allowed: a comma-separated list in " + decimal_range(low, high));
  }
  return values;
}

// --block-rule of run, trace, sweep and experiment.
BlockRule parse_block_rule(const std::string& text) {
  try {
    return block_rule_from_string(text);
  } catch (const std::invalid_argument& error) {
    throw BadInput(std::string("--block-rule: ") + error.what());
  }
}
constexpr const char* kBlockRuleHelp =
    "derived blocks: fitting (the paper's shape shrunk to fit M; default) or paper (the paper's rule "
    "as written, M/4 per Q, K, V, O tile; the arena grows to its working set)";

// The problem options shared by run, trace and figure-like commands.
struct ProblemOptions {
  int batch = 1, heads = 1, heads_kv = 0, seqlen = 1024, seqlen_k = 0, head_dim = 64, head_dim_v = 0;
  bool causal = false, top_left = false;
  int window_left = -1, window_right = -1;
  std::string dtype = "fp32";
  std::string sram;      // "228K"
  std::string machine;   // preset key or path
  int block_rows = 0, block_cols = 0, splits = 0, devices = 0;
  std::string ordering;                // ring schedules: contiguous, striped or zigzag
  std::string block_rule = "fitting";  // derived blocks: "fitting" or "paper"

  // with_blocks: the explicit block sizes and the block rule too (not for search, which picks them).
  void add_to(CLI::App& app, bool with_blocks = true) {
    add_decimal_option(app, "--batch", batch, "batch size", 1, kMaxBatch);
    add_decimal_option(app, "--heads", heads, "query heads", 1, kMaxHeads);
    add_decimal_option(app, "--heads-kv", heads_kv, "key/value heads (0: --heads; GQA/MQA when fewer)", 0, kMaxHeads);
    add_decimal_option(app, "--seqlen,-n", seqlen, "sequence length N (queries)", 1, kMaxSequenceLength);
    add_decimal_option(app, "--seqlen-k", seqlen_k, "key length (0: --seqlen)", 0, kMaxSequenceLength);
    add_decimal_option(app, "--head-dim,-d", head_dim, "head dimension d", 1, kMaxHeadDim);
    add_decimal_option(app, "--head-dim-v", head_dim_v, "value head dimension (0: d)", 0, kMaxHeadDim);
    app.add_flag("--causal", causal, "causal mask (bottom-right aligned)");
    app.add_flag("--top-left", top_left, "align the causal mask to the top-left corner");
    add_decimal_option(app, "--window-left", window_left, "sliding window: keys to the left (-1: unbounded)", -1,
                       kMaxSequenceLength);
    add_decimal_option(app, "--window-right", window_right, "sliding window: keys to the right (-1: unbounded)", -1,
                       kMaxSequenceLength);
    app.add_option("--dtype", dtype, "fp32, fp16 or bf16 (default fp32; a machine preset sets its own)");
    app.add_option("--sram,-M", sram, "SRAM size M in bytes, K/M suffixes allowed (228K); default: the machine's");
    app.add_option("--machine", machine, "machine preset key (flashlab machines) or a preset .json path");
    add_decimal_option(app, "--splits", splits, "split_kv: number of KV chunks (0: 4)", 0, kMaxSequenceLength);
    if (!with_blocks) return;
    add_decimal_option(app, "--devices", devices, "ring, ring_backward: devices of the ring (0: 4)", 0, kMaxRingDevices);
    app.add_option("--ordering", ordering, "ring, ring_backward: contiguous, striped or zigzag (default)");
    add_decimal_option(app, "--block-rows", block_rows, "explicit Br (query rows per block; 0: derived)", 0,
                       kMaxSequenceLength);
    add_decimal_option(app, "--block-cols", block_cols, "explicit Bc (keys per block; 0: derived)", 0, kMaxSequenceLength);
    app.add_option("--block-rule", block_rule, kBlockRuleHelp);
  }

  Problem problem(const Machine* preset, bool dtype_given) const {
    Problem p;
    p.batch = batch;
    p.heads_q = heads;
    p.heads_kv = heads_kv > 0 ? heads_kv : heads;
    p.seqlen_q = seqlen;
    p.seqlen_k = seqlen_k > 0 ? seqlen_k : seqlen;
    p.head_dim = head_dim;
    p.head_dim_v = head_dim_v;
    p.mask.causal = causal;
    p.mask.alignment = top_left ? CausalAlignment::top_left : CausalAlignment::bottom_right;
    p.mask.window_left = window_left;
    p.mask.window_right = window_right;
    p.dtype = preset && !dtype_given ? preset->dtype : dtype_from_string(dtype);
    p.validate();
    return p;
  }
  RunOptions run_options(const Machine* preset) const {
    RunOptions options;
    options.sram_bytes = !sram.empty() ? parse_bytes(sram, "--sram") : preset ? preset->sram_bytes : 0;
    if (block_rows > 0 || block_cols > 0) {
      options.blocks = {block_rows > 0 ? block_rows : block_cols, block_cols > 0 ? block_cols : block_rows, splits};
    } else if (options.sram_bytes == 0) {
      throw BadInput("give the SRAM size (--sram 228K), a --machine, or --block-rows/--block-cols");
    }
    if (splits < 0) throw BadInput("--splits = " + std::to_string(splits) + "; allowed: >= 1 (0: 4)");
    options.blocks.num_splits = splits;  // kept by the registry when the block sizes are derived
    options.blocks.devices = devices;    // and a ring's devices and ordering
    if (!ordering.empty()) {
      try {
        options.blocks.ordering = ring_ordering_from_string(ordering);
      } catch (const std::invalid_argument& error) {
        throw BadInput(std::string("--ordering: ") + error.what());
      }
    }
    options.block_rule = parse_block_rule(block_rule);
    return options;
  }
};

// ---------------------------------------------------------------------------------------------
// The modelling choices of `flashlab run`: the KV cache's pages (split_kv only;
// 08_split_kv_decode.hpp) and the backward's dK/dV group reduction (run_backward.hpp).
struct KvCacheOptions {
  int page_size = 0;
  std::string page_reads = "valid_rows";
  std::string dkv_reduction = "fp32_partials";

  void add_to(CLI::App& app) {
    add_decimal_option(app, "--page-size", page_size,
                       "split_kv: paged KV cache, tokens per page (0: contiguous; e.g. 16..256)", 0, PagedKvCache::kMaxPageSize);
    app.add_option("--page-reads", page_reads,
                   "paged KV cache: valid_rows (only a key block's rows, as FlashAttention's paged kernels; default) or "
                   "whole_pages (every page a key block touches, in full, as vLLM's paged attention)");
    app.add_option("--dkv-reduction", dkv_reduction,
                   "backward passes with GQA/MQA: fp32_partials (fp32 dK, dV per query head, then a reduction pass; "
                   "default) or in_place (one fp32 accumulator per KV head, added into with atomics, then converted)");
  }
  GroupReduction reduction(const ScheduleInfo& info, bool given) const {
    GroupReduction reduction;
    try {
      reduction = group_reduction_from_string(dkv_reduction);
    } catch (const std::invalid_argument& error) {
      throw BadInput(std::string("--dkv-reduction: ") + error.what());
    }
    if (given && info.pass != Pass::backward) {
      throw BadInput("--dkv-reduction with schedule '" + info.name + "'; allowed: backward schedules only");
    }
    return reduction;
  }
  PagedKvCache cache(const ScheduleInfo& info, bool reads_given) const {
    PagedKvCache cache;
    cache.page_size = page_size;
    try {
      cache.reads = page_reads_from_string(page_reads);
    } catch (const std::invalid_argument& error) {
      throw BadInput(std::string("--page-reads: ") + error.what());
    }
    if (page_size > 0 && info.pass != Pass::decode) {
      throw BadInput("--page-size " + std::to_string(page_size) + " with schedule '" + info.name +
                     "'; allowed: a paged KV cache with the decode schedule split_kv only");
    }
    if (page_size == 0 && reads_given) throw BadInput("--page-reads needs --page-size N (N >= 1)");
    return cache;
  }
};

int command_run(ProblemOptions& po, const std::string& schedule, bool data, bool dtype_given, const std::string& json_path,
                const std::string& command, const KvCacheOptions& kv_options, bool page_reads_given,
                bool reduction_given) {
  require_writable(json_path);
  std::optional<Machine> machine;
  if (!po.machine.empty()) machine = find_machine(po.machine);
  const Problem problem = po.problem(machine ? &*machine : nullptr, dtype_given);
  RunOptions options = po.run_options(machine ? &*machine : nullptr);
  const ScheduleInfo& info = find_schedule(schedule);
  options.kv_cache = kv_options.cache(info, page_reads_given);
  options.group_reduction = kv_options.reduction(info, reduction_given);
  options.memory = data ? MemoryKind::data : MemoryKind::shape;
  // The limits hold the whole command: with --data, the oracle's memory comes on top of the run's.
  RunCost cost = run_cost(schedule, problem, options);
  if (data) cost.data_bytes = saturating_add(cost.data_bytes, oracle_bytes(problem, info.pass == Pass::backward));
  require_within_limits(schedule, problem, options, cost);
  if (checks_only) return 0;
  const auto start = std::chrono::steady_clock::now();
  const RunResult result = run_schedule(schedule, problem, options);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::cout << schedule << " (" << info.paper << ", " << info.source << "): " << info.description << "\n";
  std::cout << "problem: batch " << problem.batch << ", heads " << problem.heads_q << "/" << problem.heads_kv << ", N "
            << problem.seqlen_q << " x " << problem.seqlen_k << ", d " << problem.head_dim << "/" << problem.value_dim()
            << ", " << to_string(problem.dtype) << (problem.mask.causal ? ", causal" : "") << "\n";
  std::cout << "SRAM M = " << options.sram_bytes << " B (" << sram_elements(options.sram_bytes, problem.dtype)
            << " elements); blocks Br " << result.blocks.block_rows << ", Bc " << result.blocks.block_cols << "; "
            << to_string(options.memory) << " model, " << result.heads_run << " of " << result.heads_total
            << " heads run, " << std::setprecision(3) << seconds << " s\n";
  std::cout << "block rule      " << result.block_rule
            << (result.arena_bytes != options.sram_bytes ? "; arena grown to its working set, " + std::to_string(result.arena_bytes) + " B"
                                                          : "")
            << "\n\n";
  print_counters(std::cout, result.counters);
  const Counters expected =
      closed_form(schedule, problem, result.blocks, result.arena_bytes, options.kv_cache, options.group_reduction);
  const bool exact = expected.tensor == result.counters.tensor;
  std::cout << "closed form     " << human_bytes(static_cast<double>(expected.hbm_bytes()))
            << (exact ? " (equal, per tensor)" : " (DIFFERS)") << "\n";
  const Bound bound = schedule_bound(schedule, problem, options.sram_bytes);
  const double heads = static_cast<double>(problem.batch) * problem.heads_q;
  std::cout << "bound           " << bound.formula << " (" << bound.source << ") = " << std::setprecision(4)
            << bound.elements * heads << " elements; counted / bound = "
            << static_cast<double>(hbm_elements(result.counters)) / (bound.elements * heads) << "\n";
  if (!bound.warning.empty()) std::cerr << "warning: " << bound.warning << "\n";
  nlohmann::json json{{"format", "flashlab-run"}, {"version", 1}, {"command", command}, {"schedule", schedule},
                      {"blocks", to_json(result.blocks)}, {"sram_bytes", options.sram_bytes},
                      {"memory", to_string(options.memory)}, {"counters", to_json(result.counters)},
                      {"closed_form_equal", exact}, {"seconds", seconds}, {"block_rule", result.block_rule},
                      {"arena_bytes", result.arena_bytes}};
  if (info.pass == Pass::backward && problem.group_size() > 1) {
    std::cout << "dK/dV reduction " << to_string(options.group_reduction) << " over groups of " << problem.group_size() << "\n";
    json["dkv_reduction"] = to_string(options.group_reduction);
  }
  json["bound"] = {{"formula", bound.formula}, {"source", bound.source}, {"elements", bound.elements * heads}};
  if (!bound.warning.empty()) json["bound_warning"] = bound.warning;
  if (info.pass == Pass::decode) {  // what a serving engine reports per generated token
    const ServingMetrics serving = serving_metrics(problem, result.counters, options.kv_cache);
    print_serving(std::cout, serving);
    json["serving"] = to_json(serving);
  }
  if (machine) {
    const Roofline r = roofline(result.counters, *machine);
    std::cout << "roofline        " << std::setprecision(3) << r.seconds * 1e3 << " ms on " << machine->key << ", bound by "
              << r.bound_by << " (HBM " << r.hbm_seconds * 1e3 << " ms, matmul " << r.matmul_seconds * 1e3 << " ms, exp "
              << r.exp_seconds * 1e3 << " ms, other " << r.other_seconds * 1e3 << " ms)\n";
    json["roofline"] = to_json(r);
    json["machine"] = machine->key;
  }
  if (data) {
    const OracleResult oracle = info.pass == Pass::backward ? oracle_attention(problem, result.tensors, &result.tensors.dO)
                                                            : oracle_attention(problem, result.tensors);
    std::cout << "error vs oracle ";
    if (info.pass == Pass::backward) {
      const double dq = max_error(result.tensors.dQ, oracle.dQ), dk = max_error(result.tensors.dK, oracle.dK),
                   dv = max_error(result.tensors.dV, oracle.dV);
      std::cout << "dQ " << dq << ", dK " << dk << ", dV " << dv << "\n";
      json["errors"] = {{"dQ", dq}, {"dK", dk}, {"dV", dv}};
    } else {
      const double o = max_error(result.tensors.O, oracle.O), lse = max_error(result.tensors.LSE, oracle.LSE);
      std::cout << "O " << o << ", LSE " << lse << "\n";
      json["errors"] = {{"O", o}, {"LSE", lse}};
    }
  }
  if (!json_path.empty()) write_output_file(json_path, json.dump(2) + "\n");
  return exact ? 0 : 1;
}

int command_check(const std::string& sram, std::uint64_t seed) {
  const std::int64_t sram_bytes = parse_bytes(sram, "--sram");
  const Problem problem = default_check_problem();
  if (checks_only) return 0;
  std::cout << "check: every CPU schedule against the double-precision oracle\n"
            << "problem: batch 2, heads 4/2 (GQA), N 113 x 203, d 59, fp32, no mask; M = " << sram_bytes
            << " B; seed " << seed << "\n\n";
  std::cout << std::left << std::setw(26) << "schedule" << std::setw(31) << "paper" << std::setw(10) << "Br x Bc"
            << std::setw(12) << "HBM" << "max error vs oracle\n";
  bool all = true;
  for (const CheckRow& row : check_all(problem, sram_bytes, seed)) {
    std::ostringstream blocks, errors;
    blocks << row.blocks.block_rows << "x" << row.blocks.block_cols;
    for (const auto& [name, error] : row.errors) errors << name << " " << std::setprecision(2) << std::scientific << error << "  ";
    std::cout << std::left << std::setw(26) << row.schedule << std::setw(31) << row.paper << std::setw(10) << blocks.str()
              << std::setw(12) << human_bytes(static_cast<double>(row.hbm_bytes)) << errors.str()
              << (row.passed() ? "ok" : "FAILED") << "\n";
    all = all && row.passed();
  }
  std::cout << "\n" << (all ? "all schedules within " : "some schedules outside ") << "1e-4 (outputs) / 3e-4 (gradients)\n";
  return all ? 0 : 1;
}

int command_sweep(const std::string& schedules_text, const std::string& seqlens, const std::string& head_dims,
                  const std::string& srams, const std::string& masks, const std::string& dtype, const std::string& machine_key,
                  const std::string& json_path, const std::string& csv_path, int jobs, bool quiet,
                  const std::string& block_rule, const std::string& command) {
  require_valid_jobs(jobs);
  require_writable(json_path);
  require_writable(csv_path);
  std::optional<Machine> machine;
  if (!machine_key.empty()) machine = find_machine(machine_key);
  SweepGrid grid;
  grid.schedules = split(schedules_text == "all" ? schedule_names(",") : schedules_text);
  grid.seqlens = split_ints(seqlens, "--seqlens", 1, kMaxSweepSeqlen);
  grid.head_dims = split_ints(head_dims, "--head-dims", 1, kMaxSweepHeadDim);
  if (srams.empty() && !machine) throw BadInput("give --sram sizes or a --machine");
  if (srams.empty()) grid.sram_bytes = {machine->sram_bytes};
  for (const std::string& size : split(srams)) grid.sram_bytes.push_back(parse_bytes(size, "--sram"));
  grid.masks = split(masks);
  grid.dtype = !dtype.empty() ? dtype_from_string(dtype) : machine ? machine->dtype : DType::bf16;
  grid.block_rule = parse_block_rule(block_rule);
  grid.validate();
  if (checks_only) return 0;
  const auto start = std::chrono::steady_clock::now();
  ProgressLine progress(std::cerr, "sweep", ::isatty(2) != 0);  // stderr only: stdout and the files never change
  Progress report;
  if (!quiet) report = [&](std::size_t done, std::size_t total) { progress.update(done, total); };
  const std::vector<SweepPoint> points = run_sweep(grid, report, jobs);
  const std::vector<SweepFit> fits = fit_sweep(points);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "block rule " << to_string(grid.block_rule) << "\n";
  print_fits(std::cout, fits);
  std::cout << points.size() << " points in " << std::setprecision(3) << seconds << " s\n";
  if (!json_path.empty()) write_output_file(json_path, sweep_to_json(grid, points, fits, machine ? &*machine : nullptr, command).dump(1) + "\n");
  if (!csv_path.empty()) write_output_file(csv_path, sweep_to_csv(points, machine ? &*machine : nullptr));
  return 0;
}

int command_trace(ProblemOptions& po, const std::string& schedule, bool dtype_given, const std::string& out,
                  std::int64_t max_events, std::int64_t value_limit) {
  if (out.empty()) throw BadInput("--out: the trace file to write is required");
  require_writable(out);
  find_schedule(schedule);
  std::optional<Machine> machine;
  if (!po.machine.empty()) machine = find_machine(po.machine);
  const Problem problem = po.problem(machine ? &*machine : nullptr, dtype_given);
  if (problem.batch != 1 || problem.heads_q != 1) {  // each alone: their product could wrap
    throw BadInput("trace: batch " + std::to_string(problem.batch) + ", heads " + std::to_string(problem.heads_q) +
                   "; one head only, allowed: --batch 1 --heads 1");
  }
  RunOptions options = po.run_options(machine ? &*machine : nullptr);
  options.memory = MemoryKind::data;
  TraceRecorder recorder(static_cast<std::size_t>(max_events), value_limit);
  options.trace = &recorder;
  if (checks_only) return 0;
  const RunResult result = run_schedule(schedule, problem, options);
  TraceInfo info = trace_info(schedule, problem, options.sram_bytes, result.blocks.block_rows, result.blocks.block_cols);
  info.devices = result.blocks.devices;  // a ring's (0 for the others)
  const Trace trace = recorder.finish(info);  // TraceOverflow when the bound was hit: no file
  write_output_file(out, trace_to_json_text(trace) + "\n");
  std::cout << "trace of " << schedule << ": " << trace.events.size() << " events, HBM "
            << human_bytes(static_cast<double>(result.counters.hbm_bytes())) << " -> " << out << "\n";
  return 0;
}

int command_machines(bool as_json) {
  const std::vector<Machine> machines = load_machines();
  if (as_json) {
    nlohmann::json list = nlohmann::json::array();
    for (const Machine& m : machines) list.push_back(to_json(m));
    std::cout << list.dump(2) << "\n";
    return 0;
  }
  std::cout << "machine presets in " << machines_directory() << "\n";
  std::cout << std::left << std::setw(11) << "key" << std::right << std::setw(10) << "SRAM/block" << std::setw(12) << "HBM"
            << std::setw(14) << "matmul" << std::setw(12) << "exp" << std::setw(12) << "FP32" << "  dtype  name\n";
  for (const Machine& m : machines) {
    std::ostringstream hbm, matmul, exp, fp32;
    hbm << std::setprecision(3) << m.hbm_bytes_per_second / 1e12 << " TB/s";
    matmul << std::setprecision(4) << m.matmul_flops_per_second / 1e12 << " TF/s";
    exp << std::setprecision(3) << m.exp_per_second / 1e12 << " T/s";
    fp32 << std::setprecision(3) << m.fp32_flops_per_second / 1e12 << " TF/s";
    std::cout << std::left << std::setw(11) << m.key << std::right << std::setw(8) << m.sram_bytes / 1024 << " K"
              << std::setw(12) << hbm.str() << std::setw(14) << matmul.str() << std::setw(12) << exp.str() << std::setw(12)
              << fp32.str() << "  " << std::left << std::setw(7) << to_string(m.dtype) << m.name << "\n";
  }
  std::cout << "\nsources:\n";
  for (const Machine& m : machines) {
    std::cout << "  " << m.key << ": SRAM: " << m.sram_source << "; HBM: " << m.hbm_source << "; matmul: " << m.matmul_source
              << "; exp: " << m.exp_source << "; FP32: " << m.fp32_source << "\n";
  }
  return 0;
}

// The tilings the GPU kernels are compiled with (all of them, or those a machine preset's shared
// memory per block runs), optionally of one generation and direction.
int command_kernel_tiles(const std::string& machine_key, const std::string& generation, const std::string& direction,
                         const std::string& json_path, const std::string& command) {
  require_writable(json_path);
  std::set<std::string> generations, directions;
  for (const kernels::KernelTiling& t : kernels::dispatched_tilings()) generations.insert(t.generation), directions.insert(t.direction);
  auto require_one_of = [](const std::set<std::string>& allowed, const std::string& value, const char* what) {
    if (value.empty() || allowed.count(value) > 0) return;
    std::string list;
    for (const std::string& name : allowed) list += (list.empty() ? "" : ", ") + name;
    throw BadInput(std::string(what) + " '" + value + "' is unknown; allowed: " + list);
  };
  require_one_of(generations, generation, "generation");
  require_one_of(directions, direction, "direction");
  std::optional<Machine> machine;
  if (!machine_key.empty()) machine = find_machine(machine_key);
  const std::int64_t int_max = std::numeric_limits<int>::max();
  const std::vector<kernels::KernelTiling> all =
      machine ? kernels::tilings_for_shared_limit(static_cast<int>(std::min(machine->sram_bytes, int_max)))
              : kernels::dispatched_tilings();
  std::vector<kernels::KernelTiling> tilings;
  for (const kernels::KernelTiling& t : all) {
    if ((generation.empty() || t.generation == generation) && (direction.empty() || t.direction == direction)) tilings.push_back(t);
  }
  if (checks_only) return 0;
  if (machine) {
    std::cout << "the tilings " << machine->key << " runs (" << machine->sram_bytes << " B of shared memory per block)\n";
  } else {
    std::cout << "every tiling the kernels are compiled with (per shared-memory budget)\n";
  }
  print_kernel_tilings(std::cout, tilings);
  if (!json_path.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const kernels::KernelTiling& t : tilings) list.push_back(to_json(t));
    nlohmann::json json{{"format", "flashlab-kernel-tiles"}, {"version", 1}, {"command", command}, {"tilings", list}};
    if (machine) json["machine"] = machine->key, json["shared_limit"] = machine->sram_bytes;
    write_output_file(json_path, json.dump(2) + "\n");
  }
  return 0;
}

// The tilings of M with the least HBM traffic (or roofline time), the Pareto front against the
// working set, the block rules' place on it, and the best tiling run through the real schedule.
struct SearchCommand {
  std::string schedules = "fa2", objective = "hbm";
  int multiple_of = 1, max_rows = 0, max_cols = 0, registers_per_thread = 0, threads = 128, front_rows = 24;
  std::int64_t max_tile_steps = kMaxSearchTileSteps;
  bool square = false, exhaustive = false;
};

int command_search(ProblemOptions& po, const SearchCommand& sc, bool dtype_given, const std::string& json_path,
                   const std::string& command) {
  require_writable(json_path);
  std::optional<Machine> machine;
  if (!po.machine.empty()) machine = find_machine(po.machine);
  const Problem problem = po.problem(machine ? &*machine : nullptr, dtype_given);
  SearchOptions options;
  options.schedules = split(sc.schedules);
  try {
    options.objective = search_objective_from_string(sc.objective);
  } catch (const std::invalid_argument& error) {
    throw BadInput(std::string("--objective: ") + error.what());
  }
  SearchConstraints& c = options.constraints;
  c.sram_bytes = !po.sram.empty() ? parse_bytes(po.sram, "--sram") : machine ? machine->sram_bytes : 0;
  if (c.sram_bytes == 0) throw BadInput("give the SRAM size (--sram 228K) or a --machine");
  c.multiple_of = sc.multiple_of;
  c.max_rows = sc.max_rows;
  c.max_cols = sc.max_cols;
  c.square = sc.square;
  c.registers_per_thread = sc.registers_per_thread;
  c.threads_per_block = sc.threads;
  c.num_splits = po.splits;
  options.machine = machine ? &*machine : nullptr;
  options.exhaustive = sc.exhaustive;
  options.max_tile_steps = sc.max_tile_steps;
  validate_search(problem, options);
  if (checks_only) return 0;
  const SearchResult result = search_tilings(problem, options);
  print_search(std::cout, result, static_cast<std::size_t>(sc.front_rows));
  if (!json_path.empty()) write_output_file(json_path, search_to_json(result, command).dump(1) + "\n");
  return result.verification.closed_form_equal ? 0 : 1;
}


// Ring Attention on a machine (sim/ring.hpp): per device HBM traffic, per step the blocks held,
// link bytes and times, the overlap condition; or (--sweep) where overlap begins for each P.
struct RingCommand {
  std::string machine = "h200", ordering = "zigzag", dtype, sweep_devices = "2,4,8";
  int devices = 8, seqlen_per_device = 32768, batch = 1, heads = 32, heads_kv = 0, head_dim = 128, head_dim_v = 0;
  int block_rows = 0, block_cols = 0, granularity = 64;
  bool causal = false, backward = false, sweep = false;

  void add_to(CLI::App& app) {
    app.add_option("--machine", machine, "machine preset with a link (flashlab machines; default h200)");
    add_decimal_option(app, "--devices,-P", devices, "devices in the ring", 1, kMaxRingDevices);
    add_decimal_option(app, "--seqlen-per-device", seqlen_per_device, "tokens per device (the sequence is P times as long)", 1,
                       kMaxSequenceLength);
    add_decimal_option(app, "--batch", batch, "batch size", 1, kMaxBatch);
    add_decimal_option(app, "--heads", heads, "query heads", 1, kMaxHeads);
    add_decimal_option(app, "--heads-kv", heads_kv, "key/value heads (0: --heads; GQA/MQA when fewer)", 0, kMaxHeads);
    add_decimal_option(app, "--head-dim,-d", head_dim, "head dimension d", 1, kMaxHeadDim);
    add_decimal_option(app, "--head-dim-v", head_dim_v, "value head dimension (0: d)", 0, kMaxHeadDim);
    app.add_option("--dtype", dtype, "fp32, fp16 or bf16 (default: the machine's)");
    app.add_flag("--causal", causal, "causal mask");
    app.add_option("--ordering", ordering, "which positions each device holds: contiguous, striped or zigzag (default)");
    app.add_flag("--backward", backward, "the backward pass (dK, dV travel with K, V)");
    add_decimal_option(app, "--block-rows", block_rows, "explicit Br inside each device (0: derived from the machine's SRAM)", 0,
                       kMaxSequenceLength);
    add_decimal_option(app, "--block-cols", block_cols, "explicit Bc (0: derived)", 0, kMaxSequenceLength);
    app.add_flag("--sweep", sweep, "the shortest seqlen per device at which every step hides its transfer, for each of --sweep-devices");
    app.add_option("--sweep-devices", sweep_devices, "comma-separated P of the sweep (default 2,4,8)");
    add_decimal_option(app, "--granularity", granularity, "the sweep's step in tokens per device", 1, 1 << 20);
  }
};

int command_ring(const RingCommand& rc, const std::string& json_path, const std::string& command) {
  require_writable(json_path);
  const Machine machine = find_machine(rc.machine);
  RingTiling tiling;
  tiling.devices = rc.devices;
  try {
    tiling.ordering = ring_ordering_from_string(rc.ordering);
  } catch (const std::invalid_argument& error) {
    throw BadInput(std::string("--ordering: ") + error.what());
  }
  if ((rc.block_rows > 0) != (rc.block_cols > 0)) throw BadInput("give both --block-rows and --block-cols, or neither");
  Problem problem;
  problem.batch = rc.batch;
  problem.heads_q = rc.heads;
  problem.heads_kv = rc.heads_kv > 0 ? rc.heads_kv : rc.heads;
  problem.head_dim = rc.head_dim;
  problem.head_dim_v = rc.head_dim_v;
  problem.mask.causal = rc.causal;
  problem.dtype = rc.dtype.empty() ? machine.dtype : dtype_from_string(rc.dtype);
  const std::int64_t length = std::int64_t{rc.seqlen_per_device} * rc.devices;
  if (length > kMaxSequenceLength)
    throw BadInput("--seqlen-per-device " + std::to_string(rc.seqlen_per_device) + " x --devices " + std::to_string(rc.devices) +
                   " = " + std::to_string(length) + " tokens; allowed: at most " + std::to_string(kMaxSequenceLength));
  problem.seqlen_q = problem.seqlen_k = static_cast<int>(length);
  problem.validate();
  if (machine.link_bytes_per_second <= 0) model_ring(problem, tiling, rc.backward, machine);  // refused, by name
  std::vector<int> sweep_devices;
  if (rc.sweep) sweep_devices = split_ints(rc.sweep_devices, "--sweep-devices", 1, kMaxRingDevices);
  nlohmann::json json{{"format", "flashlab-ring"}, {"version", 1}, {"command", command}, {"machine", to_json(machine)}};
  const auto print_header = [&] {
    std::cout << "Ring Attention on " << machine.key << " (" << machine.name << "): link to the next device "
              << machine.link_bytes_per_second / 1e9 << " GB/s one direction (" << machine.link_source << ")\n";
  };
  if (rc.sweep) {
    const bool blocks_given = rc.block_rows > 0;
    if (blocks_given) tiling.blocks = {rc.block_rows, rc.block_cols};
    if (checks_only) return 0;
    print_header();
    std::cout << "where overlap begins: the shortest seqlen per device (a multiple of " << rc.granularity
              << ") at which every step's transfer takes no longer than its compute, by matmul time (tensor cores at\n"
                 "their peak) and by roofline time (matmul, HBM, exponentials, other); heads " << problem.heads_q << "/"
              << problem.heads_kv << ", d " << problem.head_dim << "/" << problem.value_dim() << ", " << to_string(problem.dtype)
              << (problem.mask.causal ? ", causal" : "") << ", " << to_string(tiling.ordering) << "\n\n";
    std::cout << std::left << std::setw(6) << "P" << std::setw(10) << "pass" << std::right << std::setw(16) << "by matmul"
              << std::setw(14) << "estimate" << std::setw(14) << "by roofline" << std::setw(16) << "matmul/step" << std::setw(14)
              << "link/step" << "\n";
    nlohmann::json points = nlohmann::json::array();
    for (const int devices : sweep_devices) {
      for (const bool backward : {false, true}) {
        RingTiling t = tiling;
        t.devices = devices;
        const RingOverlapPoint p = ring_overlap_threshold(problem, t, backward, machine, rc.granularity);
        std::ostringstream at, estimate, roofline, compute, link;
        at << (p.seqlen_per_device > 0 ? std::to_string(p.seqlen_per_device) : "> 1048576");
        roofline << (p.roofline_seqlen_per_device > 0 ? std::to_string(p.roofline_seqlen_per_device) : "> 1048576");
        estimate << std::fixed << std::setprecision(0) << p.estimate;
        compute << std::setprecision(3) << p.compute_seconds * 1e6 << " us";
        link << std::setprecision(3) << p.link_seconds * 1e6 << " us";
        std::cout << std::left << std::setw(6) << devices << std::setw(10) << (backward ? "backward" : "forward") << std::right
                  << std::setw(16) << at.str() << std::setw(14) << estimate.str() << std::setw(14) << roofline.str()
                  << std::setw(16) << compute.str() << std::setw(14) << link.str() << "\n";
        points.push_back(to_json(p));
      }
    }
    std::cout << "\n(seqlen per device; estimate: F e (d + dv) / (2 g B W) tokens, F the matmul rate, B the link, W the\n"
                 "matmul work per score; the sweep runs the schedule at each length, so block edges, masked blocks and the\n"
                 "slowest device count; by roofline, short shards are HBM-bound: the merge's fp32 O, Q, the partials)\n";
    json["problem"] = {{"heads_q", problem.heads_q}, {"heads_kv", problem.heads_kv}, {"head_dim", problem.head_dim},
                       {"head_dim_v", problem.value_dim()}, {"dtype", to_string(problem.dtype)}, {"causal", problem.mask.causal}};
    json["ordering"] = to_string(tiling.ordering);
    json["granularity"] = rc.granularity;
    json["sweep"] = points;
    if (!json_path.empty()) write_output_file(json_path, json.dump(2) + "\n");
    return 0;
  }
  tiling.blocks = rc.block_rows > 0 ? BlockTiling{rc.block_rows, rc.block_cols} : ring_blocks(problem, rc.backward, machine);
  if (checks_only) {
    RunOptions options;  // the limits, before any work
    Problem unit = problem;
    unit.batch = 1, unit.heads_q = problem.group_size(), unit.heads_kv = 1;
    options.blocks = {tiling.blocks.block_rows, tiling.blocks.block_cols, 0, tiling.devices, tiling.ordering};
    const char* schedule = rc.backward ? "ring_backward" : "ring";
    require_within_limits(schedule, unit, options, run_cost(schedule, unit, options));
    return 0;
  }
  const RingModel model = model_ring(problem, tiling, rc.backward, machine);
  print_header();
  std::cout << (rc.backward ? "backward" : "forward") << ", P " << tiling.devices << ", " << to_string(tiling.ordering)
            << (problem.mask.causal ? ", causal" : "") << "; batch " << problem.batch << ", heads " << problem.heads_q << "/"
            << problem.heads_kv << ", " << rc.seqlen_per_device << " tokens per device (N " << problem.seqlen_q << "), d "
            << problem.head_dim << "/" << problem.value_dim() << ", " << to_string(problem.dtype) << "; blocks Br "
            << tiling.blocks.block_rows << ", Bc " << tiling.blocks.block_cols << "\n\n";
  std::cout << std::left << std::setw(6) << "step" << std::setw(std::max(14, 3 * tiling.devices + 2)) << "blocks held"
            << std::right << std::setw(14) << "link/device" << std::setw(14) << "compute" << std::setw(14) << "link"
            << "  hidden\n";
  for (const RingStepTime& s : model.steps) {
    std::ostringstream blocks, compute, link;
    for (const int b : s.blocks) blocks << b << " ";
    if (s.blocks.size() > 16) blocks.str("(" + std::to_string(s.blocks.size()) + " devices)");
    compute << std::setprecision(3) << s.compute_seconds * 1e3 << " ms";
    link << std::setprecision(3) << s.link_seconds * 1e3 << " ms";
    std::cout << std::left << std::setw(6) << s.step << std::setw(std::max(14, 3 * tiling.devices + 2)) << blocks.str()
              << std::right << std::setw(14) << human_bytes(static_cast<double>(s.link_bytes)) << std::setw(14) << compute.str()
              << std::setw(14) << link.str() << "  " << (s.hidden() ? "yes" : "NO") << "\n";
  }
  std::cout << "\n" << std::left << std::setw(8) << "device" << std::right << std::setw(14) << "HBM" << std::setw(16)
            << "matmul FLOPs" << std::setw(14) << "link sent" << "\n";
  for (std::size_t i = 0; i < model.devices.size(); ++i) {
    const std::int64_t sent = model.link_bytes_sent[i];
    std::ostringstream flops;
    flops << std::setprecision(4) << static_cast<double>(model.devices[i].matmul_flops);
    std::cout << std::left << std::setw(8) << i << std::right << std::setw(14)
              << human_bytes(static_cast<double>(model.devices[i].hbm_bytes())) << std::setw(16) << flops.str() << std::setw(14)
              << human_bytes(static_cast<double>(sent)) << "\n";
  }
  std::cout << std::setprecision(4) << "\ncompute " << model.compute_seconds * 1e3 << " ms, link " << model.link_seconds * 1e3
            << " ms, with the transfers overlapped " << model.seconds * 1e3 << " ms; link time hidden "
            << std::setprecision(3) << 100 * model.hidden_link_share() << " %\n"
            << "overlap condition (every step: link time <= compute time): " << (model.overlapped() ? "holds" : "FAILS")
            << " by roofline time, " << (model.overlapped_by_matmul() ? "holds" : "fails") << " by matmul time alone\n";
  json["problem"] = {{"batch", problem.batch}, {"heads_q", problem.heads_q}, {"heads_kv", problem.heads_kv},
                     {"seqlen_per_device", rc.seqlen_per_device}, {"seqlen", problem.seqlen_q},
                     {"head_dim", problem.head_dim}, {"head_dim_v", problem.value_dim()}, {"dtype", to_string(problem.dtype)},
                     {"causal", problem.mask.causal}};
  json["devices"] = tiling.devices;
  json["ordering"] = to_string(tiling.ordering);
  json["backward"] = rc.backward;
  json["blocks"] = {{"block_rows", tiling.blocks.block_rows}, {"block_cols", tiling.blocks.block_cols}};
  json["model"] = to_json(model);
  if (!json_path.empty()) write_output_file(json_path, json.dump(2) + "\n");
  return 0;
}

// A GPU kernel through the three-level model (sim/hierarchy.hpp) and the time model.
struct HardwareCommand {
  std::string kernel = "fa2", direction = "forward", l2, layout = "flash";
  bool backward = false, deterministic = false, no_l2_sections = false;
  int sms = 0, blocks_per_sm = 0, l2_partitions = 0;
};

int command_hardware(ProblemOptions& po, const HardwareCommand& hc, bool dtype_given, const std::string& json_path,
                     const std::string& command) {
  require_writable(json_path);
  if (!po.sram.empty()) throw BadInput("--sram with hardware: the kernel's tiling sets its shared memory; allowed: none (--l2 sets the L2)");
  if (po.splits != 0) throw BadInput("--splits with hardware; allowed: none (split-KV is no kernel of the ladder)");
  const Machine machine = find_machine(po.machine.empty() ? "h200" : po.machine);
  KernelChoice kernel;
  kernel.generation = hc.kernel;
  kernel.direction = hc.backward ? "backward" : hc.direction;
  kernel.deterministic = hc.deterministic;
  kernel.l2_sections = !hc.no_l2_sections;
  kernel.layout = hc.layout;
  kernel_schedule(kernel);  // the kernel's name first
  if (!dtype_given && hc.kernel == "fa1") po.dtype = "fp16";  // the FA1 kernel is fp16 only
  const Problem problem = po.problem(dtype_given || hc.kernel == "fa1" ? nullptr : &machine, dtype_given || hc.kernel == "fa1");
  HierarchyOptions options;
  if (!hc.l2.empty()) options.l2_bytes = parse_bytes(hc.l2, "--l2");
  options.sm_count = hc.sms;
  options.l2_partitions = hc.l2_partitions;
  options.blocks_per_sm = hc.blocks_per_sm;
  if (checks_only) return 0;
  const HierarchyResult result = run_hierarchy(kernel, problem, machine, options);
  std::optional<TimePrediction> time;
  if (machine.time_model) time = predict_time(result, machine);
  std::cout << "problem: batch " << problem.batch << ", heads " << problem.heads_q << "/" << problem.heads_kv << ", N "
            << problem.seqlen_q << " x " << problem.seqlen_k << ", d " << problem.head_dim << ", " << to_string(problem.dtype)
            << (problem.mask.causal ? ", causal" : "") << "; machine " << machine.key << "\n";
  print_hierarchy(std::cout, result, time);
  if (!json_path.empty()) {
    nlohmann::json json = hierarchy_to_json(result, time);
    json["format"] = "flashlab-hardware";
    json["version"] = 1;
    json["command"] = command;
    json["machine"] = machine.key;
    json["problem"] = {{"batch", problem.batch}, {"heads_q", problem.heads_q}, {"heads_kv", problem.heads_kv},
                       {"seqlen_q", problem.seqlen_q}, {"seqlen_k", problem.seqlen_k}, {"head_dim", problem.head_dim},
                       {"dtype", to_string(problem.dtype)}, {"causal", problem.mask.causal}};
    write_output_file(json_path, json.dump(2) + "\n");
  }
  return 0;
}

}  // namespace

int flashlab::cli::run(int argc, char** argv, Mode mode) {
  checks_only = mode == Mode::checks_only;
  CLI::App app{"flashlab: the FlashAttention IO simulator (counts HBM/SRAM traffic of every schedule)"};
  app.set_version_flag("--version", std::string("flashlab ") + FLASHLAB_VERSION);
  app.require_subcommand(1);
  const std::string command = command_line(argc, argv);

  std::string schedule = "fa2", json_path, csv_path, out, dtype_text;
  bool data = false;
  ProblemOptions run_problem, trace_problem;
  CLI::App* run = app.add_subcommand("run", "run one schedule on one problem: counters, closed form, bound (+ error vs the oracle with --data)");
  run->add_option("--schedule,-s", schedule, "schedule name (" + schedule_names() + ")");
  run->add_flag("--data", data, "run on random data (DataMemory) and compare with the oracle; default: shape-only");
  run->add_option("--json", json_path, "write the result as JSON");
  run_problem.add_to(*run);
  KvCacheOptions run_kv_cache;
  run_kv_cache.add_to(*run);

  std::string check_sram = "64K";
  std::uint64_t seed = 2024;
  CLI::App* check = app.add_subcommand("check", "every CPU schedule on the default problem: max error against the double oracle");
  check->add_option("--sram,-M", check_sram, "SRAM size M the block sizes are derived from (default 64K)");
  add_decimal_option(*check, "--seed", seed, "seed of the random inputs", std::uint64_t{0},
                     std::numeric_limits<std::uint64_t>::max());

  std::string sweep_schedules = "standard,fa1,fa2", seqlens = "1024,2048,4096", head_dims = "64", srams, masks = "none",
              machine_key;
  CLI::App* sweep = app.add_subcommand("sweep", "a grid of schedules x N x d x M x mask, counted shape-only, to JSON and CSV");
  sweep->add_option("--schedules", sweep_schedules, "comma-separated schedule names, or 'all'");
  sweep->add_option("--seqlens", seqlens, "comma-separated N");
  sweep->add_option("--head-dims", head_dims, "comma-separated d");
  sweep->add_option("--sram", srams, "comma-separated M in bytes (K/M suffixes); default: the machine's");
  sweep->add_option("--masks", masks, "comma-separated: none, causal, window:W, sparse:S");
  sweep->add_option("--dtype", dtype_text, "fp32, fp16 or bf16 (default: the machine's, else bf16)");
  sweep->add_option("--machine", machine_key, "machine preset for the roofline time");
  sweep->add_option("--json", json_path, "write every point and the fits as JSON (schema: docs/schemas/sweep.schema.json)");
  sweep->add_option("--csv", csv_path, "write every point as CSV (one header row; the provenance is in the JSON)");
  int jobs = 1;
  bool quiet = false;
  add_decimal_option(*sweep, "--jobs,-j", jobs, "threads counting points (results identical to --jobs 1, in the same order)", 1,
                     kMaxSweepJobs);
  sweep->add_flag("--quiet,-q", quiet, "no progress lines on stderr");
  std::string sweep_block_rule = "fitting", experiment_block_rule = "fitting";
  sweep->add_option("--block-rule", sweep_block_rule, kBlockRuleHelp);

  std::int64_t max_events = TraceRecorder::kDefaultMaxEvents;
  std::int64_t value_limit = 4096;
  CLI::App* trace = app.add_subcommand("trace", "record one head's events (load, store, compute, softmax state) to a trace JSON");
  trace->add_option("--schedule,-s", schedule, "schedule name");
  trace->add_option("--out,-o", out, "the trace file to write");
  add_decimal_option(*trace, "--max-events", max_events, "bound on recorded events (a larger run fails, never truncates)",
                     std::int64_t{1}, kMaxTraceEvents);
  add_decimal_option(*trace, "--value-elements", value_limit, "S and P tiles up to this many elements keep their values",
                     std::int64_t{0}, kMaxTraceValueElements);
  trace_problem.seqlen = 128;
  trace_problem.head_dim = 16;
  trace_problem.add_to(*trace);

  bool as_json = false;
  CLI::App* machines = app.add_subcommand("machines", "list the machine presets and their sources");
  machines->add_flag("--json", as_json, "print the presets as JSON");

  std::string out_dir = ".";
  CLI::App* experiment = app.add_subcommand("experiment", "the default experiment: sweep on the embedded H100, table, fits, Saha-Ye crossover, JSON");
  experiment->add_option("--out-dir", out_dir, "directory for experiment.json");
  experiment->add_option("--machine", machine_key, "a preset instead of the embedded H100");
  experiment->add_option("--block-rule", experiment_block_rule, kBlockRuleHelp);

  CLI::App* figure2 = app.add_subcommand("figure2", "FA1 Figure 2's HBM column: GPT-2 medium forward + backward on an A100");
  figure2->add_option("--json", json_path, "write the table as JSON");

  std::string tiles_machine, tiles_generation, tiles_direction;
  CLI::App* kernel_tiles = app.add_subcommand("kernel-tiles", "the GPU kernels' tilings (block sizes, warps, stages, shared memory), as compiled");
  kernel_tiles->add_option("--machine", tiles_machine, "only the tilings this preset's shared memory per block runs (key or .json path)");
  kernel_tiles->add_option("--generation", tiles_generation, "only this generation (fa1, fa2)");
  kernel_tiles->add_option("--direction", tiles_direction, "only this direction (forward, backward)");
  kernel_tiles->add_option("--json", json_path, "write the tilings as JSON");

  SearchCommand search_command;
  ProblemOptions search_problem;
  CLI::App* search = app.add_subcommand("search", "the block sizes of M with the least HBM traffic or time: best, Pareto front, the rules' place");
  search->add_option("--schedule,--schedules,-s", search_command.schedules,
                     "schedule, or loop orders of one pass to compare (fa1,fa2)");
  search->add_option("--objective", search_command.objective, "hbm (HBM bytes; default) or time (roofline, needs --machine)");
  add_decimal_option(*search, "--multiple-of", search_command.multiple_of, "Br and Bc multiples of this (16: tensor-core tiles)", 1,
                     1 << 16);
  add_decimal_option(*search, "--max-rows", search_command.max_rows, "Br at most this (0: no limit)", 0, kMaxSequenceLength);
  add_decimal_option(*search, "--max-cols", search_command.max_cols, "Bc at most this (0: no limit)", 0, kMaxSequenceLength);
  search->add_flag("--square", search_command.square, "square blocks only (Br = Bc)");
  add_decimal_option(*search, "--registers-per-thread", search_command.registers_per_thread,
                     "register budget: fp32 accumulator elements per thread (S_ij and the output tile; 0: none)", 0, 1 << 16);
  add_decimal_option(*search, "--threads", search_command.threads, "threads per block sharing the accumulators (default 128)", 1,
                     1 << 16);
  search->add_flag("--exhaustive", search_command.exhaustive, "cost every candidate (default: one per block count where that is exact)");
  add_decimal_option(*search, "--max-tile-steps", search_command.max_tile_steps,
                     "closed-form work the search spends at most (more: a fuller front, slower)", std::int64_t{1},
                     std::int64_t{1} << 40);
  add_decimal_option(*search, "--front-rows", search_command.front_rows, "Pareto-front rows printed (the JSON has all)", 1, 1 << 20);
  search->add_option("--json", json_path, "write the result as JSON (schema: docs/schemas/search.schema.json)");
  search_problem.seqlen = 16384;
  search_problem.head_dim = 128;
  search_problem.add_to(*search, false);

  RingCommand ring_command;
  CLI::App* ring = app.add_subcommand("ring", "Ring Attention over P devices on a machine: HBM per device, link bytes per step, "
                                               "the overlap condition; --sweep: where overlap begins");
  ring_command.add_to(*ring);
  ring->add_option("--json", json_path, "write the result as JSON (schema: docs/schemas/ring.schema.json)");
  HardwareCommand hardware_command;
  ProblemOptions hardware_problem;
  CLI::App* hardware =
      app.add_subcommand("hardware", "a GPU kernel through the three-level model (DRAM, a shared L2, SRAM) and its time model");
  hardware->add_option("--kernel,-k", hardware_command.kernel, "fa1, fa2 or fa3 (the kernel ladder's rungs)");
  hardware->add_option("--direction", hardware_command.direction, "forward (default) or backward");
  hardware->add_flag("--backward", hardware_command.backward, "the backward kernel (same as --direction backward)");
  hardware->add_flag("--deterministic", hardware_command.deterministic, "backward: the deterministic dQ order");
  hardware->add_flag("--no-l2-sections", hardware_command.no_l2_sections,
                     "fa3: one section of every head in the tile order (the forward's causal order before the L2 sections)");
  hardware->add_option("--layout", hardware_command.layout,
                       "flash ([batch * seqlen, heads, dim], the benchmark binaries'; default) or bhsd ([batch, heads, seqlen, dim], "
                       "scripts/bench_kernels.py's)");
  hardware->add_option("--l2", hardware_command.l2, "L2 size in bytes (K/M suffixes), instead of the machine's");
  add_decimal_option(*hardware, "--l2-partitions", hardware_command.l2_partitions,
                     "L2 partitions, instead of the machine's (0: the machine's; 1: one shared cache)", 0, 64);
  add_decimal_option(*hardware, "--sms", hardware_command.sms, "SMs, instead of the machine's (0: the machine's)", 0, 1 << 16);
  add_decimal_option(*hardware, "--blocks-per-sm", hardware_command.blocks_per_sm,
                     "resident blocks per SM, instead of the occupancy (0: the occupancy)", 0, 1024);
  hardware->add_option("--json", json_path, "write the result as JSON (schema: docs/schemas/hardware.schema.json)");
  hardware_problem.seqlen = 4096;
  hardware_problem.head_dim = 128;
  hardware_problem.heads = 16;
  hardware_problem.add_to(*hardware, false);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::cerr << "flashlab: " << error.what() << "\n";
    return 2;
  }
  try {
    if (*run) {
      return command_run(run_problem, schedule, data, run->count("--dtype") > 0, json_path, command, run_kv_cache,
                         run->count("--page-reads") > 0, run->count("--dkv-reduction") > 0);
    }
    if (*check) return command_check(check_sram, seed);
    if (*sweep) {
      return command_sweep(sweep_schedules, seqlens, head_dims, srams, masks, dtype_text, machine_key, json_path, csv_path, jobs, quiet,
                           sweep_block_rule, command);
    }
    if (*trace) return command_trace(trace_problem, schedule, trace->count("--dtype") > 0, out, max_events, value_limit);
    if (*machines) return command_machines(as_json);
    if (*ring) return command_ring(ring_command, json_path, command);
    if (*search) return command_search(search_problem, search_command, search->count("--dtype") > 0, json_path, command);
    if (*hardware) return command_hardware(hardware_problem, hardware_command, hardware->count("--dtype") > 0, json_path, command);
    if (*kernel_tiles) return command_kernel_tiles(tiles_machine, tiles_generation, tiles_direction, json_path, command);
    if (*experiment) {
      const Machine machine = machine_key.empty() ? default_machine() : find_machine(machine_key);
      const BlockRule rule = parse_block_rule(experiment_block_rule);
      if (!std::filesystem::is_directory(out_dir)) throw BadInput("--out-dir " + out_dir + " is not a directory");
      const std::string path = (std::filesystem::path(out_dir) / "experiment.json").string();
      require_writable(path);
      if (checks_only) return 0;
      const ExperimentResult result = run_experiment(machine, std::cout, rule);
      write_output_file(path, experiment_to_json(result, command).dump(1) + "\n");
      std::cout << "wrote " << path << "\n";
      return 0;
    }
    if (*figure2) {
      require_writable(json_path);
      if (checks_only) return 0;
      const nlohmann::json table = run_figure2(find_machine("a100"), std::cout);
      if (!json_path.empty()) write_output_file(json_path, nlohmann::json{{"format", "flashlab-figure2"}, {"version", 1}, {"command", command}, {"rows", table}}.dump(2) + "\n");
      return 0;
    }
  } catch (const std::invalid_argument& error) {
    std::cerr << "flashlab: " << error.what() << "\n";
    return 2;
  } catch (const SramOverflow& error) {
    std::cerr << "flashlab: " << error.what() << "\n";
    return 2;
  } catch (const TraceOverflow& error) {
    std::cerr << "flashlab: " << error.what() << "\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "flashlab: internal error: " << error.what() << "\n";
    return 3;
  }
  return 0;
}

#ifndef FLASHLAB_CLI_NO_MAIN
int main(int argc, char** argv) { return flashlab::cli::run(argc, argv); }
#endif
