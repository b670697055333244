// Tensors in slow memory (HBM) as the schedules see them, and the host buffers behind them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "checked_math.hpp"
#include "problem.hpp"

namespace flashlab {

// Every tensor a schedule can move or compute, so traffic and FLOPs are counted per tensor.
enum class TensorId : std::uint8_t {
  Q, K, V, O, LSE,            // forward inputs and outputs
  dO, dQ, dK, dV, D,          // backward: D = rowsum(dO * O)
  S, P, dS, dP,               // score and probability tiles (in HBM only for standard attention)
  m, l,                       // softmax statistics: running max and sum
  O_partial, LSE_partial,     // split-KV decoding: one partial output per KV chunk
  A,                          // Saha-Ye: A = exp(S) written to HBM
  X, Y,                       // the softmax lab: input and output vectors
  page_table,                 // a paged KV cache's block table: one int32 page id per page
  count
};
constexpr int kTensorCount = static_cast<int>(TensorId::count);
const char* to_string(TensorId id);
// m, l, LSE, D and their partials: kept in fp32
inline bool is_statistic(TensorId id) {
  return id == TensorId::m || id == TensorId::l || id == TensorId::LSE || id == TensorId::D || id == TensorId::LSE_partial;
}

// A half-open range [begin, begin + size) of rows or columns.
struct Range {
  int begin = 0;
  int size = 0;
  int end() const { return begin + size; }
  bool operator==(const Range&) const = default;
};

// A 2-D strided window onto a tensor in HBM (one head of one sequence). Vectors are one column.
// data is null in shape-only runs.
struct HbmMatrix {
  TensorId id = TensorId::Q;
  DType dtype = DType::fp32;
  float* data = nullptr;
  int rows = 0;
  int cols = 0;
  std::ptrdiff_t row_stride = 0;

  float& at(int row, int col) const { return data[row * row_stride + col]; }
};

// The number of elements of a [rows, heads, dim] tensor: checked, never wrapped or negative.
inline std::size_t tensor_elements(const char* name, std::int64_t rows, std::int64_t heads, std::int64_t dim) {
  const std::string what = std::string("elements of ") + name + " (rows x heads x dim)";
  if (rows < 0 || heads < 0 || dim < 0) {
    throw SizeOverflow(what + ": " + std::to_string(rows) + " x " + std::to_string(heads) + " x " + std::to_string(dim) +
                       "; allowed: sizes >= 0");
  }
  return checked_size(checked_product(what.c_str(), rows, heads, dim), what.c_str());
}

// A host buffer laid out [rows, heads, dim] (the flash-attention layout), holding values already
// rounded to its dtype.
struct HostTensor {
  TensorId id = TensorId::Q;
  DType dtype = DType::fp32;
  int rows = 0, heads = 0, dim = 0;
  std::vector<float> values;

  HostTensor() = default;
  HostTensor(TensorId id, DType dtype, int rows, int heads, int dim, float fill = 0.0f)
      : id(id), dtype(dtype), rows(rows), heads(heads), dim(dim),
        values(tensor_elements(to_string(id), rows, heads, dim), fill) {}

  float& at(int row, int head, int col) { return values[(static_cast<std::size_t>(row) * heads + head) * dim + col]; }
  float at(int row, int head, int col) const { return values[(static_cast<std::size_t>(row) * heads + head) * dim + col]; }
  // The rows [first_row, first_row + length) of one head, as a matrix.
  HbmMatrix head_view(int head, int first_row, int length) {
    return {id, dtype, values.data() + (static_cast<std::size_t>(first_row) * heads + head) * dim, length, dim,
            static_cast<std::ptrdiff_t>(heads) * dim};
  }
};

// Intermediate HBM tensors a schedule needs beyond its inputs and outputs (S and P of standard
// attention, partial outputs of split-KV decoding, A of square tiling). In shape-only runs the
// matrices carry shapes and no data.
class HbmScratch {
 public:
  explicit HbmScratch(bool with_data) : with_data_(with_data) {}
  HbmMatrix matrix(TensorId id, DType dtype, int rows, int cols) {
    float* data = nullptr;
    if (with_data_) {
      buffers_.emplace_back(tensor_elements(to_string(id), rows, 1, cols), 0.0f);
      data = buffers_.back().data();
    }
    return {id, dtype, data, rows, cols, cols};
  }

 private:
  bool with_data_;
  std::deque<std::vector<float>> buffers_;
};

// The tensors of a problem, sized and laid out by the problem. Forward and backward buffers
// exist only when asked for.
struct AttentionTensors {
  HostTensor Q, K, V, O, LSE;  // LSE: [rows_q, heads_q, 1], fp32
  HostTensor dO, dQ, dK, dV;   // empty unless allocated for the backward pass

  static AttentionTensors allocate(const Problem& problem, bool with_backward);
};

// The HBM views of one (sequence, query head): what a schedule is handed.
struct HeadTensors {
  HbmMatrix Q, K, V, O, LSE;
  HbmMatrix dO, dQ, dK, dV;
  // Backward passes with GQA/MQA (run_backward.hpp, GroupReduction::in_place): dK and dV are
  // fp32 accumulators shared by the query heads of a KV group, zeroed once, that each head adds
  // its share into with atomics instead of storing it.
  bool add_key_gradients = false;
};

}  // namespace flashlab
