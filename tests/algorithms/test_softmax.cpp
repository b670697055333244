// The softmax lab (01_softmax.hpp): three schedules against a double-precision softmax, their
// HBM traffic (3, 2 and 1 reads of X), and shape-only counting.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "algorithms/00_oracle.hpp"  // max_abs_error
#include "algorithms/01_softmax.hpp"
#include "catch.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

struct HostMatrix {
  TensorId id;
  int rows, cols;
  std::vector<float> values;
  HostMatrix(TensorId id, int rows, int cols, float fill)
      : id(id), rows(rows), cols(cols), values(static_cast<std::size_t>(rows) * cols, fill) {}
  HbmMatrix view() { return {id, DType::fp32, values.data(), rows, cols, cols}; }
  HbmMatrix shape_only() const { return {id, DType::fp32, nullptr, rows, cols, cols}; }
  float at(int r, int c) const { return values[static_cast<std::size_t>(r) * cols + c]; }
};

// Scores with a spread of 4, some -inf (masked) entries, and (with 3 rows or more) a fully
// masked row.
HostMatrix random_scores(int rows, int cols, std::uint64_t seed) {
  HostMatrix x(TensorId::X, rows, cols, 0.0f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::bernoulli_distribution masked(0.1);
  for (float& value : x.values)
    value = masked(rng) ? -std::numeric_limits<float>::infinity() : normal(rng);
  if (rows >= 3)
    std::fill_n(x.values.begin() + cols, cols, -std::numeric_limits<float>::infinity());
  return x;
}

// softmax of each row in double; a fully masked row gives zeros. Also each row's log-sum-exp.
std::vector<double> softmax_double(const HostMatrix& x, std::vector<double>* lse = nullptr) {
  std::vector<double> y(x.values.size(), 0.0);
  for (int r = 0; r < x.rows; ++r) {
    double max = -INFINITY;
    for (int c = 0; c < x.cols; ++c) max = std::max(max, static_cast<double>(x.at(r, c)));
    if (lse) lse->push_back(max);
    if (max == -INFINITY) continue;
    double sum = 0;
    for (int c = 0; c < x.cols; ++c) sum += std::exp(x.at(r, c) - max);
    for (int c = 0; c < x.cols; ++c)
      y[static_cast<std::size_t>(r) * x.cols + c] = std::exp(x.at(r, c) - max) / sum;
    if (lse) lse->back() = max + std::log(sum);
  }
  return y;
}

// The largest |got - expected| / (|expected| + 1e-3): a float sum of n positive terms is exact to
// a relative n * 2^-24 at worst (6e-5 for n = 1024), so probabilities are compared relatively.
double max_relative_error(const std::vector<float>& got, const std::vector<double>& expected) {
  double error = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) return INFINITY;
    error = std::max(error, std::fabs(got[i] - expected[i]) / (std::fabs(expected[i]) + 1e-3));
  }
  return error;
}

}  // namespace

TEST_CASE("softmax lab: the three-pass and online-normalizer softmax match a double softmax",
          "[softmax]") {
  const int rows = GENERATE(1, 3);
  const int cols = GENERATE(1, 7, 203, 1024);
  const int block = GENERATE(1, 16, 64, 1000);
  const auto seed = reference::fresh_seed();
  HostMatrix x = random_scores(rows, cols, seed);
  const std::vector<double> expected = softmax_double(x);
  INFO(rows << " x " << cols << ", block " << block << ", seed " << seed);

  HostMatrix y3(TensorId::Y, rows, cols, NAN), y2(TensorId::Y, rows, cols, NAN);
  DataMemory three_pass, online;
  softmax_three_pass(three_pass, x.view(), y3.view(), {block});
  softmax_online_normalizer(online, x.view(), y2.view(), {block});
  CHECK(max_relative_error(y3.values, expected) <= 1e-4);
  CHECK(max_relative_error(y2.values, expected) <= 1e-4);

  // Milakov and Gimelshein's point: 3 reads of X become 2; Y is written once either way.
  const std::int64_t elements = static_cast<std::int64_t>(rows) * cols;
  CHECK(three_pass.counters()[TensorId::X].hbm_read_elements == 3 * elements);
  CHECK(online.counters()[TensorId::X].hbm_read_elements == 2 * elements);
  CHECK(three_pass.counters()[TensorId::Y].hbm_write_elements == elements);
  CHECK(online.counters()[TensorId::Y].hbm_write_elements == elements);
}

TEST_CASE("softmax lab: the single-pass online update computes softmax(X) V", "[softmax]") {
  const int rows = GENERATE(1, 3);
  const int cols = GENERATE(1, 7, 203, 1024);
  const int block = GENERATE(1, 16, 1000);
  const int value_dim = 5;
  const auto seed = reference::fresh_seed();
  HostMatrix x = random_scores(rows, cols, seed);
  HostMatrix v(TensorId::V, cols, value_dim, 0.0f);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& value : v.values) value = normal(rng);
  std::vector<double> expected_lse;
  const std::vector<double> p = softmax_double(x, &expected_lse);
  std::vector<double> expected(static_cast<std::size_t>(rows) * value_dim, 0.0);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      for (int k = 0; k < value_dim; ++k)
        expected[r * value_dim + k] += p[static_cast<std::size_t>(r) * cols + c] * v.at(c, k);
  INFO(rows << " x " << cols << ", block " << block << ", seed " << seed);

  HostMatrix y(TensorId::Y, rows, value_dim, NAN), lse(TensorId::LSE, rows, 1, NAN);
  DataMemory mem;
  const HbmMatrix lse_view = lse.view();
  softmax_times_values_single_pass(mem, x.view(), v.view(), y.view(), {block}, &lse_view);
  CHECK(max_abs_error(y.values, expected) <= 1e-5);
  CHECK(max_abs_error(lse.values, expected_lse) <= 1e-5);
  CHECK(mem.counters()[TensorId::X].hbm_read_elements ==
        static_cast<std::int64_t>(rows) * cols);  // one pass
}

