// Machine presets (sim/machines/*.json) and the roofline time a schedule's counts predict.
//
// A preset holds, each with its source: the SRAM one thread block can use (M, bytes), the HBM
// bandwidth, the link to the next device of a ring (one direction), the dense matmul rate (tensor cores, in the preset's dtype), the special-function
// (exponential) rate and the rate of other FP32 operations. The roofline time of a run is the
// largest of bytes / bandwidth, matmul FLOPs / matmul rate, exponentials / exp rate and other
// FLOPs / FP32 rate: the resource a perfectly overlapped kernel would wait on.
//
// A preset may also describe the GPU for the three-level model and its time model
// (sim/hierarchy.hpp, sim/time_model.hpp): `gpu` (SMs, their shared memory, registers and threads,
// the L2's size, line and sector, the measured copy, L2 and matmul rates, each with its source) and
// `time_model` (the constants calibrated on measured kernel times, per kernel, with their source).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "algorithms/counters.hpp"
#include "algorithms/problem.hpp"

namespace flashlab::sim {

// The GPU as the three-level model sees it (optional in a preset; `flashlab hardware` needs it).
struct GpuSpec {
  int sm_count = 0;
  double clock_hz = 0;                        // the SM clock under load
  std::int64_t shared_bytes_per_sm = 0;       // shared memory an SM gives its blocks
  std::int64_t shared_reserved_per_block = 0; // of which the system keeps this much per block
  std::int64_t registers_per_sm = 0;          // 32-bit registers
  int max_threads_per_sm = 0, max_blocks_per_sm = 0;
  std::int64_t l2_bytes = 0;
  int l2_line_bytes = 0, l2_sector_bytes = 0;
  int l2_partitions = 1;                       // an SM reads through the near one (l2_cache.hpp)
  double copy_bytes_per_second = 0;            // DRAM, measured (read + write)
  double l2_bytes_per_second = 0;              // L2 -> SM
  double matmul_measured_flops_per_second = 0; // dense matmul in the preset's dtype, measured
  std::string sm_source, clock_source, occupancy_source, l2_source, l2_partitions_source, copy_source,
      l2_bandwidth_source, matmul_measured_source;
};

// The time model's constants for one kernel (sim/time_model.hpp), fitted to measured times.
struct KernelTimeConstants {
  double tensor_efficiency = 0;         // of the measured matmul rate, in the kernel's inner loop
  // Per compiled instance (its padded head dim: tiles and warps differ), where it differs from the above.
  std::map<int, double> tensor_efficiency_by_head_dim;
  double softmax_cycles_per_score = 0;  // SM cycles per score element off the tensor pipe
  double block_seconds = 0;             // per thread block: start, first loads, epilogue
  double round_trip_seconds = 0;        // one dependent global-memory round trip (FA1; optional, 0: none)
};
struct TimeModelSpec {
  std::string source;                                  // how the constants were obtained
  std::map<std::string, KernelTimeConstants> kernels;  // "fa2_forward", "fa3_backward", ...
};

struct Machine {
  std::string key;   // "h100"
  std::string name;  // "NVIDIA H100 SXM5 80GB (compute capability 9.0)"
  DType dtype = DType::bf16;
  std::int64_t sram_bytes = 0;
  double hbm_bytes_per_second = 0;
  double matmul_flops_per_second = 0;
  double exp_per_second = 0;
  double fp32_flops_per_second = 0;
  // The link to the next device of a ring, one direction (NVLink or PCIe): optional in a preset
  // file, 0 when not given (Ring Attention's model then refuses the machine by name).
  double link_bytes_per_second = 0;
  std::string sram_source, hbm_source, matmul_source, exp_source, fp32_source, link_source;
  std::optional<GpuSpec> gpu;
  std::optional<TimeModelSpec> time_model;
};

// Parses a preset; throws std::invalid_argument naming `source` and the bad field.
Machine machine_from_json(const nlohmann::json& json, const std::string& source);
nlohmann::json to_json(const Machine& machine);

// The directory of the presets: $FLASHLAB_MACHINES if set; else share/flashlab/machines beside
// the running program's prefix (<prefix>/bin/flashlab finds <prefix>/share/flashlab/machines,
// where `cmake --install` puts them); else sim/machines of the source tree (build-tree runs).
std::string machines_directory();
// Every preset in the directory (machines_directory() unless given), sorted by key, plus the
// embedded default when the directory is missing. Throws std::invalid_argument on a malformed
// file (naming it).
std::vector<Machine> load_machines();
std::vector<Machine> load_machines(const std::string& directory);
// A preset by key ("h100") among those of the directory, or a path to a preset file. Throws
// std::invalid_argument naming the unknown machine and the known ones.
Machine find_machine(const std::string& key_or_path);
Machine find_machine(const std::string& key_or_path, const std::string& directory);
// The embedded default machine (H100 SXM5), used by the default experiment with no files.
const Machine& default_machine();

struct Roofline {
  double hbm_seconds = 0, matmul_seconds = 0, exp_seconds = 0, other_seconds = 0;
  double seconds = 0;            // the largest of the four
  std::string bound_by;          // "hbm", "matmul", "exp" or "other"
};
Roofline roofline(const Counters& counters, const Machine& machine);

}  // namespace flashlab::sim
