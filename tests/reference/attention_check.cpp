#include "reference/attention_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "algorithms/00_oracle.hpp"
#include "algorithms/for_each_unit.hpp"

namespace flashlab::reference {

// Per (sequence, query head) in parallel, each writing its own rows: the same bit for bit whatever
// the thread count.
NaiveOutputs naive_forward_same_precision(const Problem& problem, const AttentionTensors& x) {
  const DType dtype = problem.dtype;
  const int d = problem.head_dim, dv = problem.value_dim();
  const float scale = static_cast<float>(problem.scale());
  NaiveOutputs out;
  out.O = HostTensor(TensorId::O, dtype, x.Q.rows, problem.heads_q, dv);
  out.LSE = HostTensor(TensorId::LSE, DType::fp32, x.Q.rows, problem.heads_q, 1);
  for_each_unit(problem.batch * problem.heads_q, hardware_workers(), [&](int unit) {
    const int b = unit / problem.heads_q, h = unit % problem.heads_q;
    const HeadProblem head = head_problem(problem, b, h);
    const int row_q = problem.first_row_q(b), row_k = problem.first_row_k(b), kv = problem.kv_head(h);
    std::vector<float> s(head.seqlen_k, 0.f), p(head.seqlen_k, 0.f), acc(dv);
    for (int i = 0; i < head.seqlen_q; ++i) {
      float row_max = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < head.seqlen_k; ++j) {
        if (!head.key_visible(i, j)) {
          s[j] = -std::numeric_limits<float>::infinity();
          continue;
        }
        float dot = 0.f;  // fp32 accumulation, as the tensor cores and cuBLAS do
        for (int c = 0; c < d; ++c) dot += x.Q.at(row_q + i, h, c) * x.K.at(row_k + j, kv, c);
        // softcap, then ALiBi, written here as in the oracle (not through the code under test)
        float score = dot * scale;
        if (head.softcap > 0) score = head.softcap * std::tanh(score / head.softcap);
        if (head.alibi_slope != 0) score -= head.alibi_slope * static_cast<float>(std::abs(i + head.diagonal_offset() - j));
        s[j] = round_to(dtype, score);
        row_max = std::max(row_max, s[j]);
      }
      float sum = 0.f;
      for (int j = 0; j < head.seqlen_k; ++j) {
        p[j] = row_max == -std::numeric_limits<float>::infinity() ? 0.f : std::exp(s[j] - row_max);
        sum += p[j];
      }
      for (int j = 0; j < head.seqlen_k; ++j) p[j] = sum > 0 ? round_to(dtype, p[j] / sum) : 0.f;
      if (head.dropout.probability > 0) {  // dropout on the stored P, as a framework applies it
        for (int j = 0; j < head.seqlen_k; ++j)
          p[j] = head.dropout_keeps(i, j) ? round_to(dtype, p[j] * head.dropout_scale()) : 0.f;
      }
      // O = P V: each output's fp32 sum over the keys in increasing order, along V's rows.
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int j = 0; j < head.seqlen_k; ++j) {
        const float weight = p[j];
        for (int c = 0; c < dv; ++c) acc[c] += weight * x.V.at(row_k + j, kv, c);
      }
      for (int c = 0; c < dv; ++c) out.O.at(row_q + i, h, c) = round_to(dtype, acc[c]);
      out.LSE.at(row_q + i, h, 0) = sum > 0 ? row_max + std::log(sum) : -std::numeric_limits<float>::infinity();
    }
  });
  return out;
}

std::string describe_row(const Problem& problem, int packed_row) {
  int batch = 0;
  for (int b = 0; b < problem.batch; ++b) {
    if (packed_row >= problem.first_row_q(b)) batch = b;
  }
  std::ostringstream text;
  text << "batch " << batch << ", position " << packed_row - problem.first_row_q(batch);
  return text.str();
}

namespace {

// ForwardCheckOptions::key_growth: K row j of each sequence scaled by 1 + growth * j / seqlen_k.
void grow_keys(const Problem& problem, HostTensor& k, double growth) {
  for (int b = 0; b < problem.batch; ++b) {
    const int length = problem.seqlen_k_of(b), first = problem.first_row_k(b);
    for (int j = 0; j < length; ++j) {
      const double factor = 1.0 + growth * j / length;
      for (int h = 0; h < k.heads; ++h) {
        for (int c = 0; c < k.dim; ++c) {
          k.at(first + j, h, c) = round_to(problem.dtype, static_cast<float>(k.at(first + j, h, c) * factor));
        }
      }
    }
  }
}

std::string describe_error(const Problem& problem, const char* name, const ErrorReport& error, double naive_error,
                           const Tolerance& tolerance) {
  std::ostringstream text;
  text << name << ": max error " << error.max_error;
  if (error.row >= 0) {
    text << " at (" << describe_row(problem, error.row) << ", head " << error.head << ", col " << error.col
         << "): got " << error.got << ", expected " << error.expected;
  }
  text << "; naive same-precision error " << naive_error << ", limit " << tolerance.factor * naive_error + tolerance.slack;
  if (error.nan_count > 0) text << "; " << error.nan_count << " NaN or unwritten elements";
  if (error.nan_count < 0) text << "; shape differs from the reference";
  return text.str();
}

bool bitwise_equal(const HostTensor& a, const HostTensor& b) {
  return a.values.size() == b.values.size() &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0;
}

}  // namespace

