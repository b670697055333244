#include "time_model.hpp"

#include <algorithm>
#include <functional>
#include <queue>
#include <stdexcept>
#include <vector>

namespace flashlab::sim {

std::string time_constants_key(const KernelChoice& kernel) { return kernel.generation + "_" + kernel.direction; }

const KernelTimeConstants& time_constants(const Machine& machine, const KernelChoice& kernel) {
  const std::string key = time_constants_key(kernel);
  if (!machine.time_model) {
    throw std::invalid_argument("time model: machine '" + machine.key + "' has no \"time_model\"; allowed: a calibrated preset (h200)");
  }
  const auto found = machine.time_model->kernels.find(key);
  if (found == machine.time_model->kernels.end()) {
    std::string known;
    for (const auto& [name, constants] : machine.time_model->kernels) known += (known.empty() ? "" : ", ") + name;
    throw std::invalid_argument("time model: machine '" + machine.key + "' has no constants for " + key + "; allowed: " + known);
  }
  return found->second;
}

TimePrediction predict_time(const HierarchyResult& run, const Machine& machine) {
  return predict_time(run, machine, time_constants(machine, run.kernel));
}

TimePrediction predict_time(const HierarchyResult& run, const Machine& machine, const KernelTimeConstants& c) {
  if (!machine.gpu) throw std::invalid_argument("time model: machine '" + machine.key + "' has no \"gpu\" description");
  const GpuSpec& gpu = *machine.gpu;
  const HierarchyWork& work = run.work;
  TimePrediction t;
  t.constants = time_constants_key(run.kernel);
  t.block_seconds = c.block_seconds;

  // One tile step on the SM, and for one of the blocks sharing it.
  const double matmul_per_sm = gpu.matmul_measured_flops_per_second / run.sm_count;
  const auto instance = c.tensor_efficiency_by_head_dim.find(run.tiling.head_dim);
  const double efficiency = instance != c.tensor_efficiency_by_head_dim.end() ? instance->second : c.tensor_efficiency;
  t.step_tensor_seconds = work.step_matmul_flops / (efficiency * matmul_per_sm);
  t.step_softmax_seconds = work.step_scores * c.softmax_cycles_per_score / gpu.clock_hz;
  // A block runs its softmax and its GEMMs one after the other (FA2's loop, FA1, the Hopper
  // backward: its warps meet at barriers every step); they overlap where the Hopper forward's
  // warpgroups ping-pong, or where two blocks share the SM (one's softmax under the other's GEMMs).
  const bool overlapped = (run.kernel.generation == "fa3" && run.kernel.direction == "forward") || run.blocks_per_sm >= 2;
  const double sm_step = overlapped ? std::max(t.step_tensor_seconds, t.step_softmax_seconds)
                                    : t.step_tensor_seconds + t.step_softmax_seconds;
  t.step_latency_seconds = work.round_trips_per_step * c.round_trip_seconds;
  t.step_seconds = std::max(run.blocks_per_sm * sm_step, t.step_latency_seconds);

  // The blocks dealt to the slots in launch order, each to the first free one.
  const std::size_t slots = static_cast<std::size_t>(std::min<std::int64_t>(run.resident_blocks, std::max<std::int64_t>(run.thread_blocks, 1)));
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (std::size_t s = 0; s < slots; ++s) free_at.push(0.0);
  double busy = 0, end = 0;
  for (const std::int32_t steps : work.block_steps) {
    const double start = free_at.top();
    free_at.pop();
    const double length = c.block_seconds + steps * t.step_seconds;
    busy += length;
    end = std::max(end, start + length);
    free_at.push(start + length);
  }
  t.sm_seconds = end;
  t.slot_utilisation = end > 0 ? busy / (static_cast<double>(slots) * end) : 0;
  t.dram_seconds = static_cast<double>(run.l2.dram_read_bytes + run.l2.dram_write_bytes) / gpu.copy_bytes_per_second;
  t.l2_seconds = static_cast<double>(run.l2.l2_to_sm_bytes + run.main_write_bytes) / gpu.l2_bytes_per_second;
  t.kernel_seconds = std::max({t.sm_seconds, t.dram_seconds, t.l2_seconds});
  t.other_kernels_seconds = static_cast<double>(work.other_kernels_bytes) / gpu.copy_bytes_per_second;
  t.seconds = t.kernel_seconds + t.other_kernels_seconds;

  if (t.kernel_seconds == t.dram_seconds && t.dram_seconds > t.sm_seconds) {
    t.bound = "dram";
  } else if (t.kernel_seconds == t.l2_seconds && t.l2_seconds > t.sm_seconds) {
    t.bound = "l2";
  } else {
    // What the SM schedule spends its time on: the steps' tensor or softmax work, or waiting
    // (round trips beyond the SM's share of the step, and the per-block overhead).
    const double steps = static_cast<double>(work.steps);
    const double share = run.blocks_per_sm;  // the SM time of a step, per block
    const double tensor = steps * share * (overlapped ? std::min(t.step_tensor_seconds, sm_step) : t.step_tensor_seconds);
    const double softmax = steps * share * (overlapped ? std::max(0.0, sm_step - t.step_tensor_seconds) : t.step_softmax_seconds);
    const double waiting = steps * (t.step_seconds - share * sm_step) + static_cast<double>(work.block_steps.size()) * c.block_seconds;
    t.bound = waiting > tensor && waiting > softmax ? "latency" : tensor >= softmax ? "tensor" : "exp";
  }
  return t;
}

}  // namespace flashlab::sim
