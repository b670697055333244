// Square tiling for small SRAM (Saha and Ye 2024, "The I/O Complexity of Attention, or How
// Optimal is Flash Attention?", arXiv 2402.07443, Algorithm 1).
//
// When the SRAM M is smaller than d^2, FlashAttention's blocks (M / 4d rows) get thinner than
// d and it moves Theta(N^2 d^2 / M); Saha and Ye show the optimum there is
// Theta(N^2 d / sqrt(M)) and reach it with the plain I/O-optimal matrix product: square tiles of
// side B = floor(sqrt(M / 4)) (M in elements), the inner dimension tiled too, and the N x N
// matrix A = exp(Q K^T) written to HBM in between:
//   phase 1: for every B x B tile (i, j) of S: S_ij = sum over B-wide slices t of d of
//            Q_{i,t} K_{j,t}^T; A_ij = exp(scale S_ij) written to HBM; the row sums l_i of A
//            accumulate on chip across j and are written once per row tile (with LSE = log l);
//   phase 2: for every B x B tile (i, c) of O: O_ic = sum_j A_ij V_{j,c}, divided by l_i.
// With M >= d^2 the slices are the whole of d and A's round trip costs Theta(N^2) against
// FlashAttention's Theta(N^2 d^2 / M): square tiling wins only below M ~ d^2 (the crossover of
// Saha and Ye's Theorem 3.1 lower bound, min(N^2 d / sqrt(M), N^2 d^2 / M)).
//
// Like the paper (an I/O argument), A = exp(S) has no max subtracted: scores above ~88 overflow
// fp32 (above ~11 when A is fp16). Softcap, ALiBi and masks modify S before the exponential
// (a masked score gives A = 0); dropout multiplies A as phase 2 reads it, after l was summed.
//
// Pseudocode (the line numbers the trace marks):
//   1  B = floor(sqrt(M / 4))
//   2  for each row tile i: l_i = 0 on chip
//   3    for each column tile j: S_ij = 0
//   4      for each slice t of d: load Q_{i,t}, K_{j,t}; S_ij += Q_{i,t} K_{j,t}^T
//   5      A_ij = exp(scale S_ij, modified and masked); l_i += rowsum(A_ij); write A_ij to HBM
//   6    write l_i and LSE_i = log(l_i)
//   7  for each row tile i and each column tile c of the value dim: O_ic = 0
//   8    for each column tile j: load A_ij, V_{j,c}; O_ic += A_ij V_{j,c}
//   9    load l_i; write O_ic / l_i
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "pseudocode.hpp"
#include "tile_memory.hpp"
#include "tiling.hpp"

namespace flashlab {

struct SquareTiling {
  int block = 64;  // B: the side of every tile (rows, keys and slices of d alike)

