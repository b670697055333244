// FlashAttention forward pass (Dao et al. 2022, Algorithm 1; masking, scaling and dropout as in
// Algorithm 2).
//
// The outer loop runs over key/value blocks K_j, V_j, the inner loop over query blocks Q_i. The
// running output O_i and the softmax statistics l_i (sum) and m_i (max) live in HBM: every inner
// step reads them, folds in block j and writes them back (lines 8-13), so O is read and written
// Tc times. FA2 (04_fa2_forward.hpp) swaps the loops to keep them on chip.
//
// Every block is visited, as in the paper: a block the mask hides is masked, not skipped.
// fa1_forward_skipping (09_block_sparse.hpp) is the variant that skips such blocks, as the
// project's FA1 kernel does (kernels/01_fa1_sm75): FA1 Algorithm 5's loop with the block mask
// taken from the causal or window mask.
//
// Precision, decided once: l and m are fp32 scratch tensors in HBM (as in the paper's CUDA code).
// O_i is rewritten after every key block, and rounding it to bf16/fp16 Tc times would compound
// the rounding error, so the running O also accumulates in an fp32 HBM scratch tensor (the
// original FA1 kernels kept a float "o_tmp" the same way). The write of the last key block goes
// to the output O in the problem's dtype, together with LSE = m + log(l). The HBM traffic of O
// is therefore counted at 4 bytes per element except for that final write.
//
// Block sizes are given, or derived from the SRAM size M in bytes:
//   fa1_paper_tiling(M, ...)   - line 1: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d), with M
//                                     in elements (M / element size). The rule budgets M/4 for each
//                                     of K_j, V_j, Q_i, O_i and ignores the S_ij/P_ij tiles
//                                     (Br x Bc each, up to M/4 elements) and l, m: run with an
//                                     arena of exactly M bytes it overflows (a test shows it).
//   fa1_fitting_tiling(M, ...) - the largest Bc (with Br = min(Bc, d), the paper's shape)
//                                     whose working set, fa1_forward_sram_bytes(), is <= M bytes.
//                                     That function sums every tile the schedule holds at once,
//                                     so the tiling fits by construction (a test checks the peak).
#pragma once

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "pseudocode.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

// Line 1's shape for a side (tiling.hpp: fa1_block_side): Bc = side, Br = min(side, d).
inline BlockTiling fa1_tiling_of_side(int side, int head_dim) { return {std::min(side, head_dim), side}; }
// FA1 Algorithm 1, line 1, from the SRAM size in bytes.
inline BlockTiling fa1_paper_tiling(std::int64_t sram_bytes, int head_dim, DType dtype);
// The paper's shape, shrunk until the whole working set fits in sram_bytes.
inline BlockTiling fa1_fitting_tiling(std::int64_t sram_bytes, int head_dim, int head_dim_v, DType dtype);

// fa1_forward's working set on one head of a problem (tiling.hpp: WorkingSetDims), the same
// tiles as fa1_forward_sram_bytes below with blocks clipped to the sequences: K_j, V_j; Q_i,
// S_ij, P~_ij, the product P~ V_j; O_i loaded from its fp32 accumulator; l, m, m~, l~, m_new,
// l_new, two rescale factors, LSE.
inline std::int64_t fa1_working_set_bytes(const Problem& p, int block_rows, int block_cols) {
  const WorkingSetDims t(p, block_rows, block_cols);
  return (t.e * (t.c * (t.d + t.dv) + t.r * t.d + 2 * t.r * t.c + t.r * t.dv) + t.f * t.r * t.dv + 9 * t.f * t.r).value();
}

// The most SRAM fa1_forward (and the block-sparse variant) holds at once with full blocks: K_j and
// V_j; Q_i, S_ij and P_ij in the problem's dtype; O_i loaded from its fp32 accumulator and the
// product P_ij V_j; nine fp32 row vectors (l_i, m_i, m~_ij, l~_ij, m_new, l_new, the two
// rescale factors, LSE). Nothing is released inside an inner step, so this is the exact peak when
// the sequences are multiples of the block sizes, and an upper bound otherwise.
inline std::int64_t fa1_forward_sram_bytes(const BlockTiling& tiling, int head_dim, int head_dim_v,
                                           DType dtype) {
  const std::int64_t Br = tiling.block_rows, Bc = tiling.block_cols, d = head_dim, dv = head_dim_v;
  const std::int64_t b = element_bytes(dtype), fp32 = 4;
  const std::int64_t key_value = Bc * (d + dv) * b;
  const std::int64_t query_scores_probabilities = (Br * d + 2 * Br * Bc) * b;
  const std::int64_t outputs = Br * dv * fp32 + Br * dv * b;
  const std::int64_t statistics = 9 * Br * fp32;
  return key_value + query_scores_probabilities + outputs + statistics;
}

