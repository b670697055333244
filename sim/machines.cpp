#include "machines.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>

#include "decimal.hpp"
#include "json_input.hpp"

namespace flashlab::sim {

namespace {

constexpr const char* kFormat = "flashlab-machine";
constexpr int kVersion = 1;
// A preset is untrusted input: a few hundred bytes, and SRAM per thread block far below a GiB
// (the largest today is 228 KiB), which keeps every block size derived from it an int.
constexpr std::int64_t kMaxMachineFileBytes = 1 << 20;
constexpr std::int64_t kMaxPresetSramBytes = std::int64_t{1} << 30;  // tighter than --sram (limits.hpp)
// The GPU's counts (SMs, threads, blocks) and its L2: far above any GPU, low enough for int math.
constexpr std::int64_t kMaxPresetCount = 1 << 20;
constexpr std::int64_t kMaxPresetL2Bytes = std::int64_t{1} << 40;

// The default experiment's machine, embedded so that it runs with no preset files.
constexpr const char* kEmbeddedDefault = R"json({
  "format": "flashlab-machine", "version": 1, "key": "h100",
  "name": "NVIDIA H100 SXM5 80GB (compute capability 9.0)", "dtype": "bf16",
  "sram_bytes": 232448,
  "sram_source": "CUDA C++ Programming Guide, maximum shared memory per thread block (9.0: 227 KB of the 228 KB shared per SM)",
  "hbm_bytes_per_second": 3.35e12, "hbm_source": "NVIDIA H100 datasheet: 3.35 TB/s HBM3 (SXM)",
  "matmul_flops_per_second": 989e12, "matmul_source": "NVIDIA H100 datasheet: 989 TFLOPS BF16 dense (SXM)",
  "exp_per_second": 3.9e12, "exp_source": "FlashAttention-3 paper, Section 3: 3.9 TFLOPS of special functions on H100 SXM5",
  "fp32_flops_per_second": 67e12, "fp32_source": "NVIDIA H100 datasheet: 67 TFLOPS FP32 (SXM)",
  "link_bytes_per_second": 450e9,
  "link_source": "NVIDIA H100 SXM datasheet: NVLink 4, 900 GB/s total (18 links x 50 GB/s, both directions); a ring uses one direction: 450 GB/s"
})json";

}  // namespace