  void validate() const {
    if (block < 1) throw std::invalid_argument("square tile side B = " + std::to_string(block) + "; allowed: >= 1");
  }
  // Saha and Ye, Algorithm 1: B = floor(sqrt(M / 4)) with M the SRAM size in elements.
  static std::int64_t side_of(std::int64_t m_elements) {
    return static_cast<std::int64_t>(std::floor(std::sqrt(static_cast<double>(m_elements) / 4.0)));
  }
  static SquareTiling from_sram(std::int64_t sram_bytes, DType dtype) {
    const std::int64_t side = side_of(sram_elements(sram_bytes, dtype));
    if (side < 1) {
      throw std::invalid_argument("SRAM size M = " + std::to_string(sram_bytes) + " bytes gives a square tile side of 0; allowed: M >= " +
                                  std::to_string(4 * element_bytes(dtype)) + " bytes (4 elements)");
    }
    return {static_cast<int>(std::min<std::int64_t>(side, 1 << 30))};
  }
};

// Its working set (tiling.hpp: WorkingSetDims) with tile side B: B rows, B keys, B-wide slices
// of d and dv.
inline std::int64_t square_tiling_working_set_bytes(const Problem& p, int block) {
  const WorkingSetDims tiles(p, block, block);
  const CheckedInt64 r = tiles.r, e = tiles.e, f = tiles.f;
  const CheckedInt64 t = std::min<CheckedInt64>(block, tiles.d), w = std::min<CheckedInt64>(block, tiles.dv);
  const CheckedInt64 c = std::min<CheckedInt64>(block, tiles.nk);
  return std::max({e * (r * c + r * t + c * t) + 2 * f * r,  // S_ij, Q_{i,t}, K_{j,t}; l, zeros
                   2 * e * r * c + 3 * f * r,                // S_ij, A_ij; l, zeros, rowsum(A)
                   e * (r * w + r * c + c * w)})             // O_ic, A_ij, V_{j,c}
      .value();
}

template <class Memory>
void square_tiling_attention(Memory& mem, const HeadProblem& head, const SquareTiling& tiling, const HeadTensors& x) {
  tiling.validate();
  mem.mark_line(1);
  const int B = tiling.block, d = head.head_dim, dv = head.head_dim_v;
  const auto tile = [B](int begin, int length) { return Range{begin, std::min(B, length - begin)}; };
  HbmScratch scratch(Memory::with_data);
  const HbmMatrix A = scratch.matrix(TensorId::A, head.dtype, head.seqlen_q, head.seqlen_k);
  const HbmMatrix row_sums = scratch.matrix(TensorId::l, DType::fp32, head.seqlen_q, 1);

  // Phase 1: A = exp(S) by square tiles, the inner dimension d tiled as well.
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += B) {  // line 2
    const Range rows = tile(row_begin, head.seqlen_q);
    mem.mark_line(2);
    Tile l = mem.vector(TensorId::l, rows, 0.0f);
    Tile zero_max = mem.vector(TensorId::m, rows, 0.0f);  // exp(S - 0): no max subtracted
    for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += B) {  // line 3
      const Range cols = tile(col_begin, head.seqlen_k);
      mem.mark_line(3);
      Tile s = mem.zeros(TensorId::S, rows, cols);
      for (int slice_begin = 0; slice_begin < d; slice_begin += B) {  // line 4
        const Range slice = tile(slice_begin, d);
        mem.mark_line(4);
        Tile q = mem.load(x.Q, rows, slice);
        Tile k = mem.load(x.K, cols, slice);
        mem.multiply_add(s, q, Transpose::no, k, Transpose::yes, head.scale);
      }
      mem.mark_line(5);  // line 5
      const auto coverage = head.coverage(rows.begin, rows.end(), cols.begin, cols.end());
      if (coverage != HeadProblem::BlockCoverage::full || head.modifies_scores()) mem.apply_score_mods(s, head);
      Tile a = mem.exp_minus_row(TensorId::A, s, zero_max);
      Tile a_row_sum = mem.row_sum(TensorId::l, a);
      mem.add(l, a_row_sum);
      mem.store(A, rows, cols, a);
    }
    mem.mark_line(6);  // line 6
    mem.store(row_sums, rows, l);
    Tile lse = mem.log_sum_exp(TensorId::LSE, zero_max, l);
    mem.store(x.LSE, rows, lse);
  }

  // Phase 2: O = diag(l)^-1 A V by square tiles.
  for (int row_begin = 0; row_begin < head.seqlen_q; row_begin += B) {  // line 7
    const Range rows = tile(row_begin, head.seqlen_q);
    for (int value_begin = 0; value_begin < dv; value_begin += B) {
      const Range value_cols = tile(value_begin, dv);
      mem.mark_line(7);
      Tile o = mem.zeros(TensorId::O, rows, value_cols);
      for (int col_begin = 0; col_begin < head.seqlen_k; col_begin += B) {  // line 8
        const Range cols = tile(col_begin, head.seqlen_k);
        mem.mark_line(8);
        Tile a = mem.load(A, rows, cols);
        mem.apply_dropout(a, head);
        Tile v = mem.load(x.V, cols, value_cols);
        mem.multiply_add(o, a, Transpose::no, v, Transpose::no);
      }
      mem.mark_line(9);  // line 9
      Tile l = mem.load(row_sums, rows);
      mem.divide_rows(o, l);
      mem.store(x.O, rows, value_cols, o);
    }
  }
}

// Its pseudocode (pseudocode.hpp), the lines it marks.
inline const Pseudocode& square_tiling_pseudocode() {
  static const Pseudocode code{"Square tiling for small SRAM (Saha and Ye 2024, Algorithm 1)",
       {{1, "B = floor(sqrt(M / 4))"},
        {2, "for each row tile i: l_i = 0 on chip"},
        {3, "  for each column tile j: S_ij = 0"},
        {4, "    for each slice t of d: load Q_(i,t), K_(j,t); S_ij += Q_(i,t) K_(j,t)^T"},
        {5, "    A_ij = exp(tau S_ij, masked); l_i += rowsum(A_ij); write A_ij to HBM"},
        {6, "  write l_i and LSE_i = log(l_i)"},
        {7, "for each row tile i and column tile c of the value dim: O_ic = 0"},
        {8, "  for each column tile j: load A_ij, V_(j,c); O_ic += A_ij V_(j,c)"},
        {9, "  load l_i; write O_ic / l_i"}}};
  return code;
}

}  // namespace flashlab
