// The description of one attention problem, shared by every CPU schedule, the simulator and the
// GPU kernels' host API. Plain data plus the few rules every consumer must agree on: which key a
// query sees (masks), how a score is modified (scale, softcap, ALiBi), which probabilities dropout
// keeps (a counter-based RNG, so a (seed, offset) pair reproduces the same mask anywhere).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "mask_rule.hpp"
#include "philox.hpp"

namespace flashlab {

// ---------------------------------------------------------------------------------------------
// Element types. HBM holds inputs and outputs in the problem's dtype; the CPU emulates bf16/fp16
// by rounding fp32 values (round to nearest even), which is exactly what a store to such a
// tensor does on a GPU.
enum class DType { fp32, fp16, bf16 };

inline int element_bytes(DType dtype) { return dtype == DType::fp32 ? 4 : 2; }
// The one conversion of an SRAM size from bytes to elements of a dtype, the unit of the papers'
// formulas (FA1: "SRAM of size M" counts elements): whole elements for the block-size rules,
// the exact ratio for the bounds and the exponents they predict.
inline std::int64_t sram_elements(std::int64_t sram_bytes, DType dtype) { return sram_bytes / element_bytes(dtype); }
inline double sram_elements_exact(std::int64_t sram_bytes, DType dtype) {
  return static_cast<double>(sram_bytes) / element_bytes(dtype);
}
// And back: M elements of a dtype in bytes.
inline std::int64_t sram_bytes_of_elements(std::int64_t m_elements, DType dtype) { return m_elements * element_bytes(dtype); }
const char* to_string(DType dtype);
DType dtype_from_string(const std::string& name);  // "fp32", "fp16", "bf16"; throws otherwise
float round_to(DType dtype, float value);

// ---------------------------------------------------------------------------------------------
// Masks. With seqlen_q != seqlen_k a causal mask is aligned to a corner of the score matrix:
// top-left (query i sees key j iff j <= i) or bottom-right, the flash-attention convention
// (query i sees key j iff j <= i + seqlen_k - seqlen_q). The sliding window uses the same
// alignment: key j is visible iff i + offset - window_left <= j <= i + offset + window_right.
// The rule itself, shared with the GPU kernels, is MaskRule (mask_rule.hpp).
enum class CausalAlignment { top_left, bottom_right };

struct Mask {
  bool causal = false;
  CausalAlignment alignment = CausalAlignment::bottom_right;
  int window_left = -1;   // -1: unbounded on the left
  int window_right = -1;  // -1: unbounded on the right (causal implies 0)

  // The right bound with causal folded in: min(window_right, 0) when causal, -1 when unbounded.
  int effective_window_right() const {
    if (!causal) return window_right;
    return window_right >= 0 ? std::min(0, window_right) : 0;
  }
};

// A block mask with its own granularity, shared by every batch and head: block (r, c) covers
// query rows [r * block_rows, (r + 1) * block_rows) and keys [c * block_cols, ...).
struct BlockSparsity {
  int block_rows = 0;  // 0: no block sparsity
  int block_cols = 0;
  int row_blocks = 0;
  int col_blocks = 0;
  std::vector<std::uint8_t> keep;  // row-major row_blocks x col_blocks, 1 = computed

  bool enabled() const { return block_rows > 0; }
  bool kept(int row_block, int col_block) const {
    return keep[static_cast<std::size_t>(row_block) * col_blocks + col_block] != 0;
  }
};

// Dropout on the attention probabilities, as in FA1 Algorithm 2: element (i, j) of head h in
// batch b is kept iff philox(seed, offset, b, h, i, j) >= probability, and scaled by
// 1 / (1 - probability).
struct Dropout {
  float probability = 0.0f;  // in [0, 1)
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
};

// ---------------------------------------------------------------------------------------------
// The whole problem. Tensors are laid out as [rows, heads, dim] with rows = batch * seqlen
// (or the packed total for variable-length batches): the flash-attention layout.
struct Problem {
  int batch = 1;
  int heads_q = 1;
  int heads_kv = 1;  // MHA: heads_q; GQA: a divisor; MQA: 1
  int seqlen_q = 1;  // for varlen batches: the longest sequence (filled by validate_and_resolve)
  int seqlen_k = 1;
  int head_dim = 64;        // of Q and K
  int head_dim_v = 0;       // of V and O; 0: same as head_dim
  double softmax_scale = 0; // 0: 1 / sqrt(head_dim)
  Mask mask;
  std::vector<float> alibi_slopes;  // one per query head, or empty
  float softcap = 0.0f;             // 0: off; else score = softcap * tanh(score / softcap)
  BlockSparsity block_sparsity;
  std::vector<int> cu_seqlens_q;  // varlen: batch + 1 cumulative offsets, or empty
  std::vector<int> cu_seqlens_k;
  Dropout dropout;
  DType dtype = DType::fp32;

  // Throws std::invalid_argument whose message names the input and its allowed range.
  void validate() const;