CaseResult check_forward_case(const ForwardImplementation& implementation, const Problem& problem,
                              const ForwardCheckOptions& options) {
  CaseResult result;
  result.problem = problem;
  result.seed = fresh_seed();
  AttentionTensors tensors = random_inputs(problem, result.seed, false);
  if (options.key_growth > 0) grow_keys(problem, tensors.K, options.key_growth);
  if (options.input_scale != 1) scale_queries_and_keys(tensors, options.input_scale);
  std::ostringstream header;
  header << describe(problem) << ", seed " << result.seed;
  if (options.key_growth > 0) header << ", key growth " << options.key_growth;
  if (options.input_scale != 1) header << ", Q and K scaled by " << options.input_scale;
  try {
    implementation(problem, tensors);
  } catch (const std::invalid_argument& refusal) {
    result.status = CaseResult::Status::refused;
    result.report = "REFUSED " + header.str() + ": " + refusal.what();
    return result;
  } catch (const ImplementationFailure& failure) {
    result.status = CaseResult::Status::failed;
    result.report = "FAILED " + header.str() + ": " + failure.what();
    return result;
  }

  const OracleResult oracle = oracle_attention(problem, tensors, nullptr, OracleOptions{.workers = hardware_workers()});
  const NaiveOutputs naive = naive_forward_same_precision(problem, tensors);
  const ErrorReport o_error = compare(tensors.O, oracle.O);
  const ErrorReport lse_error = compare(tensors.LSE, oracle.LSE);
  const ErrorReport o_naive = compare(naive.O, oracle.O);
  const ErrorReport lse_naive = compare(naive.LSE, oracle.LSE);
  result.o_error = o_error.max_error, result.o_naive_error = o_naive.max_error;
  result.lse_error = lse_error.max_error, result.lse_naive_error = lse_naive.max_error;
  for (double lse : oracle.LSE.values) result.fully_masked_rows += std::isinf(lse) ? 1 : 0;

  Tolerance output = options.output;
  output.slack = std::max(output.slack, rounding_slack(problem.dtype, oracle.O));
  bool ok = within_rule(o_error, o_naive.max_error, output) &&
            (!options.check_lse || within_rule(lse_error, lse_naive.max_error, options.lse));
  // A row that sees no key must be exactly O = 0 and LSE = -inf: the max-error rule alone would
  // let a small value through there whenever the visible rows' naive error is larger.
  std::string masked_rows;
  long long masked_wrong = 0;
  for (int row = 0; row < tensors.O.rows; ++row) {
    for (int h = 0; h < tensors.O.heads; ++h) {
      if (!std::isinf(oracle.LSE.at(row, h, 0))) continue;
      float largest_o = 0.0f;  // NaN (unwritten) stays visible: max with NaN is kept below
      for (int c = 0; c < tensors.O.dim; ++c) {
        const float o = std::fabs(tensors.O.at(row, h, c));
        if (!(o <= largest_o)) largest_o = o;
      }
      const bool lse_right = !options.check_lse || tensors.LSE.at(row, h, 0) == -std::numeric_limits<float>::infinity();
      if (lse_right && largest_o == 0.0f) continue;
      if (masked_wrong++ == 0) {
        std::ostringstream first;
        first << "(" << describe_row(problem, row) << ", head " << h << "): ";
        if (options.check_lse) first << "LSE " << tensors.LSE.at(row, h, 0) << ", ";
        first << "max |O| " << largest_o;
        masked_rows = first.str();
      }
    }
  }
  if (masked_wrong > 0) {
    ok = false;
    masked_rows = std::string("\n  fully masked rows not exactly O = 0") + (options.check_lse ? ", LSE = -inf" : "") +
                  ": " + std::to_string(masked_wrong) + ", first at " + masked_rows;
  }
  std::string determinism;
  if (options.check_determinism) {
    AttentionTensors again = tensors;
    poison_outputs(again);
    try {
      implementation(problem, again);
      if (!bitwise_equal(again.O, tensors.O) || (options.check_lse && !bitwise_equal(again.LSE, tensors.LSE))) {
        ok = false;
        determinism = "; a second run on the same inputs differs (not deterministic)";
      }
    } catch (const ImplementationFailure& failure) {
      ok = false;
      determinism = std::string("; the second run failed: ") + failure.what();
    }
  }
  result.status = ok ? CaseResult::Status::passed : CaseResult::Status::failed;
  std::ostringstream text;
  text << (ok ? "passed " : "FAILED ") << header.str() << "; " << result.fully_masked_rows << " fully masked rows\n  "
       << describe_error(problem, "O", o_error, o_naive.max_error, output) << "\n  "
       << (options.check_lse ? describe_error(problem, "LSE", lse_error, lse_naive.max_error, options.lse)
                             : std::string("LSE: not checked (the implementation gives none)"))
       << masked_rows << determinism;
  result.report = text.str();
  return result;
}