Machine machine_from_json(const nlohmann::json& json, const std::string& source) {
  const JsonFields in(source);
  if (!json.is_object()) in.fail("", "expected a JSON object, found " + std::string(json.type_name()));
  if (in.text(json, "format", "") != kFormat) in.fail("", std::string("format is not '") + kFormat + "'");
  in.version(json, "", "machine preset", kVersion);
  Machine m;
  m.key = in.text(json, "key", "");
  m.name = in.text(json, "name", "");
  try {
    m.dtype = dtype_from_string(in.text(json, "dtype", ""));
  } catch (const std::invalid_argument& error) {
    in.fail("", error.what());
  }
  m.sram_bytes = in.integer(json, "sram_bytes", "", 1, kMaxPresetSramBytes);
  m.hbm_bytes_per_second = in.positive_number(json, "hbm_bytes_per_second", "");
  m.matmul_flops_per_second = in.positive_number(json, "matmul_flops_per_second", "");
  m.exp_per_second = in.positive_number(json, "exp_per_second", "");
  m.fp32_flops_per_second = in.positive_number(json, "fp32_flops_per_second", "");
  m.sram_source = in.text(json, "sram_source", "");
  m.hbm_source = in.text(json, "hbm_source", "");
  m.matmul_source = in.text(json, "matmul_source", "");
  m.exp_source = in.text(json, "exp_source", "");
  m.fp32_source = in.text(json, "fp32_source", "");
  if (json.contains("link_bytes_per_second") || json.contains("link_source")) {  // optional, both or neither
    m.link_bytes_per_second = in.positive_number(json, "link_bytes_per_second", "");
    m.link_source = in.text(json, "link_source", "");
  }
  if (json.contains("gpu")) {
    const nlohmann::json& g = in.field(json, "gpu", "");
    if (!g.is_object()) in.fail("gpu", "expected a JSON object, found " + std::string(g.type_name()));
    GpuSpec gpu;
    gpu.sm_count = static_cast<int>(in.integer(g, "sm_count", "gpu", 1, kMaxPresetCount));
    gpu.clock_hz = in.positive_number(g, "clock_hz", "gpu");
    gpu.shared_bytes_per_sm = in.integer(g, "shared_bytes_per_sm", "gpu", 1, kMaxPresetSramBytes);
    gpu.shared_reserved_per_block = in.integer(g, "shared_reserved_per_block", "gpu", 0, kMaxPresetSramBytes);
    gpu.registers_per_sm = in.integer(g, "registers_per_sm", "gpu", 1, kMaxPresetSramBytes);
    gpu.max_threads_per_sm = static_cast<int>(in.integer(g, "max_threads_per_sm", "gpu", 1, kMaxPresetCount));
    gpu.max_blocks_per_sm = static_cast<int>(in.integer(g, "max_blocks_per_sm", "gpu", 1, kMaxPresetCount));
    gpu.l2_bytes = in.integer(g, "l2_bytes", "gpu", 0, kMaxPresetL2Bytes);
    gpu.l2_line_bytes = static_cast<int>(in.integer(g, "l2_line_bytes", "gpu", 1, 4096));
    gpu.l2_sector_bytes = static_cast<int>(in.integer(g, "l2_sector_bytes", "gpu", 1, gpu.l2_line_bytes));
    if (gpu.l2_line_bytes % gpu.l2_sector_bytes != 0) {
      in.fail("gpu", JsonFields::out_of_range("l2_sector_bytes", gpu.l2_sector_bytes, "a divisor of l2_line_bytes"));
    }
    gpu.l2_partitions = static_cast<int>(in.integer(g, "l2_partitions", "gpu", 1, 64));
    gpu.l2_partitions_source = in.text(g, "l2_partitions_source", "gpu");
    gpu.copy_bytes_per_second = in.positive_number(g, "copy_bytes_per_second", "gpu");
    gpu.l2_bytes_per_second = in.positive_number(g, "l2_bytes_per_second", "gpu");
    gpu.matmul_measured_flops_per_second = in.positive_number(g, "matmul_measured_flops_per_second", "gpu");
    gpu.sm_source = in.text(g, "sm_source", "gpu");
    gpu.clock_source = in.text(g, "clock_source", "gpu");
    gpu.occupancy_source = in.text(g, "occupancy_source", "gpu");
    gpu.l2_source = in.text(g, "l2_source", "gpu");
    gpu.copy_source = in.text(g, "copy_source", "gpu");
    gpu.l2_bandwidth_source = in.text(g, "l2_bandwidth_source", "gpu");
    gpu.matmul_measured_source = in.text(g, "matmul_measured_source", "gpu");
    m.gpu = gpu;
  }
  if (json.contains("time_model")) {
    const nlohmann::json& t = in.field(json, "time_model", "");
    if (!t.is_object()) in.fail("time_model", "expected a JSON object, found " + std::string(t.type_name()));
    TimeModelSpec spec;
    spec.source = in.text(t, "source", "time_model");
    const nlohmann::json& kernels = in.field(t, "kernels", "time_model");
    if (!kernels.is_object()) in.fail("time_model", "field 'kernels' is not a JSON object");
    for (const auto& [name, k] : kernels.items()) {
      const std::string where = "time_model.kernels." + name;
      if (!k.is_object()) in.fail(where, "expected a JSON object, found " + std::string(k.type_name()));
      KernelTimeConstants c;
      c.tensor_efficiency = in.positive_number(k, "tensor_efficiency", where);
      if (k.contains("tensor_efficiency_by_head_dim")) {
        const nlohmann::json& by = in.field(k, "tensor_efficiency_by_head_dim", where);
        if (!by.is_object()) in.fail(where, "field 'tensor_efficiency_by_head_dim' is not a JSON object");
        for (const auto& [head_dim, value] : by.items()) {
          const std::string place = where + ".tensor_efficiency_by_head_dim";
          int dim = 0;
          try {
            dim = static_cast<int>(parse_decimal(head_dim, "head dim", 1, 1 << 16));
          } catch (const std::invalid_argument&) {
            in.fail(place, "key '" + head_dim + "' is not a head dim; allowed: an integer in 1 .. 65536");
          }
          c.tensor_efficiency_by_head_dim[dim] = in.positive_number(by, head_dim.c_str(), place);
        }
      }
      c.softmax_cycles_per_score = in.positive_number(k, "softmax_cycles_per_score", where);
      c.block_seconds = in.positive_number(k, "block_seconds", where);
      if (k.contains("round_trip_seconds")) c.round_trip_seconds = in.positive_number(k, "round_trip_seconds", where);
      spec.kernels[name] = c;
    }
    m.time_model = spec;
  }
  return m;
}

