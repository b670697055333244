#include "ring.hpp"

#include <algorithm>
#include <stdexcept>

#include "closed_forms.hpp"
#include "report.hpp"
#include "schedules.hpp"

namespace flashlab::sim {

namespace {

const char* schedule_of(bool backward) { return backward ? "ring_backward" : "ring"; }

// The roofline time of one device's work in one step.
double step_seconds(const RingDeviceStep& work, const Machine& m) {
  return std::max({static_cast<double>(work.hbm_bytes) / m.hbm_bytes_per_second,
                   static_cast<double>(work.matmul_flops) / m.matmul_flops_per_second,
                   static_cast<double>(work.exponentials) / m.exp_per_second,
                   static_cast<double>(work.other_flops) / m.fp32_flops_per_second});
}

void require_link(const Machine& machine) {
  if (machine.link_bytes_per_second <= 0)
    throw std::invalid_argument("machine '" + machine.key +
                                "' has no link_bytes_per_second (the link to the next device of a ring); allowed: a preset "
                                "with link_bytes_per_second and link_source");
}

}  // namespace

double RingModel::hidden_link_share() const {
  double hidden = 0;
  for (const RingStepTime& s : steps) hidden += std::min(s.link_seconds, s.compute_seconds);
  return link_seconds > 0 ? hidden / link_seconds : 1.0;
}

bool RingModel::overlapped() const {
  return std::all_of(steps.begin(), steps.end(), [](const RingStepTime& s) { return s.hidden(); });
}

bool RingModel::overlapped_by_matmul() const {
  return std::all_of(steps.begin(), steps.end(), [](const RingStepTime& s) { return s.hidden_by_matmul(); });
}

BlockTiling ring_blocks(const Problem& problem, bool backward, const Machine& machine) {
  const BlockSizes blocks = derive_blocks(schedule_of(backward), problem, machine.sram_bytes);
  return {blocks.block_rows, blocks.block_cols};
}

RingModel model_ring(const Problem& problem, const RingTiling& tiling, bool backward, const Machine& machine) {
  problem.validate();
  tiling.validate();
  require_link(machine);
  if (problem.varlen()) throw std::invalid_argument("ring model: a varlen batch; allowed: a dense batch (equal lengths)");
  const ScheduleInfo& info = find_schedule(schedule_of(backward));
  require_supported(info, problem);
  // One KV group of one sequence stands for the batch x heads_kv units of the problem.
  Problem unit = problem;
  unit.batch = 1;
  unit.heads_q = problem.group_size();
  unit.heads_kv = 1;
  RunOptions options;
  options.blocks = {tiling.blocks.block_rows, tiling.blocks.block_cols, 0, tiling.devices, tiling.ordering};
  require_within_limits(info.name, unit, options, run_cost(info.name, unit, options));
  const std::int64_t units = std::int64_t{problem.batch} * problem.heads_kv;

  RingModel model;
  model.problem = problem;
  model.tiling = tiling;
  model.backward = backward;
  model.machine = machine.key;
  RingLog log;
  const std::vector<Counters> per_unit = run_ring<ShapeMemory>(unit, nullptr, 0, tiling, backward, &log);
  for (const Counters& c : per_unit) model.devices.push_back(scaled(c, units));
  model.link_bytes_sent.assign(per_unit.size(), 0);
  for (std::size_t s = 0; s < log.steps.size(); ++s) {
    RingStepTime step;
    step.step = static_cast<int>(s);
    for (std::size_t i = 0; i < log.steps[s].size(); ++i) {
      RingDeviceStep work = log.steps[s][i];
      step.blocks.push_back(work.block);
      for (std::int64_t* count : {&work.hbm_bytes, &work.matmul_flops, &work.exponentials, &work.other_flops, &work.link_bytes})
        *count = checked_mul(*count, units, "ring step counts");
      const double seconds = step_seconds(work, machine);
      step.matmul_seconds = std::max(step.matmul_seconds, static_cast<double>(work.matmul_flops) / machine.matmul_flops_per_second);
      if (seconds > step.compute_seconds) step.compute_seconds = seconds, step.slowest_device = static_cast<int>(i);
      step.link_bytes = std::max(step.link_bytes, work.link_bytes);
      step.device_link_bytes.push_back(work.link_bytes);
      model.link_bytes_sent[i] += work.link_bytes;
    }
    step.link_seconds = static_cast<double>(step.link_bytes) / machine.link_bytes_per_second;
    model.compute_seconds += step.compute_seconds;
    model.link_seconds += step.link_seconds;
    model.seconds += std::max(step.compute_seconds, step.link_seconds);
    model.steps.push_back(std::move(step));
  }
  return model;
}

RingOverlapPoint ring_overlap_threshold(const Problem& shape, const RingTiling& tiling, bool backward, const Machine& machine,
                                        int granularity, int max_seqlen_per_device) {
  require_link(machine);
  tiling.validate_devices();  // the blocks may be left to derive (0)
  if (granularity < 1 || granularity > max_seqlen_per_device)
    throw std::invalid_argument("granularity = " + std::to_string(granularity) + "; allowed: 1.." +
                                std::to_string(max_seqlen_per_device));
  RingOverlapPoint point;
  point.devices = tiling.devices;
  point.ordering = tiling.ordering;
  point.causal = shape.mask.causal;
  point.backward = backward;
  const double g = shape.group_size(), d = shape.head_dim, dv = shape.value_dim(), e = element_bytes(shape.dtype);
  const double share = shape.mask.causal && tiling.ordering != RingOrdering::contiguous ? 0.5 : 1.0;
  const double work = (backward ? 3 * d + 2 * dv : d + dv) * share, travelling = backward ? e + 4 : e;
  point.estimate = machine.matmul_flops_per_second * travelling * (d + dv) / (2 * g * machine.link_bytes_per_second * work);
  // One sequence with the shape's heads; blocks from the machine's SRAM at each length unless given.
  Problem unit = shape;
  unit.batch = 1;
  unit.cu_seqlens_q.clear(), unit.cu_seqlens_k.clear();
  const bool blocks_given = tiling.blocks.block_rows > 0 && tiling.blocks.block_cols > 0;
  const auto model_at = [&](int per_device) {
    unit.seqlen_q = unit.seqlen_k = checked_int(checked_mul(per_device, tiling.devices, "ring sequence length"),
                                                "ring sequence length");
    RingTiling t = tiling;
    if (!blocks_given) t.blocks = ring_blocks(unit, backward, machine);
    return model_ring(unit, t, backward, machine);
  };
  // Doubling, then bisection in multiples of the granularity (compute grows as n^2, the link as n).
  const auto shortest = [&](auto hides) {
    int low = 0, high = granularity;
    while (!hides(model_at(high))) {
      low = high;
      if (high >= max_seqlen_per_device) return 0;  // not reached
      high = static_cast<int>(std::min<std::int64_t>(std::int64_t{high} * 2, max_seqlen_per_device));
    }
    while (high - low > granularity) {
      const int middle = low + (high - low) / granularity / 2 * granularity;
      (hides(model_at(middle)) ? high : low) = middle;
    }
    return high;
  };
  point.seqlen_per_device = shortest([](const RingModel& m) { return m.overlapped_by_matmul(); });
  point.roofline_seqlen_per_device = shortest([](const RingModel& m) { return m.overlapped(); });
  if (point.seqlen_per_device > 0) {  // the step with the least matmul time per link time, there
    double ratio = -1;
    for (const RingStepTime& s : model_at(point.seqlen_per_device).steps) {
      if (s.link_seconds <= 0) continue;
      const double r = s.matmul_seconds / s.link_seconds;
      if (ratio < 0 || r < ratio) ratio = r, point.compute_seconds = s.matmul_seconds, point.link_seconds = s.link_seconds;
    }
  }
  return point;
}

nlohmann::json to_json(const RingModel& m) {
  nlohmann::json devices = nlohmann::json::array(), steps = nlohmann::json::array();
  for (std::size_t i = 0; i < m.devices.size(); ++i)
    devices.push_back({{"device", i}, {"counters", to_json(m.devices[i])}, {"link_bytes_sent", m.link_bytes_sent[i]}});
  for (const RingStepTime& s : m.steps) {
    steps.push_back({{"step", s.step}, {"blocks", s.blocks}, {"link_bytes", s.link_bytes}, {"device_link_bytes", s.device_link_bytes},
                     {"compute_seconds", s.compute_seconds}, {"matmul_seconds", s.matmul_seconds},
                     {"link_seconds", s.link_seconds}, {"hidden_by_matmul", s.hidden_by_matmul()},
                     {"slowest_device", s.slowest_device}, {"hidden", s.hidden()}});
  }
  return {{"devices", devices},
          {"steps", steps},
          {"compute_seconds", m.compute_seconds},
          {"link_seconds", m.link_seconds},
          {"seconds", m.seconds},
          {"hidden_link_share", m.hidden_link_share()},
          {"overlapped", m.overlapped()},
          {"overlapped_by_matmul", m.overlapped_by_matmul()}};
}

nlohmann::json to_json(const RingOverlapPoint& p) {
  nlohmann::json json{{"devices", p.devices}, {"ordering", to_string(p.ordering)}, {"causal", p.causal},
                      {"backward", p.backward}, {"estimate", p.estimate}};
  json["seqlen_per_device"] = p.seqlen_per_device > 0 ? nlohmann::json(p.seqlen_per_device) : nlohmann::json(nullptr);
  json["roofline_seqlen_per_device"] =
      p.roofline_seqlen_per_device > 0 ? nlohmann::json(p.roofline_seqlen_per_device) : nlohmann::json(nullptr);
  if (p.seqlen_per_device > 0) json["compute_seconds"] = p.compute_seconds, json["link_seconds"] = p.link_seconds;
  return json;
}

}  // namespace flashlab::sim
