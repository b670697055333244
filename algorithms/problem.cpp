#include "problem.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "checked_math.hpp"
#include "limits.hpp"

namespace flashlab {


const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType dtype_from_string(const std::string& name) {
  if (name == "fp32") return DType::fp32;
  if (name == "fp16") return DType::fp16;
  if (name == "bf16") return DType::bf16;
  throw std::invalid_argument("dtype '" + name + "' is unknown; allowed: fp32, fp16, bf16");
}

namespace {

float round_to_bf16(float value) {
  if (std::isnan(value)) return value;
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return std::bit_cast<float>(bits & 0xFFFF0000u);
}

// IEEE half: 10 mantissa bits, exponent range [-14, 15], subnormals below 2^-14, overflow to inf.
float round_to_fp16(float value) {
  if (!std::isfinite(value)) return value;
  const float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return std::copysign(INFINITY, value);
  int exponent = 0;
  std::frexp(magnitude, &exponent);             // magnitude = f * 2^exponent, f in [0.5, 1)
  const int unit_exponent = std::max(exponent - 11, -24);  // the spacing of halves near magnitude
  const float unit = std::ldexp(1.0f, unit_exponent);
  return std::copysign(std::nearbyint(magnitude / unit) * unit, value);
}

[[noreturn]] void bad_input(const std::string& message) { throw std::invalid_argument(message); }

void require_range(const char* name, long long value, long long low, long long high) {
  if (value < low || value > high) {
    std::ostringstream message;
    message << name << " = " << value << " is out of range; allowed: [" << low << ", " << high << "]";
    bad_input(message.str());
  }
}

// Offsets from 0 in steps of at least 1, each sequence no longer than `seqlen` (the kernels size
// their grids by it). Compared in 64 bits: the caller's values may be anything.
void validate_cu_seqlens(const char* name, const std::vector<int>& cu, int batch, int seqlen, const char* seqlen_name) {
  if (cu.size() != static_cast<std::size_t>(batch) + 1) {
    bad_input(std::string(name) + " has " + std::to_string(cu.size()) +
              " entries; allowed: batch + 1 = " + std::to_string(batch + 1));
  }
  if (cu.front() != 0) bad_input(std::string(name) + "[0] = " + std::to_string(cu.front()) + "; allowed: 0");
  for (int b = 0; b < batch; ++b) {
    const std::int64_t length = std::int64_t{cu[b + 1]} - cu[b];  // int64: offsets may be anything
    if (length < 1 || length > seqlen) {
      bad_input(std::string(name) + ": sequence " + std::to_string(b) + " has length " + std::to_string(length) +
                "; allowed: [1, " + seqlen_name + " = " + std::to_string(seqlen) + "]");
    }
  }
}

// The packed tensors have batch x seqlen rows, and rows are int (host and device).
void require_packed_rows(const char* seqlen_name, int batch, int seqlen) {
  const std::string product = std::string("batch x ") + seqlen_name;
  const std::int64_t rows = checked_mul(batch, seqlen, product.c_str());
  if (rows > kMaxPackedRows) {
    bad_input(product + " = " + std::to_string(batch) + " x " + std::to_string(seqlen) + " = " + std::to_string(rows) +
              " rows; allowed: at most " + std::to_string(kMaxPackedRows) + " (the packed tensors' rows are int)");
  }
}

}  // namespace

float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::fp32: return value;
    case DType::bf16: return round_to_bf16(value);
    case DType::fp16: return round_to_fp16(value);
  }
  return value;
}