inline BlockTiling fa1_paper_tiling(std::int64_t sram_bytes, int head_dim, DType dtype) {
  if (head_dim < 1)
    throw std::invalid_argument("head_dim = " + std::to_string(head_dim) + "; allowed: >= 1");
  const std::int64_t minimum = 4LL * head_dim * element_bytes(dtype);
  if (sram_bytes < minimum) {
    throw std::invalid_argument(
        "SRAM size M = " + std::to_string(sram_bytes) +
        " bytes is too small for FA1's block-size rule; allowed: M >= 4 * head_dim * " +
        std::to_string(element_bytes(dtype)) + " = " + std::to_string(minimum) + " bytes");
  }
  return fa1_tiling_of_side(static_cast<int>(fa1_block_side(sram_elements(sram_bytes, dtype), head_dim)), head_dim);
}

inline BlockTiling fa1_fitting_tiling(std::int64_t sram_bytes, int head_dim, int head_dim_v, DType dtype) {
  if (head_dim < 1)
    throw std::invalid_argument("head_dim = " + std::to_string(head_dim) + "; allowed: >= 1");
  if (head_dim_v < 1)
    throw std::invalid_argument("head_dim_v = " + std::to_string(head_dim_v) + "; allowed: >= 1");
  const auto tiling_for = [&](std::int64_t Bc) { return fa1_tiling_of_side(static_cast<int>(Bc), head_dim); };
  const auto fits = [&](std::int64_t Bc) {
    return fa1_forward_sram_bytes(tiling_for(Bc), head_dim, head_dim_v, dtype) <= sram_bytes;
  };
  const std::int64_t minimum = fa1_forward_sram_bytes({1, 1}, head_dim, head_dim_v, dtype);
  if (!fits(1)) {
    throw std::invalid_argument(
        "SRAM size M = " + std::to_string(sram_bytes) +
        " bytes is too small for FA1 forward with head_dim " + std::to_string(head_dim) +
        ", head_dim_v " + std::to_string(head_dim_v) + ", " + to_string(dtype) +
        "; allowed: M >= " + std::to_string(minimum) + " bytes (1 x 1 blocks)");
  }
  // The working set grows with Bc: binary search for the largest Bc that fits.
  std::int64_t low = 1, high = std::max<std::int64_t>(1, sram_elements(sram_bytes, dtype));
  while (low < high) {
    const std::int64_t middle = low + (high - low + 1) / 2;
    if (fits(middle))
      low = middle;
    else
      high = middle - 1;
  }
  return tiling_for(std::min<std::int64_t>(low, 1 << 30));
}

// ---------------------------------------------------------------------------------------------
// Pieces shared with FA1 Algorithm 5 (09_block_sparse.hpp), whose body is this one inside an
// "if M_ij != 0". The two algorithms number their lines differently; each passes its own.
struct Fa1Lines {
  int initialize;        // O = 0, l = 0, m = -inf in HBM
  int load_key_value;    // load K_j, V_j
  int load_query_state;  // load Q_i, O_i, l_i, m_i
  int scores;            // S_ij = tau Q_i K_j^T
  int mask;              // S_ij^masked = MASK(S_ij)
  int block_statistics;  // m~_ij, P~_ij, l~_ij
  int new_statistics;    // m_i^new, l_i^new
  int dropout;           // P~_ij^dropped
  int write_output;      // O_i <- ...
  int write_statistics;  // l_i <- l_i^new, m_i <- m_i^new
  int finish;            // return
  int skip_test = 0;     // skipping variants: the line whose test skips a hidden block (0: none)
};
// FA1 Algorithm 1 has no mask and dropout lines (Algorithm 2 adds them as its lines 11 and 14):
// they are shown at the lines they belong to, 9 and 12.
inline constexpr Fa1Lines kFa1Algorithm1Lines{2, 6, 8, 9, 9, 10, 11, 12, 12, 13, 16};

