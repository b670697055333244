// The causal / sliding-window mask rule, written once for the CPU schedules (through
// HeadProblem) and the GPU kernels. Query row i is aligned with key i + offset (offset =
// seqlen_k - seqlen_q for the bottom-right corner, 0 for the top-left one) and sees key j iff
//   j < seqlen_k  and  i + offset - left <= j <= i + offset + right,
// a bound of -1 being absent; causal is the right bound min(right, 0). Both bounds grow with i,
// so every block-level question (which keys a row range sees, which queries a key range is seen
// by, whether a block is fully visible) is answered by its extreme rows and keys, in O(1): this
// is how the tiled schedules and the kernels skip the blocks a mask hides instead of masking
// them (FA2 Section 3.1).
//
// The kernels call these in their inner loops: each function is the exact arithmetic the
// kernels were written with, inline, without clamping they do not need.
#pragma once

#include <algorithm>

#include "host_device.hpp"

namespace flashlab {

// Keys [low, high] that one query row sees (inclusive; empty when low > high).
struct KeyInterval {
  int low, high;
};

// Queries [low, high] that see one key (inclusive; empty when low > high).
struct QueryInterval {
  int low, high;
};

// A half-open range [first, last) of keys or queries; empty when first >= last.
struct IndexRange {
  int first, last;
};

struct MaskRule {
  int offset;  // query row i is aligned with key i + offset
  int left;    // keys to the left of the diagonal; -1: unbounded
  int right;   // keys to the right of the diagonal, causal folded in; -1: unbounded
  int seqlen_q;
  int seqlen_k;

  // Whether query `row` sees key `col`.
  FLASHLAB_HOST_DEVICE bool visible(int row, int col) const {
    const int diagonal = row + offset;
    return col < seqlen_k && (right < 0 || col <= diagonal + right) && (left < 0 || col >= diagonal - left);
  }

  // visible(row, col) as one interval per row: two compares per score in a masked tile.
  FLASHLAB_HOST_DEVICE KeyInterval row_keys(int row) const {
    const int diagonal = row + offset;
    const int high = right < 0 ? seqlen_k - 1 : min_of(seqlen_k - 1, diagonal + right);
    const int low = left < 0 ? 0 : diagonal - left;
    return {low, high};
  }

  // visible(row, col) as one interval per key, the transposed form (the backward's masked tiles,
  // keys as rows): the queries [low, high] that see key `col`, clamped to the rows there are.
  FLASHLAB_HOST_DEVICE QueryInterval col_queries(int col) const {
    if (col >= seqlen_k) return {0, -1};
    const int low = right < 0 ? 0 : max_of(0, col - offset - right);
    const int high = left < 0 ? seqlen_q - 1 : min_of(seqlen_q - 1, col - offset + left);
    return {low, high};
  }

  // The first key that rows from `row_begin` on can see (may exceed seqlen_k when none can).
  FLASHLAB_HOST_DEVICE int first_key(int row_begin) const {
    return left < 0 ? 0 : max_of(0, row_begin + offset - left);
  }
  // One past the last key that rows up to `row_last` (inclusive) can see.
  FLASHLAB_HOST_DEVICE int last_key(int row_last) const {
    return right < 0 ? seqlen_k : min_of(seqlen_k, max_of(0, row_last + offset + right + 1));
  }

  // The queries [first, last) that see at least one key of [key_begin, key_end).
  FLASHLAB_HOST_DEVICE IndexRange visible_queries(int key_begin, int key_end) const {
    IndexRange queries{0, seqlen_q};
    if (right >= 0) queries.first = max_of(queries.first, key_begin - offset - right);
    if (left >= 0) queries.last = min_of(queries.last, key_end - offset + left);
    return queries;
  }

  // Whether every (row, col) of rows [row_begin, row_last] x keys [col_begin, col_end) is
  // visible (the block needs no element-wise mask). Assumes the rows see some key of the block.
  FLASHLAB_HOST_DEVICE bool block_full(int row_begin, int row_last, int col_begin, int col_end) const {
    return col_end <= seqlen_k && (right < 0 || col_end - 1 <= row_begin + offset + right) &&
           (left < 0 || col_begin >= row_last + offset - left);
  }

 private:
  // CUDA's integer min and max in device code (single instructions), std's on the host.
  FLASHLAB_HOST_DEVICE static int min_of(int a, int b) {
#if defined(__CUDA_ARCH__)
    return ::min(a, b);
#else
    return std::min(a, b);
#endif
  }
  FLASHLAB_HOST_DEVICE static int max_of(int a, int b) {
#if defined(__CUDA_ARCH__)
    return ::max(a, b);
#else
    return std::max(a, b);
#endif
  }
};

// The rule of one sequence: `window_right` has causal folded in (Mask::effective_window_right).
FLASHLAB_HOST_DEVICE MaskRule make_mask_rule(bool bottom_right, int window_left, int window_right, int seqlen_q,
                                             int seqlen_k) {
  return {bottom_right ? seqlen_k - seqlen_q : 0, window_left, window_right, seqlen_q, seqlen_k};
}

}  // namespace flashlab