void Problem::validate() const {
  require_range("batch", batch, 1, kMaxBatch);
  require_range("heads_q", heads_q, 1, kMaxHeads);
  require_range("heads_kv", heads_kv, 1, heads_q);
  if (heads_q % heads_kv != 0) {
    bad_input("heads_q = " + std::to_string(heads_q) + " is not a multiple of heads_kv = " +
              std::to_string(heads_kv) + "; allowed: heads_kv divides heads_q (MHA, GQA, MQA)");
  }
  require_range("seqlen_q", seqlen_q, 1, kMaxSequenceLength);
  require_range("seqlen_k", seqlen_k, 1, kMaxSequenceLength);
  require_range("head_dim", head_dim, 1, kMaxHeadDim);
  require_range("head_dim_v", head_dim_v, 0, kMaxHeadDim);
  // Every consumer computes with the scale in float, and the kernels fold log2(e) < 2 into it.
  constexpr double kMaxSoftmaxScale = std::numeric_limits<float>::max() / 2.0;
  if (!(softmax_scale >= 0 && softmax_scale <= kMaxSoftmaxScale)) {
    std::ostringstream message;
    message << "softmax_scale = " << softmax_scale << "; allowed: (0, " << kMaxSoftmaxScale
            << "] (or 0 for 1/sqrt(head_dim))";
    bad_input(message.str());
  }
  const int window_limit = std::max(seqlen_q, seqlen_k);
  require_range("window_left", mask.window_left, -1, window_limit);
  require_range("window_right", mask.window_right, -1, window_limit);
  if (!alibi_slopes.empty() && static_cast<int>(alibi_slopes.size()) != heads_q) {
    bad_input("alibi_slopes has " + std::to_string(alibi_slopes.size()) +
              " entries; allowed: 0 or heads_q = " + std::to_string(heads_q));
  }
  for (float slope : alibi_slopes) {
    if (!std::isfinite(slope) || slope < 0) bad_input("alibi slope " + std::to_string(slope) + "; allowed: finite, >= 0");
  }
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    bad_input("softcap = " + std::to_string(softcap) + "; allowed: finite, >= 0 (0 = off)");
  }
  if (!(dropout.probability >= 0.0f && dropout.probability < 1.0f)) {
    bad_input("dropout probability = " + std::to_string(dropout.probability) + "; allowed: [0, 1)");
  }
  if (varlen() != !cu_seqlens_k.empty()) {
    bad_input("cu_seqlens_q has " + std::to_string(cu_seqlens_q.size()) + " entries and cu_seqlens_k " +
              std::to_string(cu_seqlens_k.size()) + "; allowed: both (batch + 1 entries each) or neither");
  }
  if (varlen()) {
    validate_cu_seqlens("cu_seqlens_q", cu_seqlens_q, batch, seqlen_q, "seqlen_q");
    validate_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch, seqlen_k, "seqlen_k");
  } else {
    require_packed_rows("seqlen_q", batch, seqlen_q);
    require_packed_rows("seqlen_k", batch, seqlen_k);
  }
  const BlockSparsity& sparsity = block_sparsity;
  if (sparsity.enabled() || sparsity.block_cols != 0 || !sparsity.keep.empty()) {
    require_range("block_sparsity.block_rows", sparsity.block_rows, 1, kMaxSequenceLength);
    require_range("block_sparsity.block_cols", sparsity.block_cols, 1, kMaxSequenceLength);
    const int needed_rows = (seqlen_q + sparsity.block_rows - 1) / sparsity.block_rows;
    const int needed_cols = (seqlen_k + sparsity.block_cols - 1) / sparsity.block_cols;
    require_range("block_sparsity.row_blocks", sparsity.row_blocks, needed_rows, kMaxSequenceLength);
    require_range("block_sparsity.col_blocks", sparsity.col_blocks, needed_cols, kMaxSequenceLength);
    if (sparsity.keep.size() != static_cast<std::size_t>(sparsity.row_blocks) * sparsity.col_blocks) {
      bad_input("block_sparsity.keep has " + std::to_string(sparsity.keep.size()) +
                " entries; allowed: row_blocks * col_blocks = " +
                std::to_string(static_cast<long long>(sparsity.row_blocks) * sparsity.col_blocks));
    }
  }
}

double Problem::scale() const { return softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(head_dim)); }

int Problem::seqlen_q_of(int b) const { return varlen() ? cu_seqlens_q[b + 1] - cu_seqlens_q[b] : seqlen_q; }
int Problem::seqlen_k_of(int b) const { return varlen() ? cu_seqlens_k[b + 1] - cu_seqlens_k[b] : seqlen_k; }
// Checked: a problem that was never validated must not wrap into a small, wrong row count.
int Problem::first_row_q(int b) const {
  return varlen() ? cu_seqlens_q[b] : checked_int(checked_mul(b, seqlen_q, "first row of Q"), "first row of Q");
}
int Problem::first_row_k(int b) const {
  return varlen() ? cu_seqlens_k[b] : checked_int(checked_mul(b, seqlen_k, "first row of K"), "first row of K");
}
int Problem::total_rows_q() const {
  return varlen() ? cu_seqlens_q.back() : checked_int(checked_mul(batch, seqlen_q, "batch x seqlen_q"), "batch x seqlen_q");
}
int Problem::total_rows_k() const {
  return varlen() ? cu_seqlens_k.back() : checked_int(checked_mul(batch, seqlen_k, "batch x seqlen_k"), "batch x seqlen_k");
}

