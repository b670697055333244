#include "check.hpp"

#include <cmath>
#include <limits>
#include <random>

#include "algorithms/01_softmax.hpp"
#include "algorithms/tile_memory.hpp"

namespace flashlab::sim {

double max_error(const HostTensor& got, const OracleTensor& expected) {
  if (got.rows != expected.rows || got.heads != expected.heads || got.dim != expected.dim) {
    return std::numeric_limits<double>::infinity();
  }
  return max_abs_error(got.values, expected.values);
}

bool CheckRow::passed() const {
  for (const auto& [name, error] : errors) {
    if (!(error <= tolerance)) return false;
  }
  return true;
}

double check_tolerance(DType dtype, Pass pass) {
  const double tolerance = dtype == DType::fp32 ? 1e-4 : 2e-2;
  return pass == Pass::backward ? 3 * tolerance : tolerance;
}

Problem default_check_problem() {
  Problem p;
  p.batch = 2;
  p.heads_q = 4;
  p.heads_kv = 2;
  p.seqlen_q = 113;
  p.seqlen_k = 203;
  p.head_dim = 59;
  return p;
}

CheckRow check_schedule(const std::string& schedule, const Problem& problem, std::int64_t sram_bytes, std::uint64_t seed) {
  const ScheduleInfo& info = find_schedule(schedule);
  RunOptions options;
  options.memory = MemoryKind::data;
  options.sram_bytes = sram_bytes;
  options.seed = seed;
  const RunResult run = run_schedule(schedule, problem, options);
  CheckRow row;
  row.schedule = schedule;
  row.paper = info.paper;
  row.blocks = run.blocks;
  row.hbm_bytes = run.counters.hbm_bytes();
  row.tolerance = check_tolerance(problem.dtype, info.pass);
  if (info.pass == Pass::backward) {
    const OracleResult oracle = oracle_attention(problem, run.tensors, &run.tensors.dO);
    row.errors = {{"dQ", max_error(run.tensors.dQ, oracle.dQ)},
                  {"dK", max_error(run.tensors.dK, oracle.dK)},
                  {"dV", max_error(run.tensors.dV, oracle.dV)}};
  } else {
    const OracleResult oracle = oracle_attention(problem, run.tensors);
    row.errors = {{"O", max_error(run.tensors.O, oracle.O)}, {"LSE", max_error(run.tensors.LSE, oracle.LSE)}};
  }
  return row;
}

namespace {

// The softmax lab on X = the scores of one head-sized random matrix: each schedule against a
// double softmax (and softmax(X) V for the single-pass one).
std::vector<CheckRow> check_softmax_lab(std::uint64_t seed) {
  constexpr int kRows = 37, kCols = 203, kValueDim = 40, kBlock = 48;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  HbmScratch scratch(true);
  const HbmMatrix X = scratch.matrix(TensorId::X, DType::fp32, kRows, kCols);
  const HbmMatrix V = scratch.matrix(TensorId::V, DType::fp32, kCols, kValueDim);
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kCols; ++c) X.at(r, c) = normal(rng);
  for (int r = 0; r < kCols; ++r)
    for (int c = 0; c < kValueDim; ++c) V.at(r, c) = normal(rng);
  std::vector<double> softmax(static_cast<std::size_t>(kRows) * kCols);
  for (int r = 0; r < kRows; ++r) {
    double max = -INFINITY, sum = 0;
    for (int c = 0; c < kCols; ++c) max = std::max(max, static_cast<double>(X.at(r, c)));
    for (int c = 0; c < kCols; ++c) sum += std::exp(X.at(r, c) - max);
    for (int c = 0; c < kCols; ++c) softmax[static_cast<std::size_t>(r) * kCols + c] = std::exp(X.at(r, c) - max) / sum;
  }
  const auto error_against = [&](const HbmMatrix& Y, bool times_values) {
    double worst = 0;
    for (int r = 0; r < kRows; ++r) {
      for (int c = 0; c < Y.cols; ++c) {
        double expected = 0;
        if (times_values) {
          for (int k = 0; k < kCols; ++k) expected += softmax[static_cast<std::size_t>(r) * kCols + k] * V.at(k, c);
        } else {
          expected = softmax[static_cast<std::size_t>(r) * kCols + c];
        }
        const double got = Y.at(r, c);
        worst = std::isnan(got) ? INFINITY : std::max(worst, std::fabs(got - expected));
      }
    }
    return worst;
  };
  std::vector<CheckRow> rows;
  const auto add = [&](const char* name, const char* paper, const HbmMatrix& Y, bool times_values, const Counters& counters) {
    CheckRow row;
    row.schedule = name;
    row.paper = paper;
    row.blocks = {kRows, kBlock};
    row.errors = {{times_values ? "softmax(X) V" : "softmax(X)", error_against(Y, times_values)}};
    row.hbm_bytes = counters.hbm_bytes();
    row.tolerance = 1e-4;
    rows.push_back(row);
  };
  const SoftmaxTiling tiling{kBlock};
  {
    DataMemory mem;
    const HbmMatrix Y = scratch.matrix(TensorId::Y, DType::fp32, kRows, kCols);
    softmax_three_pass(mem, X, Y, tiling);
    add("softmax_three_pass", "Milakov-Gimelshein Alg 2", Y, false, mem.counters());
  }
  {
    DataMemory mem;
    const HbmMatrix Y = scratch.matrix(TensorId::Y, DType::fp32, kRows, kCols);
    softmax_online_normalizer(mem, X, Y, tiling);
    add("softmax_online_normalizer", "Milakov-Gimelshein Alg 3", Y, false, mem.counters());
  }
  {
    DataMemory mem;
    const HbmMatrix Y = scratch.matrix(TensorId::Y, DType::fp32, kRows, kValueDim);
    softmax_times_values_single_pass(mem, X, V, Y, tiling);
    add("softmax_times_values", "online softmax (FA)", Y, true, mem.counters());
  }
  return rows;
}

}  // namespace

std::vector<CheckRow> check_all(const Problem& problem, std::int64_t sram_bytes, std::uint64_t seed) {
  std::vector<CheckRow> rows = check_softmax_lab(seed);
  for (const ScheduleInfo& info : schedules()) rows.push_back(check_schedule(info.name, problem, sram_bytes, seed));
  return rows;
}

}  // namespace flashlab::sim