nlohmann::json to_json(const Machine& m) {
  nlohmann::json json{{"format", kFormat},
          {"version", kVersion},
          {"key", m.key},
          {"name", m.name},
          {"dtype", to_string(m.dtype)},
          {"sram_bytes", m.sram_bytes},
          {"sram_source", m.sram_source},
          {"hbm_bytes_per_second", m.hbm_bytes_per_second},
          {"hbm_source", m.hbm_source},
          {"matmul_flops_per_second", m.matmul_flops_per_second},
          {"matmul_source", m.matmul_source},
          {"exp_per_second", m.exp_per_second},
          {"exp_source", m.exp_source},
          {"fp32_flops_per_second", m.fp32_flops_per_second},
          {"fp32_source", m.fp32_source}};
  if (m.link_bytes_per_second > 0) json["link_bytes_per_second"] = m.link_bytes_per_second, json["link_source"] = m.link_source;
  if (m.gpu) {
    const GpuSpec& g = *m.gpu;
    json["gpu"] = {{"sm_count", g.sm_count},
                   {"sm_source", g.sm_source},
                   {"clock_hz", g.clock_hz},
                   {"clock_source", g.clock_source},
                   {"shared_bytes_per_sm", g.shared_bytes_per_sm},
                   {"shared_reserved_per_block", g.shared_reserved_per_block},
                   {"registers_per_sm", g.registers_per_sm},
                   {"max_threads_per_sm", g.max_threads_per_sm},
                   {"max_blocks_per_sm", g.max_blocks_per_sm},
                   {"occupancy_source", g.occupancy_source},
                   {"l2_bytes", g.l2_bytes},
                   {"l2_line_bytes", g.l2_line_bytes},
                   {"l2_sector_bytes", g.l2_sector_bytes},
                   {"l2_source", g.l2_source},
                   {"l2_partitions", g.l2_partitions},
                   {"l2_partitions_source", g.l2_partitions_source},
                   {"copy_bytes_per_second", g.copy_bytes_per_second},
                   {"copy_source", g.copy_source},
                   {"l2_bytes_per_second", g.l2_bytes_per_second},
                   {"l2_bandwidth_source", g.l2_bandwidth_source},
                   {"matmul_measured_flops_per_second", g.matmul_measured_flops_per_second},
                   {"matmul_measured_source", g.matmul_measured_source}};
  }
  if (m.time_model) {
    nlohmann::json kernels = nlohmann::json::object();
    for (const auto& [name, c] : m.time_model->kernels) {
      kernels[name] = {{"tensor_efficiency", c.tensor_efficiency},
                       {"softmax_cycles_per_score", c.softmax_cycles_per_score},
                       {"block_seconds", c.block_seconds}};
      if (!c.tensor_efficiency_by_head_dim.empty()) {
        nlohmann::json by = nlohmann::json::object();
        for (const auto& [dim, value] : c.tensor_efficiency_by_head_dim) by[std::to_string(dim)] = value;
        kernels[name]["tensor_efficiency_by_head_dim"] = by;
      }
      if (c.round_trip_seconds > 0) kernels[name]["round_trip_seconds"] = c.round_trip_seconds;
    }
    json["time_model"] = {{"source", m.time_model->source}, {"kernels", kernels}};
  }
  return json;
}

