// Split-KV decoding (Flash-Decoding; Dao, Haziza, Massa and Sizov 2023).
//
// When there are few query rows (decoding: seqlen_q = 1 to a few) FA2's parallelism over query
// blocks has nothing to split, so the key/value sequence is split instead:
//   phase 1 (one "thread block" per query block and KV chunk): FA2's inner loop over the chunk's
//           key blocks, giving a partial output O_c normalised over chunk c only and its
//           log-sum-exp LSE_c, both written to HBM in fp32;
//   phase 2 (the combine, one query row at a time): LSE = log sum_c exp(LSE_c) and
//           O = sum_c exp(LSE_c - LSE) O_c.
// Phase 2 is the online softmax again: for query row r, the chunk LSEs are the scores and the
// partial outputs are the values, O_r = softmax(LSE_partial[r, :]) O_partial[r, :, :], so it is
// written with the same start/update/finish as every tiled forward (online_softmax.hpp).
//
// The chunks: split_length keys each when given, else ceil(seqlen_k / num_splits) keys, which
// makes at most num_splits chunks and never an empty one. A chunk that the mask hides from a row
// gives that row O_c = 0 and LSE_c = -inf, which the combine weighs by exp(-inf) = 0; a row that
// sees nothing at all ends with O = 0 and LSE = -inf. Dropout is applied in phase 1.
//
// Pseudocode (the line numbers the trace marks):
//   1  for each chunk c and each query block Q_i (independent: parallel on a GPU)
//   2    load Q_i; on chip O = 0, l = 0, m = -inf
//   3    for each key block j of chunk c that the mask does not hide entirely
//   4      load K_j, V_j
//   5      S = tau Q_i K_j^T, modified and masked
//   6      online softmax update of (m, l, O) with S and V_j
//   7    O_c = diag(l)^-1 O, LSE_c = m + log(l); write both to HBM
//   8  for each query row r (the combine)
//   9    load LSE_partial[r, :] and O_partial[r, :, :]
//  10    one online softmax update: m = max_c LSE_c, l = sum_c e^{LSE_c - m},
//          O = sum_c e^{LSE_c - m} O_c
//  11    write O_r = diag(l)^-1 O and LSE_r = m + log(l)
//
// HBM scratch: O_partial is [seqlen_q, chunks, head_dim_v] and LSE_partial [seqlen_q, chunks],
// both fp32, so the combine reads one contiguous run per row.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>

#include "online_softmax.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

struct SplitKvTiling {
  int block_rows = 64;   // query rows per block (decode: the whole query)
  int block_cols = 64;   // keys per block inside a chunk
  int num_splits = 4;    // chunks of the KV sequence, used when split_length is 0
  int split_length = 0;  // keys per chunk; 0: ceil(seqlen_k / num_splits)

  void validate() const {
    require_block_size("block_rows", block_rows);
    require_block_size("block_cols", block_cols);
    if (split_length < 0) {
      throw std::invalid_argument("split_length = " + std::to_string(split_length) +
                                  "; allowed: >= 1, or 0 to use num_splits");
    }
    if (split_length == 0 && num_splits < 1) {
      throw std::invalid_argument("num_splits = " + std::to_string(num_splits) +
                                  "; allowed: >= 1 (or give split_length >= 1)");
    }
  }
  int chunk_length(int seqlen_k) const {
    return split_length > 0 ? split_length : (seqlen_k + num_splits - 1) / num_splits;
  }
  int chunk_count(int seqlen_k) const {
    const int length = chunk_length(seqlen_k);
    return (seqlen_k + length - 1) / length;
  }
};

namespace split_kv_detail {
// Rows first_row, first_row + step, ... of a matrix: the partial outputs of one chunk.
inline HbmMatrix every_nth_row(const HbmMatrix& m, int first_row, int step) {
  HbmMatrix view = m;
  if (m.data) view.data = m.data + first_row * m.row_stride;
  view.rows = (m.rows - first_row + step - 1) / step;
  view.row_stride = m.row_stride * step;
  return view;
}
}  // namespace split_kv_detail