void set_varlen(Problem& problem, const std::vector<int>& seqlens_q, const std::vector<int>& seqlens_k) {
  if (seqlens_q.size() != seqlens_k.size() || seqlens_q.empty()) {
    bad_input("varlen: seqlens_q has " + std::to_string(seqlens_q.size()) + " entries and seqlens_k " +
              std::to_string(seqlens_k.size()) + "; allowed: the same number, >= 1");
  }
  problem.batch = checked_int(static_cast<std::int64_t>(seqlens_q.size()), "varlen: number of sequences");
  problem.cu_seqlens_q = {0};
  problem.cu_seqlens_k = {0};
  // The offsets are int: a total past kMaxPackedRows is refused, never wrapped.
  const auto next_offset = [](int offset, int length, const char* total) {
    if (length < 1) bad_input("varlen: a sequence of length " + std::to_string(length) + "; allowed: >= 1");
    const std::int64_t sum = std::int64_t{offset} + length;
    if (sum > kMaxPackedRows) {
      bad_input(std::string("varlen: ") + total + " = " + std::to_string(sum) + " rows after adding a sequence of " +
                std::to_string(length) + "; allowed: at most " + std::to_string(kMaxPackedRows) +
                " (the packed tensors' rows are int)");
    }
    return static_cast<int>(sum);
  };
  for (std::size_t b = 0; b < seqlens_q.size(); ++b) {
    problem.cu_seqlens_q.push_back(next_offset(problem.cu_seqlens_q.back(), seqlens_q[b], "total of seqlens_q"));
    problem.cu_seqlens_k.push_back(next_offset(problem.cu_seqlens_k.back(), seqlens_k[b], "total of seqlens_k"));
  }
  problem.seqlen_q = *std::max_element(seqlens_q.begin(), seqlens_q.end());
  problem.seqlen_k = *std::max_element(seqlens_k.begin(), seqlens_k.end());
}

// ---------------------------------------------------------------------------------------------

bool HeadProblem::key_visible(int row, int col) const {
  if (!key_visible_ignoring_sparsity(row, col)) return false;
  return block_sparsity == nullptr ||
         block_sparsity->kept(row / block_sparsity->block_rows, col / block_sparsity->block_cols);
}

float HeadProblem::modify_score(float scaled_score, int row, int col) const {
  float score = scaled_score;
  if (softcap > 0) score = softcap * std::tanh(score / softcap);
  if (alibi_slope != 0) score -= alibi_slope * static_cast<float>(std::abs(row + diagonal_offset() - col));
  return score;
}

float HeadProblem::modify_score_derivative(float scaled_score) const {
  if (softcap <= 0) return 1.0f;
  const float t = std::tanh(scaled_score / softcap);
  return 1.0f - t * t;
}

bool HeadProblem::dropout_keeps(int row, int col) const {
  if (dropout.probability <= 0) return true;
  return dropout_uniform(dropout.seed, dropout.offset, batch_index, head_index, row, col) >= dropout.probability;
}

HeadProblem head_problem(const Problem& problem, int batch_index, int head_index) {
  HeadProblem head;
  head.batch_index = batch_index;
  head.head_index = head_index;
  head.seqlen_q = problem.seqlen_q_of(batch_index);
  head.seqlen_k = problem.seqlen_k_of(batch_index);
  head.head_dim = problem.head_dim;
  head.head_dim_v = problem.value_dim();
  head.scale = static_cast<float>(problem.scale());
  head.mask = problem.mask;
  head.alibi_slope = problem.alibi_slopes.empty() ? 0.0f : problem.alibi_slopes[head_index];
  head.softcap = problem.softcap;
  head.block_sparsity = problem.block_sparsity.enabled() ? &problem.block_sparsity : nullptr;
  head.dropout = problem.dropout;
  head.dtype = problem.dtype;
  return head;
}

}  // namespace flashlab
