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
//
// A paged KV cache (PagedKvCache; as serving engines keep it: vLLM's PagedAttention, the
// block_table of FlashAttention's kvcache kernels): K and V of a sequence live in pages of
// page_size tokens anywhere in a pool, and a block table of int32 page ids, one per page of the
// sequence, says where. Line 4 then first reads the block-table entries of the pages that key
// block j touches (once per KV group, like K_j and V_j), then K_j and V_j through them. What a
// key block reads of its pages is the kernel's choice (PageReads):
//   valid_rows  - only the block's own rows (FlashAttention's paged kernels: the row loads are
//                 predicated, so a split boundary or the sequence end inside a page costs
//                 nothing): K, V traffic as unpaged, plus the block-table reads;
//   whole_pages - every page the block touches, in full (vLLM's paged attention: one page per
//                 iteration, the rows past the sequence end or outside the block masked in
//                 registers): the rows outside the block are read and dropped (read_unused), so
//                 a page cut by a split boundary is read by both chunks, the last page in full,
//                 and a key block narrower than a page re-reads its page.
// Which physical page holds a logical page changes nothing in a two-level count (HBM has no
// addresses here), so the model keeps K and V at their logical rows and the block table's ids
// are the identity; only the page granularity and the table's reads are counted.
#pragma once

#include <algorithm>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "pseudocode.hpp"
#include "04_fa2_forward.hpp"  // fa2_working_set_bytes
#include "online_softmax.hpp"
#include "paged_kv_cache.hpp"
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

// Its working set with contiguous chunks of num_splits (0: 4) (tiling.hpp: WorkingSetDims): phase 1
// as FA2 with the KV group's query heads packed; phase 2, one row: chunk LSEs, partial outputs
// (fp32), P, O, statistics.
inline std::int64_t split_kv_working_set_bytes(const Problem& p, int block_rows, int block_cols, int num_splits) {
  const WorkingSetDims t(p, block_rows, block_cols);
  const CheckedInt64 splits = num_splits > 0 ? num_splits : 4;
  const CheckedInt64 chunks = (t.nk + (t.nk + splits - 1) / splits - 1) / ((t.nk + splits - 1) / splits);
  const CheckedInt64 combine = t.f * chunks * (1 + t.dv) + t.e * (t.dv + chunks) + 5 * t.f;
  return std::max(fa2_working_set_bytes(p, block_rows, block_cols, p.group_size()), combine.value());
}

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

