// Machine presets (every file parses, every number has its source), the roofline, the printers
// and the byte-size parser.
#include <cmath>
#include <set>
#include <sstream>
#include <string>

#include "catch.hpp"
#include "sim/machines.hpp"
#include "sim/report.hpp"
#include "sim/schedules.hpp"
#include "sim/sweep.hpp"

using namespace flashlab;
using namespace flashlab::sim;
using flashlab::testing::contains_text;

TEST_CASE("the machine presets parse and cite a source for every number", "[sim][machines]") {
  const std::vector<Machine> machines = load_machines();
  std::set<std::string> keys;
  for (const Machine& m : machines) {
    INFO(m.key);
    keys.insert(m.key);
    CHECK(m.sram_bytes >= 48 * 1024);
    CHECK(m.hbm_bytes_per_second > 1e11);
    CHECK(m.matmul_flops_per_second > m.fp32_flops_per_second);
    CHECK(m.fp32_flops_per_second > m.exp_per_second);
    for (const std::string* source : {&m.sram_source, &m.hbm_source, &m.matmul_source, &m.exp_source, &m.fp32_source}) {
      CHECK(source->size() > 10);
    }
    CHECK(machine_from_json(to_json(m), "round trip").name == m.name);  // JSON round trip
  }
  CHECK(keys == std::set<std::string>{"a100", "b200", "h100", "h200", "t4", "titan_rtx"});
  CHECK(default_machine().key == "h100");
  CHECK(find_machine("h100").sram_bytes == default_machine().sram_bytes);
  CHECK_THROWS_AS(find_machine("z80"), std::invalid_argument);
  CHECK_THROWS_WITH(find_machine("z80"), contains_text("machine 'z80' is unknown") && contains_text("allowed: a100"));
  nlohmann::json broken = to_json(default_machine());
  broken.erase("hbm_source");
  CHECK_THROWS_AS(machine_from_json(broken, "test"), std::invalid_argument);
  CHECK_THROWS_WITH(machine_from_json(broken, "test"), contains_text("test: field 'hbm_source' is missing"));
  broken = to_json(default_machine());
  broken["matmul_flops_per_second"] = -1;
  CHECK_THROWS_AS(machine_from_json(broken, "test"), std::invalid_argument);
  CHECK_THROWS_WITH(machine_from_json(broken, "test"),
                    contains_text("field 'matmul_flops_per_second' = -1") && contains_text("allowed: > 0"));
}

TEST_CASE("the roofline time is the slowest of the four resources", "[sim][machines]") {
  Machine m = default_machine();
  Counters c;
  c.tensor[static_cast<int>(TensorId::Q)].hbm_read_bytes = 3'350'000'000;  // 1 ms of HBM on an H100
  c.matmul_flops = 989'000'000'000 / 2;                                      // 0.5 ms of tensor cores
  c.exponentials = 3'900'000'000 * 2;                                        // 2 ms of exponentials
  const Roofline r = roofline(c, m);
  CHECK(r.bound_by == "exp");
  CHECK(std::fabs(r.seconds - 2e-3) < 1e-9);
  CHECK(std::fabs(r.hbm_seconds - 1e-3) < 1e-9);
}

TEST_CASE("printers and parsers", "[sim][report]") {
  CHECK(parse_bytes("228K") == 233472);
  CHECK(parse_bytes("64KB") == 65536);
  CHECK(parse_bytes("1M") == 1048576);
  CHECK(parse_bytes("4096") == 4096);
  CHECK_THROWS_AS(parse_bytes("12Q"), std::invalid_argument);
  CHECK_THROWS_WITH(parse_bytes("12Q"), contains_text("size '12Q' is not understood") && contains_text("allowed"));
  CHECK_THROWS_AS(parse_bytes("K"), std::invalid_argument);
  CHECK(human_bytes(40.3e9) == "40.3 GB");
  CHECK(std::fabs(fit_exponent({1, 2, 4, 8}, {3, 12, 48, 192}) - 2.0) < 1e-12);
  CHECK_THROWS_AS(parse_mask("diagonal"), std::invalid_argument);
  CHECK_THROWS_WITH(parse_mask("diagonal"), contains_text("mask 'diagonal' is not understood") && contains_text("allowed"));
  CHECK(parse_mask("window:16").window_left == 16);
  CHECK(parse_mask("sparse:0.25").kept_fraction == 0.25);

  Problem problem;
  problem.seqlen_q = problem.seqlen_k = 256;
  problem.head_dim = 32;
  RunOptions options;
  options.sram_bytes = 32 * 1024;
  const RunResult run = run_schedule("fa2", problem, options);
  const nlohmann::json json = to_json(run.counters);
  CHECK(json["hbm_bytes"] == run.counters.hbm_bytes());
  CHECK(json["tensors"]["K"]["read_elements"] == run.counters[TensorId::K].hbm_read_elements);
  CHECK_FALSE(json["tensors"].contains("S"));  // FA2 never moves S
  std::ostringstream table;
  print_counters(table, run.counters);
  CHECK(table.str().find("HBM traffic") != std::string::npos);
}

TEST_CASE("the H200 preset's GPU description and time-model constants: checked, sourced, round trip", "[sim][machines]") {
  const Machine h200 = find_machine("h200");
  REQUIRE(h200.gpu);
  REQUIRE(h200.time_model);
  for (const std::string* source : {&h200.gpu->sm_source, &h200.gpu->clock_source, &h200.gpu->occupancy_source,
                                    &h200.gpu->l2_source, &h200.gpu->l2_partitions_source, &h200.gpu->copy_source,
                                    &h200.gpu->l2_bandwidth_source, &h200.gpu->matmul_measured_source, &h200.time_model->source}) {
    CHECK(source->size() > 10);
  }
  nlohmann::json broken = to_json(h200);
  broken["gpu"]["l2_sector_bytes"] = 48;
  CHECK_THROWS_WITH(machine_from_json(broken, "test"), contains_text("l2_sector_bytes") && contains_text("a divisor of l2_line_bytes"));
  broken = to_json(h200);
  broken["time_model"]["kernels"]["fa2_forward"]["tensor_efficiency_by_head_dim"]["x"] = 0.5;
  CHECK_THROWS_WITH(machine_from_json(broken, "test"), contains_text("key 'x' is not a head dim"));
  broken = to_json(h200);
  broken["gpu"].erase("l2_source");
  CHECK_THROWS_WITH(machine_from_json(broken, "test"), contains_text("l2_source"));
  CHECK(machine_from_json(to_json(h200), "round trip").gpu->l2_bytes == h200.gpu->l2_bytes);
  CHECK(to_json(machine_from_json(to_json(h200), "round trip")) == to_json(h200));
}