  int value_dim() const { return head_dim_v > 0 ? head_dim_v : head_dim; }
  double scale() const;
  bool varlen() const { return !cu_seqlens_q.empty(); }
  int group_size() const { return heads_q / heads_kv; }
  int kv_head(int head_q) const { return head_q / group_size(); }

  int seqlen_q_of(int b) const;  // length of sequence b
  int seqlen_k_of(int b) const;
  int first_row_q(int b) const;  // its first row in the packed tensors
  int first_row_k(int b) const;
  int total_rows_q() const;
  int total_rows_k() const;
};

// A problem with a varlen batch built from per-sequence lengths (fills cu_seqlens_* and the
// maximum lengths).
void set_varlen(Problem& problem, const std::vector<int>& seqlens_q, const std::vector<int>& seqlens_k);

// ---------------------------------------------------------------------------------------------
// One (sequence, head) of a problem: what a schedule sees. Everything a tile needs to know
// about masking and score modification is here, with the rules written once.
struct HeadProblem {
  int batch_index = 0;
  int head_index = 0;  // query head
  int seqlen_q = 1;
  int seqlen_k = 1;
  int head_dim = 64;
  int head_dim_v = 64;
  float scale = 0.125f;
  Mask mask;
  float alibi_slope = 0.0f;  // 0: no ALiBi
  float softcap = 0.0f;
  const BlockSparsity* block_sparsity = nullptr;  // null: dense
  Dropout dropout;
  DType dtype = DType::fp32;
  // A block of a larger sequence (Ring Attention's block pairs, 12_ring_attention.hpp): the
  // diagonal moves by this many keys beyond the corner alignment's. 0 for a whole sequence.
  int diagonal_shift = 0;

  // The corner alignment: query i is aligned with key i + diagonal_offset().
  int diagonal_offset() const;
  // The causal and window rule of this sequence, as the kernels apply it.
  MaskRule mask_rule() const;
  bool key_visible(int row, int col) const;
  bool key_visible_ignoring_sparsity(int row, int col) const;  // causal and window only
  // The modified score of a visible (row, col), from the scaled dot product.
  float modify_score(float scaled_score, int row, int col) const;
  // d(modify_score) / d(scaled_score) at the same point (softcap's tanh derivative, else 1).
  float modify_score_derivative(float scaled_score) const;
  bool dropout_keeps(int row, int col) const;
  float dropout_scale() const { return 1.0f / (1.0f - dropout.probability); }
  bool modifies_scores() const { return softcap > 0 || alibi_slope != 0; }

  // Block-level view of the mask, so schedules can skip blocks instead of masking them.
  enum class BlockCoverage { empty, partial, full };
  BlockCoverage coverage(int row_begin, int row_end, int col_begin, int col_end) const;
  // The contiguous key range [first, last) that rows [row_begin, row_end) can see at all,
  // from the causal and window masks (block sparsity is checked per block).
  std::pair<int, int> visible_key_range(int row_begin, int row_end) const;
};

// Inline: the tiled schedules ask these once per block pair.
inline MaskRule HeadProblem::mask_rule() const {
  MaskRule rule = make_mask_rule(mask.alignment == CausalAlignment::bottom_right, mask.window_left,
                                 mask.effective_window_right(), seqlen_q, seqlen_k);
  rule.offset += diagonal_shift;
  return rule;
}

inline int HeadProblem::diagonal_offset() const { return mask_rule().offset; }

inline bool HeadProblem::key_visible_ignoring_sparsity(int row, int col) const {
  return mask_rule().visible(row, col);
}

inline std::pair<int, int> HeadProblem::visible_key_range(int row_begin, int row_end) const {
  const MaskRule rule = mask_rule();
  // The rule's first key lies past the keys when the rows see none: clamped here.
  return {std::min(rule.first_key(row_begin), seqlen_k), rule.last_key(row_end - 1)};
}

inline HeadProblem::BlockCoverage HeadProblem::coverage(int row_begin, int row_end, int col_begin, int col_end) const {
  // Causal and window masks are monotone in (row, col): test the block's extreme corners.
  const auto [first, last] = visible_key_range(row_begin, row_end);
  if (col_end <= first || col_begin >= last) return BlockCoverage::empty;
  if (block_sparsity != nullptr) {
    const int r0 = row_begin / block_sparsity->block_rows, r1 = (row_end - 1) / block_sparsity->block_rows;
    const int c0 = col_begin / block_sparsity->block_cols, c1 = (col_end - 1) / block_sparsity->block_cols;
    bool any = false, all = true;
    for (int r = r0; r <= r1; ++r) {
      for (int c = c0; c <= c1; ++c) {
        const bool kept = block_sparsity->kept(r, c);
        any = any || kept;
        all = all && kept;
      }
    }
    if (!any) return BlockCoverage::empty;
    if (!all) return BlockCoverage::partial;
  }
  const bool full = mask_rule().block_full(row_begin, row_end - 1, col_begin, col_end);
  return full ? BlockCoverage::full : BlockCoverage::partial;
}

HeadProblem head_problem(const Problem& problem, int batch_index, int head_index);

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

}  // namespace flashlab