TEST_CASE("softmax lab: shape-only runs count exactly what data runs count",
          "[softmax][counters]") {
  const int cols = GENERATE(7, 203);
  const int block = GENERATE(4, 64);
  HostMatrix x = random_scores(3, cols, reference::fresh_seed());
  HostMatrix y(TensorId::Y, 3, cols, NAN), v(TensorId::V, cols, 6, 1.0f),
      yv(TensorId::Y, 3, 6, NAN);
  {
    DataMemory data;
    ShapeMemory shape;
    softmax_three_pass(data, x.view(), y.view(), {block});
    softmax_three_pass(shape, x.shape_only(), y.shape_only(), {block});
    CHECK(data.counters() == shape.counters());
  }
  {
    DataMemory data;
    ShapeMemory shape;
    softmax_online_normalizer(data, x.view(), y.view(), {block});
    softmax_online_normalizer(shape, x.shape_only(), y.shape_only(), {block});
    CHECK(data.counters() == shape.counters());
  }
  {
    DataMemory data;
    ShapeMemory shape;
    softmax_times_values_single_pass(data, x.view(), v.view(), yv.view(), {block});
    softmax_times_values_single_pass(shape, x.shape_only(), v.shape_only(), yv.shape_only(),
                                     {block});
    CHECK(data.counters() == shape.counters());
    CHECK(shape.counters().exponentials > 0);
  }
}

TEST_CASE("softmax lab: bad input names the input and the allowed range", "[softmax][errors]") {
  using flashlab::testing::contains_text;
  HostMatrix x(TensorId::X, 2, 10, 0.0f), y(TensorId::Y, 2, 10, 0.0f),
      wrong(TensorId::Y, 2, 9, 0.0f);
  HostMatrix v(TensorId::V, 9, 3, 0.0f);
  ShapeMemory mem;
  CHECK_THROWS_WITH(softmax_three_pass(mem, x.shape_only(), y.shape_only(), {0}),
                    contains_text("block_cols = 0") && contains_text("allowed: >= 1"));
  CHECK_THROWS_WITH(softmax_online_normalizer(mem, x.shape_only(), y.shape_only(), {-2}),
                    contains_text("block_cols = -2"));
  CHECK_THROWS_AS(softmax_three_pass(mem, x.shape_only(), wrong.shape_only(), {4}),
                  std::invalid_argument);
  CHECK_THROWS_WITH(softmax_three_pass(mem, x.shape_only(), wrong.shape_only(), {4}),
                    contains_text("Y is 2 x 9") && contains_text("allowed: 2 x 10"));
  CHECK_THROWS_WITH(
      softmax_times_values_single_pass(mem, x.shape_only(), v.shape_only(), y.shape_only(), {4}),
      contains_text("V has 9 rows") && contains_text("allowed"));
}

TEST_CASE("softmax lab: each schedule marks its paper's lines", "[softmax][trace]") {
  struct LineRecorder : TraceSink {
    std::vector<int> lines;
    void record(const TraceEvent& event) noexcept override {
      if (event.kind == EventKind::line && (lines.empty() || lines.back() != event.line))
        lines.push_back(event.line);
    }
  };
  HostMatrix x = random_scores(2, 10, reference::fresh_seed());
  HostMatrix y(TensorId::Y, 2, 10, NAN), v(TensorId::V, 10, 3, 1.0f), yv(TensorId::Y, 2, 3, NAN);
  const SoftmaxTiling two_blocks{5};
  {  // Milakov and Gimelshein, Algorithm 2: max pass (line 3), sum pass (7), normalise (10).
    LineRecorder recorder;
    DataMemory mem({}, &recorder);
    softmax_three_pass(mem, x.view(), y.view(), two_blocks);
    CHECK(recorder.lines == std::vector<int>{1, 3, 5, 7, 10});
  }
  {  // Algorithm 3: lines 4-5 once per block, then the normalising pass (line 8).
    LineRecorder recorder;
    DataMemory mem({}, &recorder);
    softmax_online_normalizer(mem, x.view(), y.view(), two_blocks);
    CHECK(recorder.lines == std::vector<int>{1, 2, 4, 5, 4, 5, 8});
  }
  {  // FA2 Algorithm 1's lines 5, 7 and 9 per block, 12 at the end: one pass.
    LineRecorder recorder;
    DataMemory mem({}, &recorder);
    softmax_times_values_single_pass(mem, x.view(), v.view(), yv.view(), two_blocks);
    CHECK(recorder.lines == std::vector<int>{5, 7, 9, 7, 9, 12});
  }
}
