// Softmax three ways: the step from a softmax that reads its input three times to the online
// update FlashAttention is built on.
//
// The input X is a matrix in HBM whose rows are softmaxed independently (one row: a vector);
// every schedule walks the columns in blocks of block_cols elements, all rows at once.
//   1. softmax_three_pass      - safe softmax (Milakov and Gimelshein 2018, Algorithm 2):
//                                one pass for the max, one for the sum, one to normalise.
//                                Reads X three times.
//   2. softmax_online_normalizer - Milakov and Gimelshein 2018, Algorithm 3: the running max and
//                                the rescaled running sum in one pass, normalise in a second.
//                                Reads X twice.
//   3. softmax_times_values_single_pass - FlashAttention's online update: Y = softmax(X) V in one
//                                pass, the unnormalised output rescaled whenever the max grows
//                                (online_softmax.hpp), normalised once at the end. Reads X once.
// Y has X's shape for 1 and 2 and V's column count for 3. A row that is -inf everywhere (fully
// masked) gives a zero row, never NaN.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>

#include "online_softmax.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

struct SoftmaxTiling {
  int block_cols = 64;  // elements of each row per block

  void validate() const {
    require_block_size("block_cols", block_cols);
  }
};

namespace softmax_detail {
inline Range column_block(const HbmMatrix& x, int begin, int block_cols) {
  return {begin, std::min(block_cols, x.cols - begin)};
}
inline void require_same_shape(const HbmMatrix& x, const HbmMatrix& y, int y_cols) {
  if (y.rows != x.rows || y.cols != y_cols) {
    throw std::invalid_argument(std::string("softmax: ") + to_string(y.id) + " is " +
                                std::to_string(y.rows) + " x " + std::to_string(y.cols) +
                                "; allowed: " + std::to_string(x.rows) + " x " +
                                std::to_string(y_cols));
  }
}
}  // namespace softmax_detail

// 1. The safe softmax in three passes (Milakov and Gimelshein 2018, Algorithm 2).
template <class Memory>
void softmax_three_pass(Memory& mem, const HbmMatrix& X, const HbmMatrix& Y,
                        const SoftmaxTiling& tiling) {
  tiling.validate();
  softmax_detail::require_same_shape(X, Y, X.cols);
  const Range rows{0, X.rows};
  mem.mark_line(1);
  Tile m = mem.vector(TensorId::m, rows, kNegInf);                   // line 1: m_0 = -inf
  for (int begin = 0; begin < X.cols; begin += tiling.block_cols) {  // line 2: first pass
    const Range cols = softmax_detail::column_block(X, begin, tiling.block_cols);
    mem.mark_line(3);
    Tile x = mem.load(X, rows, cols);
    Tile block_max = mem.row_max(TensorId::m, x);
    mem.maximum(m, block_max);  // line 3: m_k = max(m_{k-1}, x_k)
  }
  mem.mark_line(5);
  Tile d = mem.vector(TensorId::l, rows, 0.0f);                      // line 5: d_0 = 0
  for (int begin = 0; begin < X.cols; begin += tiling.block_cols) {  // line 6: second pass
    const Range cols = softmax_detail::column_block(X, begin, tiling.block_cols);
    mem.mark_line(7);
    Tile x = mem.load(X, rows, cols);
    Tile e = mem.exp_minus_row(TensorId::P, x, m);
    Tile block_sum = mem.row_sum(TensorId::l, e);
    mem.add(d, block_sum);  // line 7: d_j = d_{j-1} + e^{x_j - m_V}
  }
  for (int begin = 0; begin < X.cols; begin += tiling.block_cols) {  // line 9: third pass
    const Range cols = softmax_detail::column_block(X, begin, tiling.block_cols);
    mem.mark_line(10);
    Tile x = mem.load(X, rows, cols);
    Tile y = mem.exp_minus_row(TensorId::Y, x, m);
    mem.divide_rows(y, d);  // line 10: y_i = e^{x_i - m_V} / d_V
    mem.store(Y, rows, cols, y);
  }
}