template <class Memory>
void split_kv_forward(Memory& mem, const HeadProblem& head, const SplitKvTiling& tiling,
                      const HeadTensors& x) {
  tiling.validate();
  const int Br = tiling.block_rows, Bc = tiling.block_cols, dv = head.head_dim_v;
  const int chunk_length = tiling.chunk_length(head.seqlen_k);
  const int chunks = tiling.chunk_count(head.seqlen_k);
  HbmScratch scratch(Memory::with_data);
  const int partial_rows =
      checked_int(checked_mul(head.seqlen_q, chunks, "split_kv: seqlen_q x chunks"), "split_kv: rows of O_partial");
  const HbmMatrix O_partial = scratch.matrix(TensorId::O_partial, DType::fp32, partial_rows, dv);
  const HbmMatrix LSE_partial =
      scratch.matrix(TensorId::LSE_partial, DType::fp32, head.seqlen_q, chunks);

  // Phase 1: every (chunk, query block) independently, FA2 Algorithm 1 restricted to the chunk.
  for (int chunk = 0; chunk < chunks; ++chunk) {  // line 1
    const int chunk_begin = chunk * chunk_length;
    const int chunk_end = std::min(head.seqlen_k, chunk_begin + chunk_length);
    const HbmMatrix O_chunk = split_kv_detail::every_nth_row(O_partial, chunk, chunks);
    for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
      const Range rows{row_begin, std::min(Br, head.seqlen_q - row_begin)};
      mem.mark_line(2);
      Tile q = mem.load(x.Q, rows);  // line 2
      SoftmaxState state = start_softmax_state(mem, rows, dv);
      const auto [first_key, last_key] = head.visible_key_range(rows.begin, rows.end());
      const int first = std::max(first_key, chunk_begin), last = std::min(last_key, chunk_end);
      const int first_block = first - (first - chunk_begin) % Bc;  // blocks start at chunk_begin
      for (int col_begin = first_block; col_begin < last; col_begin += Bc) {  // line 3
        const Range cols{col_begin, std::min(Bc, chunk_end - col_begin)};
        const auto coverage = head.coverage(rows.begin, rows.end(), cols.begin, cols.end());
        if (coverage == HeadProblem::BlockCoverage::empty) continue;  // skipped, not masked
        mem.mark_line(4);
        Tile k = mem.load(x.K, cols);  // line 4
        Tile v = mem.load(x.V, cols);
        mem.mark_line(5);
        Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);  // line 5
        if (coverage == HeadProblem::BlockCoverage::partial || head.modifies_scores())
          mem.apply_score_mods(s, head);
        mem.mark_line(6);
        online_softmax_update(mem, state, s, v, head);  // line 6 (FA2 Algorithm 1, lines 9-10)
      }
      mem.mark_line(7);
      Tile lse = finish_softmax_state(mem, state);  // line 7: O_c and LSE_c of this chunk
      mem.store(O_chunk, rows, state.o);
      mem.store(LSE_partial, rows, {chunk, 1}, lse);
    }
  }

  // Phase 2: the combine. Row r's chunk LSEs act as scores, its partial outputs as values.
  HeadProblem combine = head;
  combine.dropout.probability = 0.0f;              // dropout was applied in phase 1
  for (int row = 0; row < head.seqlen_q; ++row) {  // line 8
    const Range rows{row, 1};
    mem.mark_line(9);
    Tile chunk_lse = mem.load(LSE_partial, rows, {0, chunks});         // line 9: 1 x chunks
    Tile chunk_outputs = mem.load(O_partial, {row * chunks, chunks});  //         chunks x dv
    mem.mark_line(10);
    SoftmaxState state = start_softmax_state(mem, rows, dv);
    online_softmax_update(mem, state, chunk_lse, chunk_outputs, combine);  // line 10
    mem.mark_line(11);
    Tile lse = finish_softmax_state(mem, state);  // line 11: O = sum_c e^{LSE_c - LSE} O_c
    mem.store(x.O, rows, state.o);
    mem.store(x.LSE, rows, lse);
  }
}

}  // namespace flashlab
