// Memory-efficient attention (Rabe and Staats 2021, "Self-attention Does Not Need O(n^2)
// Memory", arXiv 2112.05682, Section 3 and Figure 1).
//
// Queries are split into chunks of block_rows, keys and values into chunks of block_cols. For each
// query chunk, every key chunk is summarised independently (their summarize_chunk):
//   s = scale Q_i K_j^T,  m_j = rowmax(s),  P = exp(s - m_j),
//   values_j = P V_j,  weights_j = rowsum(P),
// and the summaries of all key chunks are kept (their lax.map stacks them: in HBM here) and
// combined afterwards (their attention / chunk_scanner):
//   m = max_j m_j,  O_i = sum_j e^{m_j - m} values_j / sum_j e^{m_j - m} weights_j.
// The difference from FlashAttention is the order: the per-chunk summaries are written out and
// read back instead of being folded into one running state on chip, so the HBM traffic has an
// extra 2 N dv N / block_cols term; that term is why the chunks must be large.
//
// Pseudocode (the line numbers the trace marks):
//   1  for each query chunk Q_i
//   2    load Q_i
//   3    for each key chunk j
//   4      load K_j, V_j; s = scale Q_i K_j^T, modified and masked
//   5      m_j = rowmax(s), P = exp(s - m_j), l_j = rowsum(P), values_j = P V_j
//   6      write values_j, l_j, m_j to HBM
//   7    m = -inf; for each key chunk: load m_j, m = max(m, m_j)
//   8    O = 0, l = 0; for each key chunk: load m_j, l_j, values_j;
//          O += e^{m_j - m} values_j, l += e^{m_j - m} l_j
//   9    write O_i = O / l and LSE_i = m + log(l)
//
// Every chunk is computed (the paper does not skip masked chunks; the mask makes their P zero).
// A chunk a row cannot see gives m_j = -inf, weight 0; a row that sees nothing gives O = 0 and
// LSE = -inf. Dropout drops from P after its row sum, as in FA1 Algorithm 2. The summaries are
// fp32 in HBM (values in O_partial, m_j and l_j in LSE_partial-shaped m and l scratch tensors).
#pragma once

#include <algorithm>

#include "pseudocode.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

// Query chunks of block_rows, key chunks of block_cols (tiling.hpp: BlockTiling); the paper's
// defaults, query_chunk_size and key_chunk_size:
inline constexpr BlockTiling kMemoryEfficientPaperChunks{1024, 4096};

// Its working set (tiling.hpp: WorkingSetDims). Summaries: Q_i, K_j, V_j, S, P, values (r x dv);
// m, l. Combine: Q_i still held, O, values (fp32), m, l, m_j, l_j, weight.
inline std::int64_t memory_efficient_working_set_bytes(const Problem& p, int block_rows, int block_cols) {
  const WorkingSetDims t(p, block_rows, block_cols);
  return std::max(t.e * (t.r * t.d + t.c * (t.d + t.dv) + 2 * t.r * t.c + t.r * t.dv) + 2 * t.f * t.r,
                  t.e * (t.r * t.d + t.r * t.dv) + t.f * t.r * t.dv + 5 * t.f * t.r)
      .value();
}
// Its block rule from M elements: square chunks as large as fit (the summaries' round trip
// falls with the key chunk), so the side is bounded by M alone; no paper rule.
inline std::int64_t memory_efficient_block_side(std::int64_t m_elements, std::int64_t) { return m_elements; }

