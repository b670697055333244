#include "reference/backward_check.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "algorithms/for_each_unit.hpp"

namespace flashlab::reference {

namespace {

// One head's rows of a [rows, heads, dim] tensor, contiguous: [length][dim].
std::vector<float> head_rows(const HostTensor& t, int first_row, int length, int head) {
  std::vector<float> rows(static_cast<std::size_t>(length) * t.dim);
  for (int i = 0; i < length; ++i)
    for (int c = 0; c < t.dim; ++c) rows[static_cast<std::size_t>(i) * t.dim + c] = t.at(first_row + i, head, c);
  return rows;
}

}  // namespace

// Per (sequence, KV head) in parallel: each writes its own rows of dQ and of the dK/dV sums, and
// adds its query heads into those sums in increasing order, as a serial loop over heads would, so
// the result is the same bit for bit whatever the thread count.
NaiveGradients naive_backward_same_precision(const Problem& problem, const AttentionTensors& x) {
  const DType dtype = problem.dtype;
  const int d = problem.head_dim;
  const float scale = static_cast<float>(problem.scale());
  NaiveGradients out;
  out.dQ = HostTensor(TensorId::dQ, dtype, x.Q.rows, problem.heads_q, d);
  out.dK = HostTensor(TensorId::dK, dtype, x.K.rows, problem.heads_kv, d);
  out.dV = HostTensor(TensorId::dV, dtype, x.V.rows, problem.heads_kv, d);
  HostTensor dk_sum(TensorId::dK, DType::fp32, x.K.rows, problem.heads_kv, d);
  HostTensor dv_sum(TensorId::dV, DType::fp32, x.V.rows, problem.heads_kv, d);
  auto r = [dtype](float value) { return round_to(dtype, value); };
  for_each_unit(problem.batch * problem.heads_kv, hardware_workers(), [&](int unit) {
    const int b = unit / problem.heads_kv, hk = unit % problem.heads_kv;
    const int lq = problem.seqlen_q_of(b), lk = problem.seqlen_k_of(b);
    const int rq = problem.first_row_q(b), rk = problem.first_row_k(b);
    const std::vector<float> K = head_rows(x.K, rk, lk, hk), V = head_rows(x.V, rk, lk, hk);
    // K^T and V^T ([dim][length]): the scores' sums over the head dim then run along a row of keys.
    std::vector<float> KT(K.size()), VT(V.size());
    for (int j = 0; j < lk; ++j)
      for (int c = 0; c < d; ++c) {
        KT[static_cast<std::size_t>(c) * lk + j] = K[static_cast<std::size_t>(j) * d + c];
        VT[static_cast<std::size_t>(c) * lk + j] = V[static_cast<std::size_t>(j) * d + c];
      }
    for (int h = hk * problem.group_size(); h < (hk + 1) * problem.group_size(); ++h) {
      const HeadProblem head = head_problem(problem, b, h);
      const std::vector<float> Q = head_rows(x.Q, rq, lq, h), dO = head_rows(x.dO, rq, lq, h), O = head_rows(x.O, rq, lq, h);
      std::vector<float> P(static_cast<std::size_t>(lq) * lk), dS(P.size());
      for (int i = 0; i < lq; ++i) {
        const float* q_row = &Q[static_cast<std::size_t>(i) * d];
        float* p_row = &P[static_cast<std::size_t>(i) * lk];
        // S = Q K^T: each score's fp32 sum over the head dim in increasing order.
        std::fill(p_row, p_row + lk, 0.0f);
        for (int c = 0; c < d; ++c) {
          const float q = q_row[c];
          const float* kt_row = &KT[static_cast<std::size_t>(c) * lk];
          for (int j = 0; j < lk; ++j) p_row[j] += q * kt_row[j];
        }
        float row_max = -INFINITY;
        for (int j = 0; j < lk; ++j) {
          const float score = r(r(p_row[j]) * scale);
          p_row[j] = head.key_visible(i, j) ? score : -INFINITY;
          row_max = std::max(row_max, p_row[j]);
        }
        float sum = 0.0f;
        for (int j = 0; j < lk; ++j) {
          p_row[j] = (row_max == -INFINITY) ? 0.0f : std::exp(p_row[j] - row_max);
          sum += p_row[j];
        }
        for (int j = 0; j < lk; ++j) p_row[j] = sum > 0 ? r(p_row[j] / sum) : 0.0f;
        // dP = dO V^T, then the softmax backward dS = P o (dP - D). D = rowsum(dO o O) from the O
        // the kernel is given (FA2 Algorithm 2 line 4), rounded to the dtype: equal to
        // rowsum(P o dP) in exact arithmetic, and the same input rounding for both, so the rule
        // measures the kernel and not the rounding of O (rows whose few keys nearly cancel in
        // dP - D are where the two differ).
        const float* do_row = &dO[static_cast<std::size_t>(i) * d];
        const float* o_row = &O[static_cast<std::size_t>(i) * d];
        float* ds_row = &dS[static_cast<std::size_t>(i) * lk];
        float delta = 0.0f;
        for (int c = 0; c < d; ++c) delta += do_row[c] * o_row[c];
        std::fill(ds_row, ds_row + lk, 0.0f);
        for (int c = 0; c < d; ++c) {
          const float g = do_row[c];
          const float* vt_row = &VT[static_cast<std::size_t>(c) * lk];
          for (int j = 0; j < lk; ++j) ds_row[j] += g * vt_row[j];
        }
        for (int j = 0; j < lk; ++j) ds_row[j] = r(r(p_row[j] * (r(ds_row[j]) - delta)) * scale);
      }
      // dQ = dS K, dK = dS^T Q, dV = P^T dO, each output's fp32 sum taken over j (i) in increasing
      // order; the loops run along rows so that the inner one reads and writes contiguously.
      std::vector<float> sum(d);
      for (int i = 0; i < lq; ++i) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int j = 0; j < lk; ++j) {
          const float ds = dS[static_cast<std::size_t>(i) * lk + j];
          const float* k_row = &K[static_cast<std::size_t>(j) * d];
          for (int c = 0; c < d; ++c) sum[c] += ds * k_row[c];
        }
        for (int c = 0; c < d; ++c) out.dQ.at(rq + i, h, c) = r(sum[c]);
      }
      std::vector<float> dk(static_cast<std::size_t>(lk) * d, 0.0f), dv(dk.size(), 0.0f);
      for (int i = 0; i < lq; ++i) {
        const float* q_row = &Q[static_cast<std::size_t>(i) * d];
        const float* do_row = &dO[static_cast<std::size_t>(i) * d];
        for (int j = 0; j < lk; ++j) {
          const float ds = dS[static_cast<std::size_t>(i) * lk + j], p = P[static_cast<std::size_t>(i) * lk + j];
          float* dk_row = &dk[static_cast<std::size_t>(j) * d];
          float* dv_row = &dv[static_cast<std::size_t>(j) * d];
          for (int c = 0; c < d; ++c) {
            dk_row[c] += ds * q_row[c];
            dv_row[c] += p * do_row[c];
          }
        }
      }
      for (int j = 0; j < lk; ++j) {
        for (int c = 0; c < d; ++c) {
          dk_sum.at(rk + j, hk, c) += r(dk[static_cast<std::size_t>(j) * d + c]);
          dv_sum.at(rk + j, hk, c) += r(dv[static_cast<std::size_t>(j) * d + c]);
        }
      }
    }
  });
  for (std::size_t i = 0; i < dk_sum.values.size(); ++i) {
    out.dK.values[i] = r(dk_sum.values[i]);
    out.dV.values[i] = r(dv_sum.values[i]);
  }
  return out;
}