namespace {
// <prefix>/share/flashlab/machines for the program at <prefix>/bin (Linux: /proc/self/exe), or
// empty when the program does not run from an installed prefix.
std::filesystem::path installed_machines_directory() {
  std::error_code error;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return {};
  const std::filesystem::path directory = program.parent_path().parent_path() / "share" / "flashlab" / "machines";
  return std::filesystem::is_directory(directory, error) ? directory : std::filesystem::path();
}
}  // namespace

std::string machines_directory() {
  if (const char* env = std::getenv("FLASHLAB_MACHINES")) return env;
  if (const std::filesystem::path installed = installed_machines_directory(); !installed.empty()) return installed.string();
#ifdef FLASHLAB_MACHINES_DIR
  return FLASHLAB_MACHINES_DIR;
#else
  return "sim/machines";
#endif
}

namespace {
Machine load_file(const std::filesystem::path& path) {
  const std::string source = "machine file " + path.string();
  return machine_from_json(parse_json_input(read_input_file(path.string(), kMaxMachineFileBytes, source), source), source);
}
}  // namespace

std::vector<Machine> load_machines() { return load_machines(machines_directory()); }

std::vector<Machine> load_machines(const std::string& directory_name) {
  std::vector<Machine> machines;
  const std::filesystem::path directory = directory_name;
  std::error_code error;
  if (std::filesystem::is_directory(directory, error)) {
    for (const auto& entry : std::filesystem::directory_iterator(directory)) {
      if (entry.path().extension() == ".json") machines.push_back(load_file(entry.path()));
    }
  }
  if (machines.empty()) machines.push_back(default_machine());
  std::sort(machines.begin(), machines.end(), [](const Machine& a, const Machine& b) { return a.key < b.key; });
  return machines;
}

Machine find_machine(const std::string& key_or_path) { return find_machine(key_or_path, machines_directory()); }

Machine find_machine(const std::string& key_or_path, const std::string& directory) {
  if (key_or_path.find('/') != std::string::npos || key_or_path.ends_with(".json")) return load_file(key_or_path);
  const std::vector<Machine> machines = load_machines(directory);
  std::string known;
  for (const Machine& m : machines) {
    if (m.key == key_or_path) return m;
    known += (known.empty() ? "" : ", ") + m.key;
  }
  throw std::invalid_argument("machine '" + key_or_path + "' is unknown; allowed: " + known + " (or a path to a preset .json)");
}

const Machine& default_machine() {
  static const Machine machine = machine_from_json(nlohmann::json::parse(kEmbeddedDefault), "embedded default machine");
  return machine;
}

Roofline roofline(const Counters& c, const Machine& m) {
  Roofline r;
  r.hbm_seconds = static_cast<double>(c.hbm_bytes()) / m.hbm_bytes_per_second;
  r.matmul_seconds = static_cast<double>(c.matmul_flops) / m.matmul_flops_per_second;
  r.exp_seconds = static_cast<double>(c.exponentials) / m.exp_per_second;
  r.other_seconds = static_cast<double>(c.other_flops) / m.fp32_flops_per_second;
  const std::pair<double, const char*> parts[] = {
      {r.hbm_seconds, "hbm"}, {r.matmul_seconds, "matmul"}, {r.exp_seconds, "exp"}, {r.other_seconds, "other"}};
  for (const auto& [seconds, name] : parts) {
    if (seconds > r.seconds) r.seconds = seconds, r.bound_by = name;
  }
  return r;
}

}  // namespace flashlab::sim
