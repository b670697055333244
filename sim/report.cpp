#include "report.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "decimal.hpp"

namespace flashlab::sim {

std::int64_t hbm_elements(const Counters& c) {
  std::int64_t total = 0;
  for (const TensorTraffic& t : c.tensor) {
    checked_accumulate(total, t.hbm_read_elements, "hbm_elements");
    checked_accumulate(total, t.hbm_write_elements, "hbm_elements");
  }
  return total;
}

nlohmann::json to_json(const Counters& c) {
  nlohmann::json tensors = nlohmann::json::object();
  for (int i = 0; i < kTensorCount; ++i) {
    const TensorTraffic& t = c.tensor[i];
    if (t.hbm_read_elements == 0 && t.hbm_write_elements == 0) continue;
    tensors[to_string(static_cast<TensorId>(i))] = {{"read_elements", t.hbm_read_elements},
                                                    {"write_elements", t.hbm_write_elements},
                                                    {"read_bytes", t.hbm_read_bytes},
                                                    {"write_bytes", t.hbm_write_bytes}};
  }
  return {{"hbm_bytes", c.hbm_bytes()},
          {"hbm_read_bytes", c.hbm_read_bytes()},
          {"hbm_write_bytes", c.hbm_write_bytes()},
          {"hbm_elements", hbm_elements(c)},
          {"matmul_flops", c.matmul_flops},
          {"exponentials", c.exponentials},
          {"other_flops", c.other_flops},
          {"sram_peak_bytes", c.sram_peak_bytes},
          {"loads", c.loads},
          {"stores", c.stores},
          {"tensors", tensors}};
}

nlohmann::json to_json(const BlockSizes& b) {
  nlohmann::json json{{"block_rows", b.block_rows}, {"block_cols", b.block_cols}};
  if (b.num_splits > 0) json["num_splits"] = b.num_splits;
  if (b.devices > 0) json["devices"] = b.devices, json["ordering"] = to_string(b.ordering);
  return json;
}

nlohmann::json to_json(const Roofline& r) {
  return {{"seconds", r.seconds},         {"bound_by", r.bound_by},       {"hbm_seconds", r.hbm_seconds},
          {"matmul_seconds", r.matmul_seconds}, {"exp_seconds", r.exp_seconds}, {"other_seconds", r.other_seconds}};
}

nlohmann::json to_json(const kernels::KernelTiling& t) {
  return {{"generation", t.generation},     {"direction", t.direction},   {"head_dim", t.head_dim},
          {"shared_budget", t.shared_budget}, {"block_rows", t.block_rows}, {"block_cols", t.block_cols},
          {"warps", t.warps},               {"stages", t.stages},         {"shared_bytes", t.shared_bytes},
          {"min_shared_limit", t.min_shared_limit}, {"min_blocks_per_sm", t.min_blocks_per_sm},
          {"async_copy_row_bytes", t.async_copy_row_bytes}, {"masked_variant", t.masked_variant}};
}

void print_kernel_tilings(std::ostream& out, const std::vector<kernels::KernelTiling>& tilings) {
  out << std::left << std::setw(5) << "gen" << std::setw(10) << "direction" << std::right << std::setw(5) << "d"
      << std::setw(9) << "budget" << std::setw(8) << "Br x Bc" << std::setw(7) << "warps" << std::setw(8) << "stages"
      << std::setw(14) << "shared bytes" << "  masks\n";
  for (const kernels::KernelTiling& t : tilings) {
    std::ostringstream blocks;
    blocks << t.block_rows << "x" << t.block_cols;
    out << std::left << std::setw(5) << t.generation << std::setw(10) << t.direction << std::right << std::setw(5)
        << t.head_dim << std::setw(7) << t.shared_budget / 1024 << " K" << std::setw(8) << blocks.str() << std::setw(7)
        << t.warps << std::setw(8) << t.stages << std::setw(14) << t.shared_bytes
        << (t.masked_variant ? "  short walks" : "  any") << "\n";
  }
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int unit = 0;
  while (std::fabs(bytes) >= 1000 && unit < 5) bytes /= 1000, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.3g %s", bytes, units[unit]);
  return text;
}

std::int64_t parse_bytes(const std::string& text, const std::string& name) {
  const std::string what = name.empty() ? "size" : name + ": size";
  const std::string allowed = "a byte count in " + decimal_range(std::int64_t{0}, kMaxSramBytes) +
                              " with an optional K or M suffix (228K = 233472 bytes)";
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string suffix = text.substr(digits);
  for (char& ch : suffix) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  std::int64_t scale = 0;
  if (suffix.empty() || suffix == "B") scale = 1;
  if (suffix == "K" || suffix == "KB" || suffix == "KIB") scale = 1024;
  if (suffix == "M" || suffix == "MB" || suffix == "MIB") scale = 1024 * 1024;
  if (digits == 0 || scale == 0) throw std::invalid_argument(what + " '" + text + "' is not understood; allowed: " + allowed);
  const std::int64_t count = parse_decimal(std::string_view(text).substr(0, digits), what, 0, kMaxSramBytes);
  if (count > kMaxSramBytes / scale) {
    throw std::invalid_argument(what + " '" + text + "' is out of range; allowed: " + allowed);
  }
  return count * scale;
}

double fit_exponent(const std::vector<double>& x, const std::vector<double>& y) {
  const std::size_t n = std::min(x.size(), y.size());
  double mean_x = 0, mean_y = 0;
  for (std::size_t i = 0; i < n; ++i) mean_x += std::log(x[i]), mean_y += std::log(y[i]);
  mean_x /= static_cast<double>(n), mean_y /= static_cast<double>(n);
  double covariance = 0, variance = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double dx = std::log(x[i]) - mean_x;
    covariance += dx * (std::log(y[i]) - mean_y);
    variance += dx * dx;
  }
  return variance > 0 ? covariance / variance : std::nan("");
}

void print_counters(std::ostream& out, const Counters& c) {
  out << std::left << std::setw(12) << "tensor" << std::right << std::setw(16) << "read elements" << std::setw(16)
      << "write elements" << std::setw(14) << "read" << std::setw(14) << "written" << "\n";
  for (int i = 0; i < kTensorCount; ++i) {
    const TensorTraffic& t = c.tensor[i];
    if (t.hbm_read_elements == 0 && t.hbm_write_elements == 0) continue;
    out << std::left << std::setw(12) << to_string(static_cast<TensorId>(i)) << std::right << std::setw(16)
        << t.hbm_read_elements << std::setw(16) << t.hbm_write_elements << std::setw(14)
        << human_bytes(static_cast<double>(t.hbm_read_bytes)) << std::setw(14)
        << human_bytes(static_cast<double>(t.hbm_write_bytes)) << "\n";
  }
  out << "HBM traffic     " << human_bytes(static_cast<double>(c.hbm_bytes())) << " (" << c.hbm_bytes() << " B: "
      << c.hbm_read_bytes() << " read, " << c.hbm_write_bytes() << " written; " << c.loads << " loads, " << c.stores
      << " stores)\n";
  out << "matmul FLOPs    " << c.matmul_flops << "\n";
  out << "exponentials    " << c.exponentials << "\n";
  out << "other FLOPs     " << c.other_flops << "\n";
  out << "SRAM peak       " << c.sram_peak_bytes << " B\n";
}

}  // namespace flashlab::sim