template <class Memory>
void memory_efficient_attention(Memory& mem, const HeadProblem& head, const BlockTiling& tiling,
                                const HeadTensors& x) {
  tiling.validate();
  const int Br = tiling.block_rows, Bc = tiling.block_cols, dv = head.head_dim_v;
  const int chunks = (head.seqlen_k + Bc - 1) / Bc;
  HbmScratch scratch(Memory::with_data);
  // Summaries of key chunk j for query row r: values at row j * seqlen_q + r, m and l at (r, j).
  const int summary_rows = checked_int(checked_mul(chunks, head.seqlen_q, "memory_efficient: chunks x seqlen_q"),
                                       "memory_efficient: summary rows");
  const HbmMatrix values = scratch.matrix(TensorId::O_partial, DType::fp32, summary_rows, dv);
  const HbmMatrix chunk_max = scratch.matrix(TensorId::m, DType::fp32, head.seqlen_q, chunks);
  const HbmMatrix chunk_sum = scratch.matrix(TensorId::l, DType::fp32, head.seqlen_q, chunks);
  const auto chunk_rows = [&](int chunk, Range rows) { return Range{chunk * head.seqlen_q + rows.begin, rows.size}; };

  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {  // line 1
    const Range rows{row_begin, std::min(Br, head.seqlen_q - row_begin)};
    mem.mark_line(2);
    Tile q = mem.load(x.Q, rows);  // line 2
    for (int chunk = 0; chunk < chunks; ++chunk) {  // line 3: summarize_chunk
      const Range cols{chunk * Bc, std::min(Bc, head.seqlen_k - chunk * Bc)};
      mem.mark_line(4);
      Tile k = mem.load(x.K, cols);  // line 4
      Tile v = mem.load(x.V, cols);
      Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);
      const auto coverage = head.coverage(rows.begin, rows.end(), cols.begin, cols.end());
      if (coverage != HeadProblem::BlockCoverage::full || head.modifies_scores()) mem.apply_score_mods(s, head);
      mem.mark_line(5);
      Tile m = mem.row_max(TensorId::m, s);  // line 5
      Tile p = mem.exp_minus_row(TensorId::P, s, m);
      Tile l = mem.row_sum(TensorId::l, p);
      mem.apply_dropout(p, head);
      Tile chunk_values = mem.matmul_nn(TensorId::O_partial, p, v);
      mem.mark_line(6);
      mem.store(values, chunk_rows(chunk, rows), chunk_values);  // line 6
      mem.store(chunk_sum, rows, {chunk, 1}, l);
      mem.store(chunk_max, rows, {chunk, 1}, m);
    }

    mem.mark_line(7);  // line 7: the global max over the chunks
    Tile m = mem.vector(TensorId::m, rows, kNegInf);
    for (int chunk = 0; chunk < chunks; ++chunk) {
      Tile m_chunk = mem.load(chunk_max, rows, {chunk, 1});
      mem.maximum(m, m_chunk);
    }
    mem.mark_line(8);  // line 8: rescale and add the summaries
    Tile o = mem.zeros(TensorId::O, rows, {0, dv});
    Tile l = mem.vector(TensorId::l, rows, 0.0f);
    for (int chunk = 0; chunk < chunks; ++chunk) {
      Tile m_chunk = mem.load(chunk_max, rows, {chunk, 1});
      Tile l_chunk = mem.load(chunk_sum, rows, {chunk, 1});
      Tile values_chunk = mem.load(values, chunk_rows(chunk, rows));
      Tile weight = mem.exp_difference(TensorId::m, m_chunk, m);  // e^{m_j - m}; -inf - (-inf) gives 1, times 0
      mem.scale_rows(values_chunk, weight);
      mem.add(o, values_chunk);
      mem.scale_rows(l_chunk, weight);
      mem.add(l, l_chunk);
    }
    mem.mark_line(9);  // line 9
    mem.divide_rows(o, l);
    Tile lse = mem.log_sum_exp(TensorId::LSE, m, l);
    mem.store(x.O, rows, o);
    mem.store(x.LSE, rows, lse);
  }
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& memory_efficient_pseudocode() {
  static const Pseudocode code{"Memory-efficient attention (Rabe and Staats 2021)",
       {{1, "for each query chunk Q_i:"},
        {2, "  load Q_i"},
        {3, "  for each key chunk j:"},
        {4, "    load K_j, V_j; s = tau Q_i K_j^T, masked"},
        {5, "    m_j = rowmax(s), P = exp(s - m_j), l_j = rowsum(P), values_j = P V_j"},
        {6, "    write values_j, l_j, m_j to HBM"},
        {7, "  m = -inf; for each key chunk: load m_j, m = max(m, m_j)"},
        {8, "  O = 0, l = 0; for each key chunk: load m_j, l_j, values_j;\n"
            "    O += e^(m_j - m) values_j, l += e^(m_j - m) l_j"},
        {9, "  write O_i = O / l and LSE_i = m + log(l)"}}};
  return code;
}

}  // namespace flashlab