// The running state of FA1 in HBM: O accumulated in fp32 (see the header comment), l and m.
struct Fa1HbmState {
  HbmMatrix O_accumulator, l, m;
};

inline Fa1HbmState fa1_hbm_state(HbmScratch& scratch, const HeadProblem& head) {
  return {scratch.matrix(TensorId::O, DType::fp32, head.seqlen_q, head.head_dim_v),
          scratch.matrix(TensorId::l, DType::fp32, head.seqlen_q, 1),
          scratch.matrix(TensorId::m, DType::fp32, head.seqlen_q, 1)};
}

// Line 2 for one query block: O_i = 0, l_i = 0, m_i = -inf written to HBM.
template <class Memory>
void fa1_initialize_block(Memory& mem, const Fa1HbmState& state, Range rows, int value_dim) {
  Tile o = mem.zeros(TensorId::O, rows, {0, value_dim});
  Tile l = mem.vector(TensorId::l, rows, 0.0f);
  Tile m = mem.vector(TensorId::m, rows, kNegInf);
  mem.store(state.O_accumulator, rows, o);
  mem.store(state.l, rows, l);
  mem.store(state.m, rows, m);
}

// Lines 8-13: one inner step, query block `rows` against the key/value block k, v already in SRAM.
// On the last visit of a query block O_i goes to the output (problem dtype) with its LSE. The
// comments give Algorithm 1's line numbers; the trace marks the caller's (`line`).
template <class Memory>
void fa1_inner_step(Memory& mem, const HeadProblem& head, const HeadTensors& x,
                    const Fa1HbmState& state, const Tile& k, const Tile& v, Range rows,
                    bool last_visit, const Fa1Lines& line) {
  mem.mark_line(line.load_query_state);
  Tile q = mem.load(x.Q, rows);  // line 8: load Q_i, O_i, l_i, m_i from HBM to SRAM
  Tile o = mem.load(state.O_accumulator, rows);
  Tile l = mem.load(state.l, rows);
  Tile m = mem.load(state.m, rows);

  mem.mark_line(line.scores);
  Tile s = mem.matmul_nt(TensorId::S, q, k, head.scale);  // line 9: S_ij = tau Q_i K_j^T
  const auto coverage = head.coverage(rows.begin, rows.end(), k.rows().begin, k.rows().end());
  if (coverage != HeadProblem::BlockCoverage::full || head.modifies_scores()) {
    mem.mark_line(line.mask);
    mem.apply_score_mods(s, head);  // Algorithm 2, line 11: softcap, ALiBi, MASK
  }

  mem.mark_line(line.block_statistics);                 // line 10:
  Tile m_block = mem.row_max(TensorId::m, s);           //   m~_ij = rowmax(S_ij)
  Tile p = mem.exp_minus_row(TensorId::P, s, m_block);  //   P~_ij = exp(S_ij - m~_ij)
  Tile l_block = mem.row_sum(TensorId::l, p);           //   l~_ij = rowsum(P~_ij)

  mem.mark_line(line.new_statistics);  // line 11:
  Tile m_new = mem.copy(TensorId::m, m);
  mem.maximum(m_new, m_block);                                         //   m_new = max(m_i, m~_ij)
  Tile old_scale = mem.exp_difference(TensorId::m, m, m_new);          //   e^{m_i - m_new}
  Tile block_scale = mem.exp_difference(TensorId::m, m_block, m_new);  //   e^{m~_ij - m_new}
  Tile l_new = mem.copy(TensorId::l, l);
  mem.scale_rows(l_new, old_scale);
  mem.scale_rows(l_block, block_scale);
  mem.add(l_new, l_block);  //   l_new = e^{m_i - m_new} l_i + e^{m~_ij - m_new} l~_ij

  mem.mark_line(line.dropout);
  mem.apply_dropout(p, head);  // Algorithm 2, line 14: P~_ij dropped (after its row sum)

  mem.mark_line(line.write_output);  // line 12:
  Tile pv = mem.matmul_nn(TensorId::O, p, v);
  mem.scale_rows(o, l);             //   diag(l_i) O_i: undo the last normalisation
  mem.scale_rows(o, old_scale);     //   ... e^{m_i - m_new}
  mem.scale_rows(pv, block_scale);  //   + e^{m~_ij - m_new} P~_ij V_j
  mem.add(o, pv);
  mem.divide_rows(o, l_new);  //   diag(l_new)^-1 (...); l_new = 0 (nothing visible yet) gives 0
  mem.store(last_visit ? x.O : state.O_accumulator, rows, o);  //   write O_i to HBM

  mem.mark_line(line.write_statistics);  // line 13: write l_i <- l_new, m_i <- m_new to HBM
  mem.store(state.l, rows, l_new);
  mem.store(state.m, rows, m_new);
  if (last_visit) {
    Tile lse = mem.log_sum_exp(TensorId::LSE, m_new, l_new);  // the backward's L = m + log(l)
    mem.store(x.LSE, rows, lse);
  }
  mem.note_softmax_state(m_new, l_new, old_scale);
}

