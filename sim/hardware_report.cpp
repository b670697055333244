#include "hardware_report.hpp"

#include <algorithm>
#include <iomanip>

#include "sim/report.hpp"

namespace flashlab::sim {

nlohmann::json to_json(const L2Counters& c) {
  return {{"dram_read_bytes", c.dram_read_bytes},
          {"dram_write_bytes", c.dram_write_bytes},
          {"dirty_at_end_bytes", c.dirty_at_end_bytes},
          {"l2_to_sm_bytes", c.l2_to_sm_bytes},
          {"sm_to_l2_write_sectors", c.sm_to_l2_write_sectors},
          {"sm_to_l2_reduction_sectors", c.sm_to_l2_reduction_sectors},
          {"read_hit_bytes", c.read_hit_bytes},
          {"read_miss_bytes", c.read_miss_bytes},
          {"far_hit_bytes", c.far_hit_bytes},
          {"reads", c.reads},
          {"writes", c.writes},
          {"atomics", c.atomics}};
}

nlohmann::json to_json(const TimePrediction& t) {
  return {{"seconds", t.seconds},
          {"kernel_seconds", t.kernel_seconds},
          {"bound", t.bound},
          {"sm_seconds", t.sm_seconds},
          {"dram_seconds", t.dram_seconds},
          {"l2_seconds", t.l2_seconds},
          {"other_kernels_seconds", t.other_kernels_seconds},
          {"step_tensor_seconds", t.step_tensor_seconds},
          {"step_softmax_seconds", t.step_softmax_seconds},
          {"step_latency_seconds", t.step_latency_seconds},
          {"step_seconds", t.step_seconds},
          {"block_seconds", t.block_seconds},
          {"slot_utilisation", t.slot_utilisation},
          {"constants", t.constants}};
}

nlohmann::json hierarchy_to_json(const HierarchyResult& r, const std::optional<TimePrediction>& time) {
  const HierarchyWork& w = r.work;
  const auto [fewest, most] = w.block_steps.empty() ? std::pair<std::int32_t, std::int32_t>{0, 0}
                                                    : std::pair{*std::min_element(w.block_steps.begin(), w.block_steps.end()),
                                                                *std::max_element(w.block_steps.begin(), w.block_steps.end())};
  nlohmann::json json{
      {"kernel", {{"generation", r.kernel.generation}, {"direction", r.kernel.direction},
                  {"deterministic", r.kernel.deterministic}, {"l2_sections", r.kernel.l2_sections},
                  {"layout", r.kernel.layout}}},
      {"schedule", r.schedule},
      {"tiling", to_json(r.tiling)},
      {"sm_count", r.sm_count},
      {"blocks_per_sm", r.blocks_per_sm},
      {"occupancy_limit", r.occupancy_limit},
      {"resident_blocks", r.resident_blocks},
      {"thread_blocks", r.thread_blocks},
      {"waves", r.waves},
      {"arena_bytes", r.arena_bytes},
      {"l2_bytes", r.l2_bytes},
      {"l2_partitions", r.l2_partitions},
      {"sector_bytes", r.sector_bytes},
      {"two_level", to_json(r.two_level)},
      {"main_kernel", {{"no_cache_read_bytes", r.main_read_bytes}, {"no_cache_write_bytes", r.main_write_bytes}}},
      {"l2", to_json(r.l2)},
      {"work", {{"steps", w.steps}, {"block_steps_min", fewest}, {"block_steps_max", most},
                {"step_matmul_flops", w.step_matmul_flops}, {"step_scores", w.step_scores},
                {"round_trips_per_step", w.round_trips_per_step}, {"other_kernels", w.other_kernels},
                {"other_kernels_bytes", w.other_kernels_bytes}}},
      {"model_seconds", r.seconds}};
  json["time"] = time ? to_json(*time) : nlohmann::json(nullptr);
  return json;
}

void print_hierarchy(std::ostream& out, const HierarchyResult& r, const std::optional<TimePrediction>& time) {
  const kernels::KernelTiling& t = r.tiling;
  out << r.kernel.generation << " " << r.kernel.direction << " kernel (runs schedule " << r.schedule << "): tiles "
      << t.block_rows << " x " << t.block_cols << " at d " << t.head_dim << ", " << t.warps << " warps, " << t.shared_bytes
      << " B of shared memory\n";
  out << "occupancy       " << r.blocks_per_sm << " blocks per SM (limit: " << r.occupancy_limit << ") x " << r.sm_count
      << " SMs = " << r.resident_blocks << " resident; " << r.thread_blocks << " thread blocks, " << std::setprecision(3)
      << r.waves << " waves\n";
  out << "L2              " << human_bytes(static_cast<double>(r.l2_bytes)) << " (" << r.l2_bytes << " B) in " << r.l2_partitions
      << " partition(s), LRU, write-back, " << r.sector_bytes << "-byte sectors; SRAM arena per block " << r.arena_bytes << " B\n\n";
  const L2Counters& l2 = r.l2;
  const auto row = [&](const char* what, double bytes, const char* note) {
    out << std::left << std::setw(34) << what << std::right << std::setw(12) << human_bytes(bytes) << "   " << note << "\n";
  };
  row("two-level count (whole pass)", static_cast<double>(r.two_level.hbm_bytes()), "every access to HBM, no cache");
  row("main kernel, no cache: read", static_cast<double>(r.main_read_bytes), "its reads in sectors (atomics' fills too)");
  row("main kernel, no cache: written", static_cast<double>(r.main_write_bytes), "its stores and atomics in sectors");
  row("DRAM read", static_cast<double>(l2.dram_read_bytes), "dram__bytes_read.sum");
  row("DRAM written", static_cast<double>(l2.dram_write_bytes), "dram__bytes_write.sum (evictions while it runs)");
  row("dirty in L2 at the end", static_cast<double>(l2.dirty_at_end_bytes), "written back after the kernel");
  row("L2 -> SM", static_cast<double>(l2.l2_to_sm_bytes), "l1tex__m_xbar2l1tex_read_bytes.sum");
  out << std::left << std::setw(34) << "SM -> L2 write sectors" << std::right << std::setw(12) << l2.sm_to_l2_write_sectors
      << "   lts__t_sectors_srcunit_tex_op_write.sum (stores)\n";
  if (l2.sm_to_l2_reduction_sectors > 0) {
    out << std::left << std::setw(34) << "SM -> L2 reduction sectors" << std::right << std::setw(12)
        << l2.sm_to_l2_reduction_sectors << "   lts__t_sectors_srcunit_tex_op_red.sum (atomics, reductions)\n";
  }
  if (r.work.other_kernels > 0) {
    row("other kernels (D, dQ conversion)", static_cast<double>(r.work.other_kernels_bytes), "read + written, two-level");
  }
  out << "\nwork            " << r.work.steps << " tile steps (per block " << *std::min_element(r.work.block_steps.begin(), r.work.block_steps.end())
      << " to " << *std::max_element(r.work.block_steps.begin(), r.work.block_steps.end()) << "), " << std::setprecision(4)
      << r.work.step_matmul_flops << " matmul FLOPs and " << r.work.step_scores << " scores per step\n";
  if (time) {
    const TimePrediction& p = *time;
    out << std::setprecision(4) << "time            " << p.seconds * 1e3 << " ms, bound by " << p.bound << " (main kernel "
        << p.kernel_seconds * 1e3 << " ms: SMs " << p.sm_seconds * 1e3 << ", DRAM " << p.dram_seconds * 1e3 << ", L2 "
        << p.l2_seconds * 1e3 << " ms";
    if (r.work.other_kernels > 0) out << "; other kernels " << p.other_kernels_seconds * 1e3 << " ms";
    out << ")\nper step        tensor " << p.step_tensor_seconds * 1e6 << " us, softmax " << p.step_softmax_seconds * 1e6
        << " us, round trips " << p.step_latency_seconds * 1e6 << " us; a block's step " << p.step_seconds * 1e6
        << " us with the SM shared; slots busy " << std::setprecision(3) << p.slot_utilisation * 100 << " %\n";
  }
  out << std::setprecision(3) << "model time      " << r.seconds << " s\n";
}

}  // namespace flashlab::sim
