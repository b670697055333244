#include "reference_check.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>

namespace flashlab::reference {

namespace {
void fill_normal(HostTensor& t, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : t.values) x = round_to(t.dtype, normal(rng));
}
void fill_nan(HostTensor& t) {
  for (float& x : t.values) x = std::numeric_limits<float>::quiet_NaN();
}
}  // namespace

AttentionTensors random_inputs(const Problem& problem, std::uint64_t seed, bool with_backward) {
  problem.validate();
  AttentionTensors t = AttentionTensors::allocate(problem, with_backward);
  std::mt19937_64 rng(seed);
  fill_normal(t.Q, rng);
  fill_normal(t.K, rng);
  fill_normal(t.V, rng);
  if (with_backward) fill_normal(t.dO, rng);
  poison_outputs(t);
  return t;
}

void poison_outputs(AttentionTensors& t) {
  fill_nan(t.O);
  fill_nan(t.LSE);
  fill_nan(t.dQ);
  fill_nan(t.dK);
  fill_nan(t.dV);
}

void scale_queries_and_keys(AttentionTensors& tensors, double factor) {
  for (HostTensor* tensor : {&tensors.Q, &tensors.K}) {
    for (float& x : tensor->values) x = round_to(tensor->dtype, static_cast<float>(x * factor));
  }
}

std::uint64_t fresh_seed() {
  // Replay: FLASHLAB_TEST_SEED=<seed from a report> makes every case draw that seed.
  if (const char* replay = std::getenv("FLASHLAB_TEST_SEED"); replay != nullptr && *replay != '\0') {
    return std::strtoull(replay, nullptr, 10);
  }
  static std::atomic<std::uint64_t> counter{0};
  const auto now = static_cast<std::uint64_t>(std::chrono::high_resolution_clock::now().time_since_epoch().count());
  return now * 0x9E3779B97F4A7C15ull + counter.fetch_add(1);
}

ErrorReport compare(const HostTensor& got, const OracleTensor& expected) {
  ErrorReport report;
  if (got.rows != expected.rows || got.heads != expected.heads || got.dim != expected.dim) {
    report.max_error = std::numeric_limits<double>::infinity();
    report.nan_count = -1;
    return report;
  }
  for (int r = 0; r < got.rows; ++r) {
    for (int h = 0; h < got.heads; ++h) {
      for (int c = 0; c < got.dim; ++c) {
        const double g = got.at(r, h, c), e = expected.at(r, h, c);
        double error;
        if (std::isnan(g)) {
          ++report.nan_count;
          error = std::numeric_limits<double>::infinity();
        } else if (std::isinf(e) || std::isinf(g)) {
          error = (g == e) ? 0.0 : std::numeric_limits<double>::infinity();
        } else {
          error = std::fabs(g - e);
        }
        if (report.row < 0 || error > report.max_error) {
          report.max_error = error, report.row = r, report.head = h, report.col = c, report.got = g, report.expected = e;
        }
      }
    }
  }
  return report;
}

std::string ErrorReport::describe(const std::string& tensor_name) const {
  std::ostringstream text;
  text << tensor_name << ": max error " << max_error << " at (row " << row << ", head " << head << ", col " << col
       << "): got " << got << ", expected " << expected;
  if (nan_count > 0) text << "; " << nan_count << " NaN or unwritten elements";
  if (nan_count < 0) text << "; shape differs from the reference";
  return text.str();
}

bool within_rule(const ErrorReport& error, double naive_error, Tolerance tolerance) {
  return error.nan_count == 0 && error.max_error <= tolerance.factor * naive_error + tolerance.slack;
}

double rounding_slack(DType dtype, const OracleTensor& reference) {
  if (dtype == DType::fp32) return 0.0;
  double largest = 0.0;
  for (const double value : reference.values) {
    if (!std::isfinite(value)) continue;
    const float stored = round_to(dtype, static_cast<float>(value));
    const float shifted = round_to(dtype, round_to(dtype, stored + 0.3f) - 0.3f);
    largest = std::max(largest, static_cast<double>(std::fabs(shifted - stored)));
  }
  return 2.0 * largest;
}

std::string describe(const Problem& p) {
  std::ostringstream text;
  text << "batch " << p.batch << ", heads " << p.heads_q << "/" << p.heads_kv << ", seqlen " << p.seqlen_q << "x"
       << p.seqlen_k << (p.varlen() ? " (varlen)" : "") << ", d " << p.head_dim << "/" << p.value_dim() << ", "
       << to_string(p.dtype);
  if (p.mask.causal) text << ", causal " << (p.mask.alignment == CausalAlignment::top_left ? "top-left" : "bottom-right");
  if (p.mask.window_left >= 0 || p.mask.window_right >= 0)
    text << ", window (" << p.mask.window_left << ", " << p.mask.window_right << ")";
  if (!p.alibi_slopes.empty()) text << ", alibi";
  if (p.softcap > 0) text << ", softcap " << p.softcap;
  if (p.block_sparsity.enabled()) {
    long long kept = 0;
    for (const auto k : p.block_sparsity.keep) kept += k != 0;
    text << ", block-sparse " << p.block_sparsity.block_rows << "x" << p.block_sparsity.block_cols << " blocks ("
         << kept << " of " << p.block_sparsity.keep.size() << " kept)";
  }
  if (p.dropout.probability > 0)  // the dropout mask is replayed from (seed, offset)
    text << ", dropout " << p.dropout.probability << " (seed " << p.dropout.seed << ", offset " << p.dropout.offset << ")";
  return text.str();
}

}  // namespace flashlab::reference