// ---------------------------------------------------------------------------------------------
// FA1 Algorithm 1.
template <class Memory>
void fa1_forward(Memory& mem, const HeadProblem& head, const BlockTiling& tiling,
                 const HeadTensors& x) {
  tiling.validate();  // line 1: block sizes (given, or from fa1_paper_tiling / fa1_fitting_tiling)
  const Fa1Lines& line = kFa1Algorithm1Lines;
  const int Br = tiling.block_rows, Bc = tiling.block_cols;
  // Lines 3-4: Q, O, l, m in Tr blocks of Br rows; K, V in Tc blocks of Bc rows (the last
  // block of each is shorter when Br or Bc does not divide the sequence).
  const auto row_block = [&](int begin) {
    return Range{begin, std::min(Br, head.seqlen_q - begin)};
  };
  const auto col_block = [&](int begin) {
    return Range{begin, std::min(Bc, head.seqlen_k - begin)};
  };
  const int last_col_begin = (head.seqlen_k - 1) / Bc * Bc;

  HbmScratch scratch(Memory::with_data);
  const Fa1HbmState state = fa1_hbm_state(scratch, head);
  mem.mark_line(line.initialize);
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {  // line 2
    fa1_initialize_block(mem, state, row_block(row_begin), head.head_dim_v);
  }

  for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += Bc) {  // line 5: for 1 <= j <= Tc
    mem.mark_line(line.load_key_value);
    Tile k = mem.load(x.K, col_block(col_begin));  // line 6: load K_j, V_j from HBM to SRAM
    Tile v = mem.load(x.V, col_block(col_begin));
    // Line 7: for 1 <= i <= Tr; lines 8-13 in the inner step.
    for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += Br) {
      const bool last_visit = col_begin == last_col_begin;
      fa1_inner_step(mem, head, x, state, k, v, row_block(row_begin), last_visit, line);
    }
  }
  mem.mark_line(line.finish);  // line 16: return O (and LSE)
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& fa1_forward_pseudocode() {
  static const Pseudocode code{"FlashAttention forward (FA1 Algorithm 1; mask and dropout of Algorithm 2)",
       {{0, "in HBM: Q, K, V (N x d); SRAM of M bytes"},
        {1, "Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)"},
        {2, "O = 0, l = 0, m = -inf in HBM"},
        {3, "split Q into Tr blocks of Br rows; K, V into Tc blocks of Bc rows"},
        {4, "split O, l, m into Tr blocks"},
        {5, "for j = 1 .. Tc:"},
        {6, "  load K_j, V_j from HBM to SRAM"},
        {7, "  for i = 1 .. Tr:"},
        {8, "    load Q_i, O_i, l_i, m_i from HBM to SRAM"},
        {9, "    on chip: S_ij = tau Q_i K_j^T (then the mask)"},
        {10, "    on chip: m~ = rowmax(S_ij), P~ = exp(S_ij - m~), l~ = rowsum(P~)"},
        {11, "    on chip: m_new = max(m_i, m~),\n"
             "             l_new = exp(m_i - m_new) l_i + exp(m~ - m_new) l~"},
        {12, "    write O_i = diag(l_new)^-1 (diag(l_i) exp(m_i - m_new) O_i\n"
             "                    + exp(m~ - m_new) P~ V_j) to HBM   (P~ after dropout)"},
        {13, "    write l_i = l_new, m_i = m_new to HBM"},
        {14, "  end for"},
        {15, "end for"},
        {16, "return O"}}};
  return code;
}

}  // namespace flashlab