AttentionTensors backward_inputs(const Problem& problem, std::uint64_t seed, double input_scale) {
  AttentionTensors x = random_inputs(problem, seed, true);
  if (input_scale != 1) scale_queries_and_keys(x, input_scale);
  const OracleResult forward = oracle_attention(problem, x, nullptr, OracleOptions{.workers = hardware_workers()});
  for (std::size_t i = 0; i < x.O.values.size(); ++i)
    x.O.values[i] = round_to(problem.dtype, static_cast<float>(forward.O.values[i]));
  for (std::size_t i = 0; i < x.LSE.values.size(); ++i)
    x.LSE.values[i] = static_cast<float>(forward.LSE.values[i]);
  return x;
}

BackwardReference backward_reference(const Problem& problem, std::uint64_t seed,
                                     double input_scale) {
  BackwardReference reference;
  reference.problem = problem;
  reference.seed = seed;
  reference.input_scale = input_scale;
  reference.inputs = backward_inputs(problem, seed, input_scale);
  reference.oracle = oracle_attention(problem, reference.inputs, &reference.inputs.dO, OracleOptions{.workers = hardware_workers()});
  reference.naive = naive_backward_same_precision(problem, reference.inputs);
  reference.naive_errors = {compare(reference.naive.dQ, reference.oracle.dQ).max_error,
                            compare(reference.naive.dK, reference.oracle.dK).max_error,
                            compare(reference.naive.dV, reference.oracle.dV).max_error};
  return reference;
}

