// Printers: counters, runs and sweeps to JSON (nlohmann/json) and to text tables. The counters
// stay plain structs; everything that formats lives here.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "algorithms/tile_memory.hpp"
#include "kernels/tilings.hpp"
#include "machines.hpp"
#include "schedules.hpp"

namespace flashlab::sim {

// Sum of HBM reads and writes in elements, over every tensor.
std::int64_t hbm_elements(const Counters& counters);

// {"hbm_bytes", "hbm_read_bytes", "hbm_write_bytes", "hbm_elements", "matmul_flops",
//  "exponentials", "other_flops", "sram_peak_bytes", "loads", "stores",
//  "tensors": {"Q": {"read_elements", "write_elements", "read_bytes", "write_bytes"}, ...}}
// (tensors with no traffic are left out).
nlohmann::json to_json(const Counters& counters);
nlohmann::json to_json(const BlockSizes& blocks);
nlohmann::json to_json(const Roofline& roofline);

// The GPU kernels' tilings (kernels/tilings.hpp): {"generation", "direction", "head_dim",
// "shared_budget", "block_rows", "block_cols", "warps", "stages", "shared_bytes",
// "min_shared_limit", "min_blocks_per_sm", "async_copy_row_bytes"}, and a table with one row per
// tiling.
nlohmann::json to_json(const kernels::KernelTiling& tiling);
void print_kernel_tilings(std::ostream& out, const std::vector<kernels::KernelTiling>& tilings);

// A table: one row per tensor with traffic (reads and writes in elements and bytes), then the
// totals, FLOPs and the SRAM peak.
void print_counters(std::ostream& out, const Counters& counters);

// "1.23 GB", "456 KB", "12 B" (decimal units, as the papers use).
std::string human_bytes(double bytes);
// "228K" -> 233472, "64KB" -> 65536, "1M" -> 1048576, "4096" -> 4096 (binary K and M, as SRAM
// sizes are quoted); decimal digits (sim/decimal.hpp), at most kMaxSramBytes. Throws
// std::invalid_argument naming the text, `name` (the option it came from) and the range.
std::int64_t parse_bytes(const std::string& text, const std::string& name = "");

// The slope of log(y) against log(x) by least squares (needs >= 2 distinct x).
double fit_exponent(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace flashlab::sim
