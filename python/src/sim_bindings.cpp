// The IO simulator (sim/): the schedule registry, runs, sweeps, traces, machine presets, the
// closed forms and the bounds. Results come back as the records the C++ printers write (the
// CLI's JSON, sim/report.hpp and sim/sweep.hpp), converted to dicts; the work runs without the GIL.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithms/tile_memory.hpp"
#include "bindings.hpp"
#include "json_to_python.hpp"
#include "kernels/tilings.hpp"
#include "sim/bounds.hpp"
#include "sim/check.hpp"
#include "sim/closed_forms.hpp"
#include "sim/decimal.hpp"
#include "sim/hardware_report.hpp"
#include "sim/hierarchy.hpp"
#include "sim/machines.hpp"
#include "sim/report.hpp"
#include "sim/ring.hpp"
#include "sim/schedules.hpp"
#include "sim/serving.hpp"
#include "sim/search.hpp"
#include "sim/sweep.hpp"
#include "sim/time_model.hpp"
#include "sim/trace.hpp"

namespace nb = nanobind;
using nlohmann::json;

namespace flashlab::python {

namespace {

using namespace flashlab::sim;

const char* to_string(Pass pass) {
  switch (pass) {
    case Pass::forward: return "forward";
    case Pass::backward: return "backward";
    case Pass::decode: return "decode";
  }
  return "?";
}

const char* to_string(CausalAlignment alignment) {
  return alignment == CausalAlignment::top_left ? "top_left" : "bottom_right";
}

json to_json(const Bound& bound) {
  json record{{"formula", bound.formula}, {"source", bound.source}, {"elements", bound.elements}};
  if (!bound.warning.empty()) record["warning"] = bound.warning;  // M outside the theorem's d <= M <= N d
  return record;
}

// A machine preset by key (among the directory's) or path; none for an empty key.
std::optional<Machine> optional_machine(const std::string& key_or_path, const std::string& directory) {
  if (key_or_path.empty()) return std::nullopt;
  return find_machine(key_or_path, directory);
}

RunOptions run_options(const std::string& memory, std::int64_t sram_bytes, const BlockSizes& blocks, std::uint64_t seed,
                       bool every_head) {
  RunOptions options;
  options.memory = memory_kind_from_string(memory);
  options.sram_bytes = sram_bytes;
  options.blocks = blocks;
  options.seed = seed;
  options.every_head = every_head;
  return options;
}

json run_json(const std::string& schedule, const Problem& problem, const RunOptions& options, const Machine* machine) {
  const RunResult result = run_schedule(schedule, problem, options);
  const double heads = static_cast<double>(problem.batch) * problem.heads_q;
  Bound bound = schedule_bound(schedule, problem, options.sram_bytes);
  bound.elements *= heads;
  const Counters expected =
      closed_form(schedule, problem, result.blocks, result.arena_bytes, options.kv_cache, options.group_reduction);
  json record{{"schedule", schedule},
              {"memory", sim::to_string(options.memory)},
              {"sram_bytes", options.sram_bytes},
              {"blocks", sim::to_json(result.blocks)},
              {"heads_total", result.heads_total},
              {"heads_run", result.heads_run},
              {"counters", sim::to_json(result.counters)},
              {"closed_form", sim::to_json(expected)},
              {"closed_form_equal", expected.tensor == result.counters.tensor},
              {"bound", to_json(bound)},
              {"machine", nullptr},
              {"roofline", nullptr},
              {"block_rule", result.block_rule},
              {"arena_bytes", result.arena_bytes}};
  if (machine) {
    record["machine"] = machine->key;
    record["roofline"] = sim::to_json(roofline(result.counters, *machine));
  }
  record["serving"] = nullptr;
  if (find_schedule(schedule).pass == Pass::decode) {
    record["serving"] = sim::to_json(serving_metrics(problem, result.counters, options.kv_cache));
  }
  return record;
}

json check_json(const CheckRow& row) {
  json errors = json::object();
  for (const auto& [name, error] : row.errors) errors[name] = error;
  return {{"schedule", row.schedule}, {"paper", row.paper},         {"blocks", sim::to_json(row.blocks)},
          {"errors", errors},         {"hbm_bytes", row.hbm_bytes}, {"tolerance", row.tolerance},
          {"passed", row.passed()}};
}

nb::dict trace_info_dict(const TraceInfo& info) {
  nb::dict d;
  d["schedule"] = info.schedule;
  d["seqlen_q"] = info.seqlen_q;
  d["seqlen_k"] = info.seqlen_k;
  d["head_dim"] = info.head_dim;
  d["head_dim_v"] = info.head_dim_v;
  d["dtype"] = flashlab::to_string(info.dtype);
  d["causal"] = info.mask.causal;
  d["alignment"] = to_string(info.mask.alignment);
  d["window_left"] = info.mask.window_left;
  d["window_right"] = info.mask.window_right;
  d["sram_capacity_bytes"] = info.sram_capacity_bytes;
  d["block_rows"] = info.block_rows;
  d["block_cols"] = info.block_cols;
  return d;
}

// One event as a flat record (a DataFrame row); the per-row softmax state and the tile values
// only where the event has them.
nb::dict event_dict(const RecordedEvent& event) {
  nb::dict d;
  d["kind"] = flashlab::to_string(event.kind);
  d["tensor"] = flashlab::to_string(event.tensor);
  d["row_begin"] = event.rows.begin;
  d["row_count"] = event.rows.size;
  d["col_begin"] = event.cols.begin;
  d["col_count"] = event.cols.size;
  d["op"] = event.op;
  d["line"] = event.line;
  d["sram_bytes"] = event.sram_bytes;
  d["bytes"] = event.bytes;
  if (!event.row_max.empty()) {
    d["row_max"] = event.row_max;
    d["row_sum"] = event.row_sum;
    d["rescale"] = event.rescale;
  }
  if (!event.values.empty()) d["values"] = event.values;
  return d;
}

void bind_trace(nb::module_& m) {
  nb::class_<Trace>(m, "Trace", "one head's recorded events (sim/trace.hpp), as the visualizer reads them")
      .def_prop_ro("info", [](const Trace& t) { return trace_info_dict(t.info); })
      .def_prop_ro("events", [](const Trace& t) {
        nb::list events;
        for (const RecordedEvent& event : t.events) events.append(event_dict(event));
        return events;
      })
      .def("__len__", [](const Trace& t) { return t.events.size(); })
      .def("save", [](const Trace& t, const std::string& path) { save_trace(path, t); }, nb::arg("path"),
           "writes the visualizer's trace file (whole or not at all)")
      .def("to_json", [](const Trace& t, int indent) { return trace_to_json_text(t, indent); }, nb::arg("indent") = -1);

  m.def("load_trace", &load_trace, nb::arg("path"), "reads and checks a trace file");

  m.def("trace", [](const std::string& schedule, const Problem& problem, std::int64_t sram_bytes, const BlockSizes& blocks,
                    std::int64_t max_events, std::int64_t value_elements, std::uint64_t seed) {
    find_schedule(schedule);
    problem.validate();
    if (problem.batch != 1 || problem.heads_q != 1) {
      throw std::invalid_argument("trace: batch " + std::to_string(problem.batch) + ", heads_q " +
                                  std::to_string(problem.heads_q) + "; one head only, allowed: batch = 1, heads_q = 1");
    }
    if (max_events < 1 || max_events > kMaxTraceEvents) {
      throw std::invalid_argument("max_events = " + std::to_string(max_events) + " is out of range; allowed: [1, " +
                                  std::to_string(kMaxTraceEvents) + "]");
    }
    nb::gil_scoped_release release;
    TraceRecorder recorder(static_cast<std::size_t>(max_events), value_elements);
    RunOptions options = run_options("data", sram_bytes, blocks, seed, false);
    options.trace = &recorder;
    const RunResult result = run_schedule(schedule, problem, options);
    return recorder.finish(trace_info(schedule, problem, sram_bytes, result.blocks.block_rows, result.blocks.block_cols));
  }, nb::arg("schedule"), nb::arg("problem"), nb::arg("sram_bytes"), nb::arg("blocks"), nb::arg("max_events"),
     nb::arg("value_elements"), nb::arg("seed"));
}

void bind_bounds(nb::module_& m) {
  m.def("schedule_bound", [](const std::string& schedule, const Problem& problem, std::int64_t sram_bytes, double sparsity) {
    find_schedule(schedule);
    problem.validate();
    return to_python(to_json(schedule_bound(schedule, problem, sram_bytes, sparsity)));
  }, nb::arg("schedule"), nb::arg("problem"), nb::arg("sram_bytes"), nb::arg("sparsity") = 1.0);
  m.def("lower_bound", [](const Problem& problem, std::int64_t sram_bytes) {
    problem.validate();
    return to_python(to_json(lower_bound(problem, sram_bytes)));
  }, nb::arg("problem"), nb::arg("sram_bytes"));
  m.def("bound_formulas", [](const Problem& problem, std::int64_t sram_bytes, double sparsity) {
    problem.validate();
    const BoundInputs x = bound_inputs(problem, sram_bytes, sparsity);
    nb::dict d;
    d["standard"] = standard_bound(x);
    d["flash"] = flash_bound(x);
    d["block_sparse"] = block_sparse_bound(x);
    d["saha_ye_lower"] = saha_ye_lower_bound(x);
    d["compulsory"] = compulsory_traffic(x);
    d["memory_efficient"] = memory_efficient_bound(x);
    d["square_tiling"] = square_tiling_bound(x);
    return d;
  }, nb::arg("problem"), nb::arg("sram_bytes"), nb::arg("sparsity") = 1.0);
  m.def("theory_exponents", [](const std::string& schedule, double m_elements, double head_dim) {
    find_schedule(schedule);
    const Exponents e = theory_exponents(schedule, m_elements, head_dim);
    nb::dict d;
    d["n"] = e.n;
    d["m"] = e.m;
    d["d"] = e.d;
    return d;
  }, nb::arg("schedule"), nb::arg("m_elements"), nb::arg("head_dim"));
}

void bind_closed_forms(nb::module_& m) {
  m.def("closed_form", [](const std::string& schedule, const Problem& problem, const BlockSizes& blocks, std::int64_t sram_bytes) {
    find_schedule(schedule);
    problem.validate();
    return to_python(sim::to_json(closed_form(schedule, problem, blocks, sram_bytes)));
  }, nb::arg("schedule"), nb::arg("problem"), nb::arg("blocks"), nb::arg("sram_bytes") = 0);
  m.def("working_set_bytes", [](const std::string& schedule, const Problem& problem, const BlockSizes& blocks) {
    find_schedule(schedule);
    problem.validate();
    return working_set_bytes(schedule, problem, blocks);
  }, nb::arg("schedule"), nb::arg("problem"), nb::arg("blocks"));
  m.def("derive_blocks", [](const std::string& schedule, const Problem& problem, std::int64_t sram_bytes) {
    find_schedule(schedule);
    problem.validate();
    return derive_blocks(schedule, problem, sram_bytes);
  }, nb::arg("schedule"), nb::arg("problem"), nb::arg("sram_bytes"));
}

void bind_machines(nb::module_& m) {
  m.def("machines", [](const std::string& directory) {
    nb::list list;
    for (const Machine& machine : load_machines(directory)) list.append(to_python(sim::to_json(machine)));
    return list;
  }, nb::arg("directory"));
  m.def("machine", [](const std::string& key_or_path, const std::string& directory) {
    return to_python(sim::to_json(find_machine(key_or_path, directory)));
  }, nb::arg("key_or_path"), nb::arg("directory"));
  // The GPU kernels' compiled tilings (kernels/tilings.hpp, plain C++): all, or those that a
  // preset's shared memory per block runs.
  m.def("kernel_tilings", [](const std::string& machine_key, const std::string& directory) {
    const std::optional<Machine> machine = optional_machine(machine_key, directory);
    const std::int64_t int_max = std::numeric_limits<int>::max();
    const std::vector<kernels::KernelTiling> tilings =
        machine ? kernels::tilings_for_shared_limit(static_cast<int>(std::min(machine->sram_bytes, int_max)))
                : kernels::dispatched_tilings();
    nb::list list;
    for (const kernels::KernelTiling& tiling : tilings) list.append(to_python(sim::to_json(tiling)));
    return list;
  }, nb::arg("machine"), nb::arg("directory"));
}

// Ring Attention on a machine (sim/ring.hpp): one run's model, and where overlap begins.
void bind_ring(nb::module_& m) {
  m.def("ring_model", [](const Problem& problem, int devices, const std::string& ordering, bool backward, int block_rows,
                         int block_cols, const std::string& machine_key, const std::string& directory) {
    const Machine machine = find_machine(machine_key, directory);
    RingTiling tiling{{block_rows, block_cols}, devices, ring_ordering_from_string(ordering)};
    tiling.validate_devices();  // before any blocks are derived
    json record;
    {
      nb::gil_scoped_release release;
      if (block_rows == 0 && block_cols == 0) tiling.blocks = ring_blocks(problem, backward, machine);
      record = to_json(model_ring(problem, tiling, backward, machine));
      record["blocks"] = {{"block_rows", tiling.blocks.block_rows}, {"block_cols", tiling.blocks.block_cols},
                          {"devices", devices}, {"ordering", to_string(tiling.ordering)}};
      record["machine"] = machine.key;
    }
    return to_python(record);
  }, nb::arg("problem"), nb::arg("devices"), nb::arg("ordering"), nb::arg("backward"), nb::arg("block_rows"),
     nb::arg("block_cols"), nb::arg("machine"), nb::arg("directory"));
  m.def("ring_overlap", [](const Problem& shape, int devices, const std::string& ordering, bool backward,
                           const std::string& machine_key, const std::string& directory, int granularity) {
    const Machine machine = find_machine(machine_key, directory);
    RingTiling tiling{{0, 0}, devices, ring_ordering_from_string(ordering)};
    json record;
    {
      nb::gil_scoped_release release;
      record = to_json(ring_overlap_threshold(shape, tiling, backward, machine, granularity));
    }
    return to_python(record);
  }, nb::arg("problem"), nb::arg("devices"), nb::arg("ordering"), nb::arg("backward"), nb::arg("machine"),
     nb::arg("directory"), nb::arg("granularity"));
}

// A GPU kernel through the three-level model (sim/hierarchy.hpp), kept with its machine so that
// the time model can be asked again with other constants (the calibration does).
struct HardwareRun {
  HierarchyResult result;
  Machine machine;
};

KernelTimeConstants constants_from(const nb::dict& constants) {
  KernelTimeConstants c;
  for (const auto& [key, value] : constants) {
    const std::string name = nb::cast<std::string>(key);
    if (name == "tensor_efficiency_by_head_dim") {
      for (const auto& [dim, efficiency] : nb::cast<nb::dict>(value)) {
        const double number = nb::cast<double>(efficiency);
        if (!(number > 0) || !std::isfinite(number)) throw std::invalid_argument("tensor_efficiency_by_head_dim: allowed: numbers > 0");
        const std::string text = nb::cast<std::string>(nb::str(dim));
        c.tensor_efficiency_by_head_dim[static_cast<int>(parse_decimal(text, "tensor_efficiency_by_head_dim key", 1, 1 << 16))] = number;
      }
      continue;
    }
    const double number = nb::cast<double>(value);
    if (!(number >= 0) || !std::isfinite(number)) {
      throw std::invalid_argument("time constant " + name + " = " + std::to_string(number) + "; allowed: a finite number >= 0");
    }
    if (name == "tensor_efficiency") c.tensor_efficiency = number;
    else if (name == "softmax_cycles_per_score") c.softmax_cycles_per_score = number;
    else if (name == "block_seconds") c.block_seconds = number;
    else if (name == "round_trip_seconds") c.round_trip_seconds = number;
    else throw std::invalid_argument("time constant '" + name + "' is unknown; allowed: tensor_efficiency, "
                                     "tensor_efficiency_by_head_dim, softmax_cycles_per_score, block_seconds, round_trip_seconds");
  }
  if (!(c.tensor_efficiency > 0)) throw std::invalid_argument("time constant tensor_efficiency: allowed: > 0");
  return c;
}

void bind_hardware(nb::module_& m) {
  nb::class_<HardwareRun>(m, "HardwareRun", "a kernel run through the three-level model")
      .def("record", [](const HardwareRun& run) {
        std::optional<TimePrediction> time;
        if (run.machine.time_model) time = predict_time(run.result, run.machine);
        return to_python(hierarchy_to_json(run.result, time));
      }, "the run as `flashlab hardware --json` writes it (time with the preset's constants, if it has them)")
      .def("time", [](const HardwareRun& run, const nb::dict& constants) {
        return to_python(sim::to_json(predict_time(run.result, run.machine, constants_from(constants))));
      }, nb::arg("constants"), "the time model with these constants (a preset's time_model.kernels entry)")
      .def_prop_ro("block_steps", [](const HardwareRun& run) { return run.result.work.block_steps; });
  m.def("hardware", [](const std::string& generation, const std::string& direction, const Problem& problem,
                       const std::string& machine_key, const std::string& machines_dir, bool deterministic,
                       bool l2_sections, const std::string& layout, std::int64_t l2_bytes, int l2_partitions, int sm_count,
                       int blocks_per_sm) {
    KernelChoice kernel{generation, direction, deterministic, l2_sections, layout};
    HierarchyOptions options{l2_bytes, l2_partitions, sm_count, blocks_per_sm};
    HardwareRun run{{}, find_machine(machine_key, machines_dir)};
    {
      nb::gil_scoped_release release;
      run.result = run_hierarchy(kernel, problem, run.machine, options);
    }
    return run;
  }, nb::arg("generation"), nb::arg("direction"), nb::arg("problem"), nb::arg("machine"), nb::arg("machines_dir"),
     nb::arg("deterministic") = false, nb::arg("l2_sections") = true, nb::arg("layout") = "flash", nb::arg("l2_bytes") = -1,
     nb::arg("l2_partitions") = 0,
     nb::arg("sm_count") = 0, nb::arg("blocks_per_sm") = 0);
}

}  // namespace

void bind_sim(nb::module_& m) {
  nb::exception<SramOverflow>(m, "SramOverflow", PyExc_RuntimeError);
  nb::exception<TraceOverflow>(m, "TraceOverflow", PyExc_RuntimeError);

  nb::class_<BlockSizes>(m, "BlockSizes", "block sizes in rows (0: derived from the SRAM size)")
      .def(nb::init<>())
      .def("__init__", [](BlockSizes* b, int block_rows, int block_cols, int num_splits) {
        new (b) BlockSizes{block_rows, block_cols, num_splits};
      }, nb::arg("block_rows"), nb::arg("block_cols"), nb::arg("num_splits") = 0)
      .def_rw("block_rows", &BlockSizes::block_rows)
      .def_rw("block_cols", &BlockSizes::block_cols)
      .def_rw("num_splits", &BlockSizes::num_splits)
      .def_rw("devices", &BlockSizes::devices)
      .def_prop_rw("ordering", [](const BlockSizes& b) { return std::string(to_string(b.ordering)); },
                   [](BlockSizes& b, const std::string& name) { b.ordering = ring_ordering_from_string(name); })
      .def("__eq__", [](const BlockSizes& a, const BlockSizes& b) { return a == b; });

  m.def("schedules", [] {
    nb::list list;
    for (const ScheduleInfo& info : schedules()) {
      nb::dict d;
      d["name"] = info.name;
      d["source"] = info.source;
      d["paper"] = info.paper;
      d["description"] = info.description;
      d["pass"] = to_string(info.pass);
      d["tiled"] = info.tiled;
      list.append(d);
    }
    return list;
  }, "every registered schedule, in learning order");

  m.def("parse_bytes", &parse_bytes, nb::arg("text"), nb::arg("name") = "", "'96K' -> 98304 (binary K and M)");
  m.def("human_bytes", &human_bytes, nb::arg("bytes"), "1.23 GB (decimal units)");

  m.def("run", [](const std::string& schedule, const Problem& problem, const std::string& memory, std::int64_t sram_bytes,
                  const BlockSizes& blocks, std::uint64_t seed, bool every_head, const std::string& machine_key,
                  const std::string& machines_dir, const std::string& block_rule, int page_size,
                  const std::string& page_reads, const std::string& dkv_reduction) {
    const std::optional<Machine> machine = optional_machine(machine_key, machines_dir);
    RunOptions options = run_options(memory, sram_bytes, blocks, seed, every_head);
    options.block_rule = block_rule_from_string(block_rule);
    options.kv_cache.page_size = page_size;
    options.kv_cache.reads = page_reads_from_string(page_reads);
    options.group_reduction = group_reduction_from_string(dkv_reduction);
    json record;
    {
      nb::gil_scoped_release release;
      record = run_json(schedule, problem, options, machine ? &*machine : nullptr);
    }
    return to_python(record);
  }, nb::arg("schedule"), nb::arg("problem"), nb::arg("memory"), nb::arg("sram_bytes"), nb::arg("blocks"), nb::arg("seed"),
     nb::arg("every_head"), nb::arg("machine"), nb::arg("machines_dir"), nb::arg("block_rule") = "fitting",
     nb::arg("page_size") = 0, nb::arg("page_reads") = "valid_rows", nb::arg("dkv_reduction") = "fp32_partials");

  m.def("check", [](const std::string& schedule, const Problem& problem, std::int64_t sram_bytes, std::uint64_t seed) {
    json record;
    {
      nb::gil_scoped_release release;
      record = check_json(check_schedule(schedule, problem, sram_bytes, seed));
    }
    return to_python(record);
  }, nb::arg("schedule"), nb::arg("problem"), nb::arg("sram_bytes"), nb::arg("seed"),
     "runs a schedule on data and compares it with the double-precision oracle");
  m.def("default_check_problem", &default_check_problem);

  m.def("sweep", [](const std::vector<std::string>& schedule_names, const std::vector<int>& seqlens,
                    const std::vector<int>& head_dims, const std::vector<std::int64_t>& sram_bytes,
                    const std::vector<std::string>& masks, const std::string& dtype, int batch, int heads,
                    const std::string& machine_key, const std::string& machines_dir, const std::string& command,
                    int jobs, const std::string& block_rule) {
    SweepGrid grid;
    grid.block_rule = block_rule_from_string(block_rule);
    grid.schedules = schedule_names;
    grid.seqlens = seqlens;
    grid.head_dims = head_dims;
    grid.sram_bytes = sram_bytes;
    grid.masks = masks;
    grid.dtype = dtype_from_string(dtype);
    grid.batch = batch;
    grid.heads = heads;
    const std::optional<Machine> machine = optional_machine(machine_key, machines_dir);
    json result;
    {
      nb::gil_scoped_release release;
      const std::vector<SweepPoint> points = run_sweep(grid, {}, jobs);
      result = sweep_to_json(grid, points, fit_sweep(points), machine ? &*machine : nullptr, command);
    }
    return to_python(result);
  }, nb::arg("schedules"), nb::arg("seqlens"), nb::arg("head_dims"), nb::arg("sram_bytes"), nb::arg("masks"),
     nb::arg("dtype"), nb::arg("batch"), nb::arg("heads"), nb::arg("machine"), nb::arg("machines_dir"), nb::arg("command"),
     nb::arg("jobs") = 1, nb::arg("block_rule") = "fitting", "the sweep's JSON (schema: docs/schemas/sweep.schema.json)");

  m.def("search", [](const std::vector<std::string>& schedule_names, const Problem& problem, std::int64_t sram_bytes,
                     const std::string& objective, int multiple_of, int max_rows, int max_cols, bool square,
                     int registers_per_thread, int threads_per_block, int num_splits, bool exhaustive,
                     const std::string& machine_key, const std::string& machines_dir, const std::string& command,
                     std::int64_t max_tile_steps) {
    const std::optional<Machine> machine = optional_machine(machine_key, machines_dir);
    SearchOptions options;
    options.max_tile_steps = max_tile_steps;
    options.schedules = schedule_names;
    options.objective = search_objective_from_string(objective);
    options.constraints = {sram_bytes, multiple_of, max_rows, max_cols, square, registers_per_thread, threads_per_block, num_splits};
    options.machine = machine ? &*machine : nullptr;
    options.exhaustive = exhaustive;
    json result;
    {
      nb::gil_scoped_release release;
      result = search_to_json(search_tilings(problem, options), command);
    }
    return to_python(result);
  }, nb::arg("schedules"), nb::arg("problem"), nb::arg("sram_bytes"), nb::arg("objective"), nb::arg("multiple_of"),
     nb::arg("max_rows"), nb::arg("max_cols"), nb::arg("square"), nb::arg("registers_per_thread"), nb::arg("threads_per_block"),
     nb::arg("num_splits"), nb::arg("exhaustive"), nb::arg("machine"), nb::arg("machines_dir"), nb::arg("command"),
     nb::arg("max_tile_steps") = kMaxSearchTileSteps, "the mapping search's JSON (schema: docs/schemas/search.schema.json)");

  bind_trace(m);
  bind_closed_forms(m);
  bind_bounds(m);
  bind_machines(m);
  bind_ring(m);
  bind_hardware(m);
}

}  // namespace flashlab::python