// GQA/MQA packing (as decoding kernels do: the query heads of one KV head packed into one
// tile): `heads` are the query heads of one KV group, all reading the same K and V. Line 4 then
// loads K_j, V_j once per (chunk, query block, key block) for the whole group, and lines 5-6
// run for each head of the group on that one copy, so K and V are read once per KV head, not
// once per query head. The heads share the mask (only ALiBi slopes differ, which never hide a
// block), so the group's visible blocks are its first head's. A group of one is the unpacked
// schedule. Held at the peak: the group's Q_i and (m, l, O) state, one K_j, V_j, one S, P.
template <class Memory>
void split_kv_forward_group(Memory& mem, std::span<const HeadProblem> heads, const SplitKvTiling& tiling,
                            std::span<const HeadTensors> xs, const PagedKvCache& cache = {}) {
  tiling.validate();
  cache.validate();
  if (heads.empty() || heads.size() != xs.size()) {
    throw std::invalid_argument("split_kv_forward_group: " + std::to_string(heads.size()) + " heads and " +
                                std::to_string(xs.size()) + " tensor views; allowed: as many of both, at least one");
  }
  const HeadProblem& first_head = heads.front();
  const int Br = tiling.block_rows, Bc = tiling.block_cols, dv = first_head.head_dim_v;
  const int chunk_length = tiling.chunk_length(first_head.seqlen_k);
  const int chunks = tiling.chunk_count(first_head.seqlen_k);
  const std::size_t group = heads.size();
  HbmScratch scratch(Memory::with_data);
  const int partial_rows = checked_int(checked_mul(first_head.seqlen_q, chunks, "split_kv: seqlen_q x chunks"),
                                       "split_kv: rows of O_partial");
  std::vector<HbmMatrix> O_partial, LSE_partial;  // one pair per query head of the group
  for (std::size_t g = 0; g < group; ++g) {
    O_partial.push_back(scratch.matrix(TensorId::O_partial, DType::fp32, partial_rows, dv));
    LSE_partial.push_back(scratch.matrix(TensorId::LSE_partial, DType::fp32, first_head.seqlen_q, chunks));
  }
  // Paged: the block table (int32 ids: 4 bytes, the size of fp32) and K, V as their pages span
  // them, the last page whole (its rows past the sequence end exist in the pool, unused).
  const int P = cache.page_size;
  HbmMatrix page_table, K_pages = xs.front().K, V_pages = xs.front().V;
  if (cache.paged()) {
    page_table = scratch.matrix(TensorId::page_table, DType::fp32, cache.pages(first_head.seqlen_k), 1);
    if constexpr (Memory::with_data) {
      for (int page = 0; page < page_table.rows; ++page) page_table.at(page, 0) = static_cast<float>(page);
    }
    K_pages.rows = V_pages.rows = checked_int(checked_mul(page_table.rows, P, "split_kv: pages x page_size"),
                                              "split_kv: rows of the paged KV cache");
  }

  // Phase 1: every (chunk, query block) independently, FA2 Algorithm 1 restricted to the chunk.
  for (int chunk = 0; chunk < chunks; ++chunk) {  // line 1
    const int chunk_begin = chunk * chunk_length;
    const int chunk_end = std::min(first_head.seqlen_k, chunk_begin + chunk_length);
    for (int row_begin = 0; row_begin < first_head.seqlen_q; row_begin += Br) {
      const Range rows{row_begin, std::min(Br, first_head.seqlen_q - row_begin)};
      mem.mark_line(2);
      std::vector<Tile> q;  // line 2, for every head of the group
      std::vector<SoftmaxState> state;
      for (std::size_t g = 0; g < group; ++g) {
        q.push_back(mem.load(xs[g].Q, rows));
        state.push_back(start_softmax_state(mem, rows, dv));
      }
      const auto [first_key, last_key] = first_head.visible_key_range(rows.begin, rows.end());
      const int first = std::max(first_key, chunk_begin), last = std::min(last_key, chunk_end);
      const int first_block = first - (first - chunk_begin) % Bc;  // blocks start at chunk_begin
      for (int col_begin = first_block; col_begin < last; col_begin += Bc) {  // line 3
        const Range cols{col_begin, std::min(Bc, chunk_end - col_begin)};
        const auto coverage = first_head.coverage(rows.begin, rows.end(), cols.begin, cols.end());
        if (coverage == HeadProblem::BlockCoverage::empty) continue;  // skipped, not masked
        mem.mark_line(4);
        if (cache.paged()) {  // line 4, paged: the block table's entries for the pages of block j
          const int first_page = cols.begin / P, last_page = (cols.end() - 1) / P;
          { Tile page_ids = mem.load(page_table, {first_page, last_page - first_page + 1}); }
          if (cache.reads == PageReads::whole_pages) {  // the rest of those pages, read and dropped
            const Range before{first_page * P, cols.begin - first_page * P};
            const Range after{cols.end(), (last_page + 1) * P - cols.end()};
            for (const Range rest : {before, after}) {
              if (rest.size == 0) continue;
              mem.read_unused(K_pages, rest);
              mem.read_unused(V_pages, rest);
            }
          }
        }
        Tile k = mem.load(xs.front().K, cols);  // line 4: once for the group
        Tile v = mem.load(xs.front().V, cols);
        for (std::size_t g = 0; g < group; ++g) {
          mem.mark_line(5);
          Tile s = mem.matmul_nt(TensorId::S, q[g], k, heads[g].scale);  // line 5
          if (coverage == HeadProblem::BlockCoverage::partial || heads[g].modifies_scores())
            mem.apply_score_mods(s, heads[g]);
          mem.mark_line(6);
          online_softmax_update(mem, state[g], s, v, heads[g]);  // line 6 (FA2 Algorithm 1, lines 9-10)
        }
      }
      mem.mark_line(7);
      for (std::size_t g = 0; g < group; ++g) {
        Tile lse = finish_softmax_state(mem, state[g]);  // line 7: O_c and LSE_c of this chunk
        mem.store(split_kv_detail::every_nth_row(O_partial[g], chunk, chunks), rows, state[g].o);
        mem.store(LSE_partial[g], rows, {chunk, 1}, lse);
      }
    }
  }

  // Phase 2: the combine, head by head. Row r's chunk LSEs act as scores, its partial outputs as values.
  for (std::size_t g = 0; g < group; ++g) {
    HeadProblem combine = heads[g];
    combine.dropout.probability = 0.0f;                    // dropout was applied in phase 1
    for (int row = 0; row < first_head.seqlen_q; ++row) {  // line 8
      const Range rows{row, 1};
      mem.mark_line(9);
      Tile chunk_lse = mem.load(LSE_partial[g], rows, {0, chunks});         // line 9: 1 x chunks
      Tile chunk_outputs = mem.load(O_partial[g], {row * chunks, chunks});  //         chunks x dv
      mem.mark_line(10);
      SoftmaxState combined = start_softmax_state(mem, rows, dv);
      online_softmax_update(mem, combined, chunk_lse, chunk_outputs, combine);  // line 10
      mem.mark_line(11);
      Tile lse = finish_softmax_state(mem, combined);  // line 11: O = sum_c e^{LSE_c - LSE} O_c
      mem.store(xs[g].O, rows, combined.o);
      mem.store(xs[g].LSE, rows, lse);
    }
  }
}

// One query head on its own (no packing): the group of one.
template <class Memory>
void split_kv_forward(Memory& mem, const HeadProblem& head, const SplitKvTiling& tiling, const HeadTensors& x,
                      const PagedKvCache& cache = {}) {
  split_kv_forward_group(mem, std::span<const HeadProblem>(&head, 1), tiling, std::span<const HeadTensors>(&x, 1), cache);
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& split_kv_pseudocode() {
  static const Pseudocode code{"Split-KV decoding (Flash-Decoding)",
       {{1, "for each KV chunk c and each query block Q_i (in parallel on a GPU):"},
        {2, "  load Q_i; on chip O = 0, l = 0, m = -inf"},
        {3, "  for each key block j of chunk c the mask does not hide:"},
        {4, "    load K_j, V_j"},
        {5, "    S = tau Q_i K_j^T, masked"},
        {6, "    online softmax update of (m, l, O) with S and V_j"},
        {7, "  O_c = diag(l)^-1 O, LSE_c = m + log(l); write both to HBM"},
        {8, "for each query row r (the combine):"},
        {9, "  load LSE_partial[r, :] and O_partial[r, :, :]"},
        {10, "  m = max_c LSE_c, l = sum_c e^(LSE_c - m), O = sum_c e^(LSE_c - m) O_c"},
        {11, "  write O_r = O / l and LSE_r = m + log(l)"}}};
  return code;
}

}  // namespace flashlab
