#include "00_oracle.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "for_each_unit.hpp"

namespace flashlab {

namespace {

using MatrixD = Eigen::MatrixXd;

MatrixD head_matrix(const HostTensor& t, int head, int first_row, int length) {
  MatrixD m(length, t.dim);
  for (int r = 0; r < length; ++r)
    for (int c = 0; c < t.dim; ++c) m(r, c) = t.at(first_row + r, head, c);
  return m;
}

void add_head_matrix(OracleTensor& t, int head, int first_row, const MatrixD& m) {
  for (int r = 0; r < m.rows(); ++r)
    for (int c = 0; c < m.cols(); ++c) t.at(first_row + r, head, c) += m(r, c);
}

}  // namespace

OracleResult oracle_attention(const Problem& problem, const AttentionTensors& inputs, const HostTensor* dO,
                              OracleOptions options) {
  problem.validate();
  if (options.workers < 1) {
    throw std::invalid_argument("oracle_attention: workers = " + std::to_string(options.workers) + "; allowed: at least 1");
  }
  const int dv = problem.value_dim();
  OracleResult result;
  result.O = OracleTensor(problem.total_rows_q(), problem.heads_q, dv);
  result.LSE = OracleTensor(problem.total_rows_q(), problem.heads_q, 1);
  if (dO) {
    result.dQ = OracleTensor(problem.total_rows_q(), problem.heads_q, problem.head_dim);
    result.dK = OracleTensor(problem.total_rows_k(), problem.heads_kv, problem.head_dim);
    result.dV = OracleTensor(problem.total_rows_k(), problem.heads_kv, dv);
  }
  constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
  if (options.keep_probabilities) result.P.resize(static_cast<std::size_t>(problem.batch) * problem.heads_q);

  // Per (sequence, KV head): its query heads in order, so that dK and dV add up as a serial loop
  // over the heads would; the units write disjoint rows.
  for_each_unit(problem.batch * problem.heads_kv, options.workers, [&](int unit) {
    const int b = unit / problem.heads_kv, kv = unit % problem.heads_kv;
    const int sq = problem.seqlen_q_of(b), sk = problem.seqlen_k_of(b);
    const int row_q = problem.first_row_q(b), row_k = problem.first_row_k(b);
    const MatrixD k = head_matrix(inputs.K, kv, row_k, sk);  // shared by the group's query heads
    const MatrixD v = head_matrix(inputs.V, kv, row_k, sk);
    for (int h = kv * problem.group_size(); h < (kv + 1) * problem.group_size(); ++h) {
      const HeadProblem head = head_problem(problem, b, h);
      const MatrixD q = head_matrix(inputs.Q, h, row_q, sq);
      const double scale = problem.scale();

      // S = scale Q K^T, then softcap, ALiBi and the mask; P = softmax(S) row by row.
      const MatrixD scaled = scale * q * k.transpose();
      MatrixD s(sq, sk), p = MatrixD::Zero(sq, sk), derivative = MatrixD::Ones(sq, sk);
      for (int i = 0; i < sq; ++i) {
        for (int j = 0; j < sk; ++j) {
          double score = scaled(i, j);
          if (head.softcap > 0) {
            const double t = std::tanh(score / head.softcap);
            score = head.softcap * t;
            derivative(i, j) = 1.0 - t * t;
          }
          if (head.alibi_slope != 0) score -= head.alibi_slope * std::abs(i + head.diagonal_offset() - j);
          s(i, j) = head.key_visible(i, j) ? score : kNegInfD;
        }
        const double row_max = s.row(i).maxCoeff();
        if (row_max == kNegInfD) {
          result.LSE.at(row_q + i, h, 0) = kNegInfD;  // fully masked row: P = 0, O = 0
          continue;
        }
        double sum = 0;
        for (int j = 0; j < sk; ++j) sum += (p(i, j) = std::exp(s(i, j) - row_max));
        p.row(i) /= sum;
        result.LSE.at(row_q + i, h, 0) = row_max + std::log(sum);
      }
      // Dropout: Z_ij / (1 - p) multiplies P before it meets V.
      MatrixD keep = MatrixD::Ones(sq, sk);
      if (head.dropout.probability > 0) {
        for (int i = 0; i < sq; ++i)
          for (int j = 0; j < sk; ++j) keep(i, j) = head.dropout_keeps(i, j) ? 1.0 / (1.0 - head.dropout.probability) : 0.0;
      }
      const MatrixD p_dropped = p.cwiseProduct(keep);
      const MatrixD o = p_dropped * v;
      add_head_matrix(result.O, h, row_q, o);
      if (options.keep_probabilities) {
        std::vector<double> flat(static_cast<std::size_t>(sq) * sk);
        for (int i = 0; i < sq; ++i)
          for (int j = 0; j < sk; ++j) flat[static_cast<std::size_t>(i) * sk + j] = p_dropped(i, j);
        result.P[static_cast<std::size_t>(b) * problem.heads_q + h] = std::move(flat);
      }
      if (!dO) continue;

      // Gradients (FA1 Appendix B.2): dV = P_drop^T dO, dP = (dO V^T) * Z, D = rowsum(dO * O),
      // dS = P * (dP - D), chained through the softcap; dQ = scale dS K, dK = scale dS^T Q.
      const MatrixD d_out = head_matrix(*dO, h, row_q, sq);
      const MatrixD dv_head = p_dropped.transpose() * d_out;
      const MatrixD dp = (d_out * v.transpose()).cwiseProduct(keep);
      const Eigen::VectorXd D = d_out.cwiseProduct(o).rowwise().sum();
      MatrixD ds = p.cwiseProduct(dp.colwise() - D).cwiseProduct(derivative);
      add_head_matrix(result.dQ, h, row_q, scale * ds * k);
      add_head_matrix(result.dK, kv, row_k, scale * ds.transpose() * q);
      add_head_matrix(result.dV, kv, row_k, dv_head);
    }
  });
  return result;
}

std::int64_t oracle_bytes(const Problem& problem, bool with_gradients, OracleOptions options) {
  problem.validate();
  using Count = CheckedInt64;
  try {
    // Score-sized matrices alive at once for one head: scaled, s, p, derivative, keep, p_dropped;
    // the gradients add dp, ds and two temporaries of their products.
    const Count score_matrices = with_gradients ? 10 : 6;
    Count longest = 0, kept = 0;  // the largest sequence's scores; every head's (when P is kept)
    const int distinct = problem.varlen() ? problem.batch : 1;  // a dense batch: sequences alike
    for (int b = 0; b < distinct; ++b) {
      const Count scores = Count(problem.seqlen_q_of(b)) * problem.seqlen_k_of(b);
      longest = std::max(longest, scores);
      kept += scores * problem.heads_q;
    }
    if (!problem.varlen()) kept = kept * problem.batch;
    const Count rows_q = problem.total_rows_q(), rows_k = problem.total_rows_k();
    const Count d = problem.head_dim, dv = problem.value_dim();
    const int workers = unit_workers(problem.batch * problem.heads_kv, options.workers);
    Count elements = rows_q * problem.heads_q * (dv + 1) + score_matrices * longest * workers;  // O, LSE
    if (with_gradients) elements += rows_q * problem.heads_q * d + rows_k * problem.heads_kv * (d + dv);
    if (options.keep_probabilities) elements += kept;
    return (elements * static_cast<std::int64_t>(sizeof(double))).value();
  } catch (const SizeOverflow&) {  // more than int64 bytes: the bound saturates
    return std::numeric_limits<std::int64_t>::max();
  }
}

double max_abs_error(std::span<const float> got, std::span<const double> expected) {
  if (got.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], e = expected[i];
    if (std::isnan(g)) return std::numeric_limits<double>::infinity();
    if (std::isinf(g) || std::isinf(e)) {
      if (g != e) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::fabs(g - e));
  }
  return worst;
}

}  // namespace flashlab