// 2. The online normalizer (Milakov and Gimelshein 2018, Algorithm 3): the max and the sum in one
// pass, rescaling the sum by e^{m_{j-1} - m_j} whenever the max grows.
template <class Memory>
void softmax_online_normalizer(Memory& mem, const HbmMatrix& X, const HbmMatrix& Y,
                               const SoftmaxTiling& tiling) {
  tiling.validate();
  softmax_detail::require_same_shape(X, Y, X.cols);
  const Range rows{0, X.rows};
  mem.mark_line(1);
  Tile m = mem.vector(TensorId::m, rows, kNegInf);  // line 1: m_0 = -inf
  mem.mark_line(2);
  Tile d = mem.vector(TensorId::l, rows, 0.0f);                      // line 2: d_0 = 0
  for (int begin = 0; begin < X.cols; begin += tiling.block_cols) {  // line 3: the one pass
    const Range cols = softmax_detail::column_block(X, begin, tiling.block_cols);
    mem.mark_line(4);
    Tile x = mem.load(X, rows, cols);
    Tile m_new = mem.row_max(TensorId::m, x);
    mem.maximum(m_new, m);  // line 4: m_j = max(m_{j-1}, x_j)
    mem.mark_line(5);
    Tile rescale = mem.exp_difference(TensorId::m, m, m_new);
    mem.scale_rows(d, rescale);  // line 5: d_j = d_{j-1} e^{m_{j-1} - m_j} + e^{x_j - m_j}
    Tile e = mem.exp_minus_row(TensorId::P, x, m_new);
    Tile block_sum = mem.row_sum(TensorId::l, e);
    mem.add(d, block_sum);
    m = std::move(m_new);
    mem.note_softmax_state(m, d, rescale);
  }
  for (int begin = 0; begin < X.cols; begin += tiling.block_cols) {  // line 7: normalise
    const Range cols = softmax_detail::column_block(X, begin, tiling.block_cols);
    mem.mark_line(8);
    Tile x = mem.load(X, rows, cols);
    Tile y = mem.exp_minus_row(TensorId::Y, x, m);
    mem.divide_rows(y, d);  // line 8: y_i = e^{x_i - m_V} / d_V
    mem.store(Y, rows, cols, y);
  }
}

// 3. FlashAttention's single pass: Y = softmax(X) V without ever normalising a probability
// before the end. Block j of X (rows x block_cols) meets rows j of V (block_cols x V.cols).
// The lines are those of FA2 Algorithm 1 (online_softmax.hpp): 5 start, 9-10 update, 12 finish.
// LSE, when given (X.rows x 1), receives each row's log-sum-exp.
template <class Memory>
void softmax_times_values_single_pass(Memory& mem, const HbmMatrix& X, const HbmMatrix& V,
                                      const HbmMatrix& Y, const SoftmaxTiling& tiling,
                                      const HbmMatrix* LSE = nullptr) {
  tiling.validate();
  if (V.rows != X.cols) {
    throw std::invalid_argument("softmax_times_values: V has " + std::to_string(V.rows) +
                                " rows; allowed: X's column count " + std::to_string(X.cols));
  }
  softmax_detail::require_same_shape(X, Y, V.cols);
  const Range rows{0, X.rows};
  HeadProblem no_dropout;  // the lab has no dropout; the update reads only head.dropout
  mem.mark_line(5);
  SoftmaxState state = start_softmax_state(mem, rows, V.cols);  // m = -inf, l = 0, o = 0
  for (int begin = 0; begin < X.cols; begin += tiling.block_cols) {
    const Range cols = softmax_detail::column_block(X, begin, tiling.block_cols);
    mem.mark_line(7);
    Tile x = mem.load(X, rows, cols);
    Tile v = mem.load(V, cols);
    mem.mark_line(9);
    online_softmax_update(mem, state, x, v, no_dropout);  // m, l, o rescaled; o += P V
  }
  mem.mark_line(12);
  Tile lse = finish_softmax_state(mem, state);  // o = diag(l)^-1 o
  mem.store(Y, rows, state.o);
  if (LSE != nullptr) mem.store(*LSE, rows, lse);
}

}  // namespace flashlab