GridResult check_forward_grid(const ForwardImplementation& implementation, const std::vector<Problem>& grid,
                              const ForwardCheckOptions& options) {
  GridResult grid_result;
  for (const Problem& problem : grid) {
    CaseResult result = check_forward_case(implementation, problem, options);
    switch (result.status) {
      case CaseResult::Status::passed: ++grid_result.passed; break;
      case CaseResult::Status::failed: ++grid_result.failed; break;
      case CaseResult::Status::refused: ++grid_result.refused; break;
    }
    grid_result.cases.push_back(std::move(result));
  }
  return grid_result;
}

std::string GridResult::summary() const {
  std::ostringstream text;
  for (const CaseResult& c : cases) {
    if (c.status != CaseResult::Status::passed) text << c.report << "\n";
  }
  text << passed << " passed, " << failed << " failed, " << refused << " refused, of " << cases.size() << " cases";
  return text.str();
}

const std::vector<std::pair<int, int>>& official_odd_shapes() {
  static const std::vector<std::pair<int, int>> shapes = {{113, 203}, {128, 217}, {113, 211}, {108, 256},
                                                          {256, 512}, {512, 256}, {1023, 1024}, {1024, 1023},
                                                          {1, 1},     {239, 1},   {799, 3}};
  return shapes;
}

std::vector<Problem> default_forward_grid(DType dtype, const std::vector<int>& head_dims) {
  if (head_dims.empty()) throw std::invalid_argument("default_forward_grid: head_dims is empty; allowed: at least one");
  std::vector<Problem> grid;
  int next_dim = 0;
  const int heads[3][2] = {{2, 2}, {4, 2}, {3, 1}};  // MHA, GQA, MQA
  auto base = [&](int seqlen_q, int seqlen_k) {
    Problem p;
    p.dtype = dtype;
    p.seqlen_q = seqlen_q;
    p.seqlen_k = seqlen_k;
    p.head_dim = head_dims[next_dim % head_dims.size()];
    p.heads_q = heads[next_dim % 3][0];
    p.heads_kv = heads[next_dim % 3][1];
    p.batch = static_cast<long long>(seqlen_q) * seqlen_k <= 256 * 512 ? 2 : 1;
    ++next_dim;
    return p;
  };
  // Odd shapes x {no mask, causal bottom-right, causal top-left}.
  for (const auto& [seqlen_q, seqlen_k] : official_odd_shapes()) {
    for (int mask_kind = 0; mask_kind < 3; ++mask_kind) {
      Problem p = base(seqlen_q, seqlen_k);
      p.mask.causal = mask_kind != 0;
      p.mask.alignment = mask_kind == 2 ? CausalAlignment::top_left : CausalAlignment::bottom_right;
      grid.push_back(p);
    }
  }
  // Sliding windows, with and without causal.
  struct WindowCase {
    int seqlen_q, seqlen_k, left, right;
    bool causal;
  };
  for (const WindowCase& w : {WindowCase{256, 512, 32, 16, false}, WindowCase{113, 203, 40, -1, true},
                              WindowCase{512, 256, -1, 8, false}, WindowCase{1023, 1024, 100, 100, false},
                              WindowCase{799, 3, 0, 0, false}}) {
    Problem p = base(w.seqlen_q, w.seqlen_k);
    p.mask.window_left = w.left;
    p.mask.window_right = w.right;
    p.mask.causal = w.causal;
    grid.push_back(p);
  }
  // Variable-length batches (some sequences of length 1, some longer on either side).
  for (int causal = 0; causal < 2; ++causal) {
    Problem p = base(1, 1);
    set_varlen(p, {113, 1, 239, 64}, {203, 3, 1, 64});
    p.mask.causal = causal == 1;
    grid.push_back(p);
  }
  return grid;
}

}  // namespace flashlab::reference