BackwardCaseResult run_backward_case(const BackwardImplementation& implementation,
                                     const BackwardReference& reference,
                                     const BackwardCheckOptions& options,
                                     AttentionTensors* gradients) {
  BackwardCaseResult result;
  result.problem = reference.problem;
  result.seed = reference.seed;
  result.naive_errors = reference.naive_errors;
  std::ostringstream header;
  header << describe(reference.problem) << ", seed " << reference.seed;
  if (reference.input_scale != 1) header << ", Q and K scaled by " << reference.input_scale;
  AttentionTensors tensors = reference.inputs;
  poison_outputs(tensors);  // O and LSE are inputs here: restore them
  tensors.O = reference.inputs.O;
  tensors.LSE = reference.inputs.LSE;
  try {
    implementation(reference.problem, tensors);
  } catch (const std::invalid_argument& refusal) {
    result.status = CaseResult::Status::refused;
    result.report = "REFUSED " + header.str() + ": " + refusal.what();
    return result;
  } catch (const ImplementationFailure& failure) {
    result.status = CaseResult::Status::failed;
    result.report = "FAILED " + header.str() + ": " + failure.what();
    return result;
  }
  const HostTensor* got[3] = {&tensors.dQ, &tensors.dK, &tensors.dV};
  const OracleTensor* expected[3] = {&reference.oracle.dQ, &reference.oracle.dK,
                                     &reference.oracle.dV};
  const char* names[3] = {"dQ", "dK", "dV"};
  bool ok = true;
  std::ostringstream lines;
  for (int i = 0; i < 3; ++i) {
    result.errors[i] = compare(*got[i], *expected[i]);
    const bool within = within_rule(result.errors[i], result.naive_errors[i], options.gradients);
    ok = ok && within;
    lines << "\n  " << result.errors[i].describe(names[i]) << "; naive same-precision error "
          << result.naive_errors[i] << ", limit "
          << options.gradients.factor * result.naive_errors[i] + options.gradients.slack;
  }
  result.status = ok ? CaseResult::Status::passed : CaseResult::Status::failed;
  result.report = (ok ? "passed " : "FAILED ") + header.str() + lines.str();
  if (gradients != nullptr) *gradients = std::move(tensors);
  return result;
}

BackwardCaseResult check_backward_case(const BackwardImplementation& implementation,
                                       const Problem& problem,
                                       const BackwardCheckOptions& options) {
  return run_backward_case(implementation,
                           backward_reference(problem, fresh_seed(), options.input_scale), options);
}

}  // namespace flashlab::reference
