#include "closed_forms.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "algorithms/checked_math.hpp"
#include "algorithms/limits.hpp"
#include "algorithms/run_backward.hpp"

namespace flashlab::sim {

namespace {

// Every count and size below is a product of dimensions: formed in checked arithmetic, so a
// problem whose counts leave int64 is refused (SizeOverflow), never wrapped.
using Count = CheckedInt64;

constexpr std::int64_t kStatBytes = 4;  // m, l, LSE, D are fp32

Count ceil_div(Count a, Count b) { return (a + b - 1) / b; }

// counter += amount, checked like every product here.
void add(std::int64_t& counter, Count amount) { counter = (Count(counter) + amount).value(); }

void add_read(Counters& c, TensorId id, Count elements, Count element_size, Count transfers) {
  TensorTraffic& t = c.tensor[static_cast<int>(id)];
  add(t.hbm_read_elements, elements);
  add(t.hbm_read_bytes, elements * element_size);
  add(c.loads, transfers);
}
void add_write(Counters& c, TensorId id, Count elements, Count element_size, Count transfers) {
  TensorTraffic& t = c.tensor[static_cast<int>(id)];
  add(t.hbm_write_elements, elements);
  add(t.hbm_write_bytes, elements * element_size);
  add(c.stores, transfers);
}

// One head of one sequence, in the papers' letters, with the block-level view of the mask
// (written here from the mask's definition, independently of HeadProblem::coverage).
}  // namespace

struct ClosedFormHead {
  Count nq, nk, d, dv, e;  // e: element bytes of the dtype
  Count grad_kv_bytes;     // element bytes of the dK, dV a backward head writes (fp32 in a GQA group)
  bool adds_key_gradients; // GroupReduction::in_place: dK_j, dV_j added once into the group's accumulator
  Mask mask;
  const BlockSparsity* sparsity = nullptr;
  Count diagonal_shift = 0;  // a ring's block pair: the diagonal moved beyond the alignment's

  ClosedFormHead(const Problem& p, int batch_index, bool grouped, GroupReduction reduction = GroupReduction::fp32_partials)
      : nq(p.seqlen_q_of(batch_index)), nk(p.seqlen_k_of(batch_index)), d(p.head_dim), dv(p.value_dim()),
        e(element_bytes(p.dtype)), grad_kv_bytes(grouped ? kStatBytes : element_bytes(p.dtype)),
        adds_key_gradients(grouped && reduction == GroupReduction::in_place), mask(p.mask),
        sparsity(p.block_sparsity.enabled() ? &p.block_sparsity : nullptr) {}

  // Does block rows [r0, r1) x keys [c0, c1) contain a visible score? Query i sees key j iff
  // i + offset - window_left <= j <= i + offset + right (right = 0 when causal); both bounds
  // grow with i, so the block is visible iff some i in [r0, r1) satisfies both: an interval
  // test. A block sparsity pattern must also keep one of the sparsity blocks the tile overlaps.
  bool visible(Count r0, Count r1, Count c0, Count c1) const {
    const Count offset = (mask.alignment == CausalAlignment::bottom_right ? nk - nq : Count(0)) + diagonal_shift;
    Count low = r0, high = r1 - 1;
    const bool right_bounded = mask.causal || mask.window_right >= 0;
    const Count right = mask.effective_window_right();
    if (right_bounded) low = std::max(low, c0 - offset - right);                             // i + offset + right >= c0
    if (mask.window_left >= 0) high = std::min(high, c1 - 1 - offset + mask.window_left);  // i + offset - left <= c1 - 1
    if (low > high) return false;
    if (sparsity == nullptr) return true;
    for (Count r = r0 / sparsity->block_rows; r <= (r1 - 1) / sparsity->block_rows; r += 1)
      for (Count c = c0 / sparsity->block_cols; c <= (c1 - 1) / sparsity->block_cols; c += 1)
        if (sparsity->kept(static_cast<int>(r.value()), static_cast<int>(c.value()))) return true;
    return false;
  }
};

namespace {

using Head = ClosedFormHead;

// Calls f(begin, size) for each block of `block` rows of a length (the last one shorter).
template <class F>
void for_blocks(Count length, Count block, F f) {
  for (Count begin = 0; begin < length; begin += block) f(begin, std::min(block, length - begin));
}

// ---------------------------------------------------------------------------------------------
// Standard attention (FA1 Algorithm 0; 02_standard_attention.hpp). Tr = ceil(Nq / Br) query
// blocks. Q read once; K and V once per query block (Tr Nk d); S written once and read once
// (Bc >= Nk: whole rows) or twice (row-block form, Tc = ceil(Nk / Bc) > 1: statistics, then P);
// P written and read once; O and LSE written once. Nothing is skipped.
Counters standard_head(const Head& h, const BlockSizes& b) {
  Counters c;
  for_blocks(h.nq, b.block_rows, [&](Count, Count rows) {
    add_read(c, TensorId::Q, rows * h.d, h.e, 1);  // line 1
    for_blocks(h.nk, b.block_cols, [&](Count, Count cols) {
      add_read(c, TensorId::K, cols * h.d, h.e, 1);
      add_write(c, TensorId::S, rows * cols, h.e, 1);
      add_read(c, TensorId::P, rows * cols, h.e, 1);  // line 3
      add_read(c, TensorId::V, cols * h.dv, h.e, 1);
    });
    if (Count(b.block_cols) >= h.nk) {  // line 2, one block holds the row: S_i read once
      add_read(c, TensorId::S, rows * h.nk, h.e, 1);
      add_write(c, TensorId::P, rows * h.nk, h.e, 1);
      add(c.exponentials, rows * h.nk + rows);  // P, log(l)
    } else {  // line 2, row-block form: S_ij read for m, l, then again to write P_ij
      const Count Tc = ceil_div(h.nk, b.block_cols);
      add_read(c, TensorId::S, 2 * rows * h.nk, h.e, 2 * Tc);
      add_write(c, TensorId::P, rows * h.nk, h.e, Tc);
      add(c.exponentials, 2 * rows * h.nk + rows * Tc + rows);  // P twice, the rescales, log(l)
    }
    add_write(c, TensorId::LSE, rows, kStatBytes, 1);
    add_write(c, TensorId::O, rows * h.dv, h.e, 1);  // line 3
  });
  c.matmul_flops = (2 * h.nq * h.nk * (h.d + h.dv)).value();
  return c;
}

// FA1 forward (FA1 Algorithm 1; 03_fa1_forward.hpp). Tc = ceil(Nk / Bc) key blocks. Line 2
// writes O (fp32 accumulator), l, m once; every (j, i) step reads Q_i, O_i (fp32), l_i, m_i and
// writes O_i, l_i, m_i: Q is read Tc times, O read Tc times and written Tc + 1 times (the last
// in the problem's dtype, the others fp32), l and m read Tc and written Tc + 1 times. K and V
// are read once. block_sparse (FA1 Algorithm 5) is the same over the kept blocks only.
Counters fa1_head(const Head& h, const BlockSizes& b, bool skip_empty) {
  Counters c;
  const Count Br = b.block_rows, Bc = b.block_cols;
  for_blocks(h.nq, Br, [&](Count r0, Count rows) {
    Count last = -1;  // the last visited key block of this query block (-1: none)
    for_blocks(h.nk, Bc, [&](Count c0, Count cols) {
      if (!skip_empty || h.visible(r0, r0 + rows, c0, c0 + cols)) last = c0;
    });
    if (last < 0) {  // block-sparse only: the final O = 0, LSE = -inf written at line 3
      add_write(c, TensorId::O, rows * h.dv, h.e, 1);
      add_write(c, TensorId::LSE, rows, kStatBytes, 1);
      return;
    }
    add_write(c, TensorId::O, rows * h.dv, kStatBytes, 1);  // line 2: O, l, m initialised in HBM
    add_write(c, TensorId::l, rows, kStatBytes, 1);
    add_write(c, TensorId::m, rows, kStatBytes, 1);
    for_blocks(h.nk, Bc, [&](Count c0, Count cols) {
      if (skip_empty && !h.visible(r0, r0 + rows, c0, c0 + cols)) return;
      add_read(c, TensorId::Q, rows * h.d, h.e, 1);  // line 8
      add_read(c, TensorId::O, rows * h.dv, kStatBytes, 1);
      add_read(c, TensorId::l, rows, kStatBytes, 1);
      add_read(c, TensorId::m, rows, kStatBytes, 1);
      add(c.matmul_flops, 2 * rows * cols * (h.d + h.dv));
      add(c.exponentials, rows * cols + 2 * rows);  // P~, e^{m_i - m_new}, e^{m~ - m_new}
      add_write(c, TensorId::O, rows * h.dv, c0 == last ? h.e : kStatBytes, 1);  // line 12
      add_write(c, TensorId::l, rows, kStatBytes, 1);                            // line 13
      add_write(c, TensorId::m, rows, kStatBytes, 1);
      if (c0 == last) {
        add_write(c, TensorId::LSE, rows, kStatBytes, 1);
        add(c.exponentials, rows);
      }
    });
  });
  for_blocks(h.nk, Bc, [&](Count c0, Count cols) {  // line 6: K_j, V_j once (when needed)
    bool needed = !skip_empty;
    if (!needed) {
      for_blocks(h.nq, Br, [&](Count r0, Count rows) { needed = needed || h.visible(r0, r0 + rows, c0, c0 + cols); });
    }
    if (!needed) return;
    add_read(c, TensorId::K, cols * h.d, h.e, 1);
    add_read(c, TensorId::V, cols * h.dv, h.e, 1);
  });
  return c;
}

// FA2 forward (FA2 Algorithm 1; 04_fa2_forward.hpp). Per query block (Tr of them): Q_i read
// once, O_i and LSE_i written once; per visible key block: K_j and V_j read. Unmasked, K and V
// are read Tr times in full.
Counters fa2_head(const Head& h, const BlockSizes& b) {
  Counters c;
  for_blocks(h.nq, b.block_rows, [&](Count r0, Count rows) {
    add_read(c, TensorId::Q, rows * h.d, h.e, 1);
    for_blocks(h.nk, b.block_cols, [&](Count c0, Count cols) {
      if (!h.visible(r0, r0 + rows, c0, c0 + cols)) return;  // skipped, not masked
      add_read(c, TensorId::K, cols * h.d, h.e, 1);
      add_read(c, TensorId::V, cols * h.dv, h.e, 1);
      add(c.matmul_flops, 2 * rows * cols * (h.d + h.dv));
      add(c.exponentials, rows * cols + rows);  // P = exp(S - m), rescale exp(m_old - m_new)
    });
    add(c.exponentials, rows);  // log(l) for LSE
    add_write(c, TensorId::O, rows * h.dv, h.e, 1);
    add_write(c, TensorId::LSE, rows, kStatBytes, 1);
  });
  return c;
}

// dQ accumulated in fp32 (in place when the dtype is fp32): zeroed first, converted at the end.
void dq_initialise_and_convert(Counters& c, const Head& h, Count Br) {
  for_blocks(h.nq, Br, [&](Count, Count rows) {
    add_write(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
    if (h.e != kStatBytes) {
      add_read(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
      add_write(c, TensorId::dQ, rows * h.d, h.e, 1);
    }
  });
}

// FA1 backward (FA1 Algorithm 4; 06_fa1_backward.hpp). Every (j, i) step reads Q_i, O_i, dO_i,
// dQ_i (fp32), l_i, m_i and writes dQ_i; K_j, V_j read once, dK_j, dV_j written twice (zeroed
// at line 5, written at line 24; added once into the group's accumulator with in_place). Nothing
// is skipped.
Counters fa1_backward_head(const Head& h, const BlockSizes& b) {
  Counters c;
  dq_initialise_and_convert(c, h, b.block_rows);
  for_blocks(h.nk, b.block_cols, [&](Count, Count cols) {
    const Count writes = h.adds_key_gradients ? 1 : 2;
    add_write(c, TensorId::dK, writes * cols * h.d, h.grad_kv_bytes, writes);
    add_write(c, TensorId::dV, writes * cols * h.dv, h.grad_kv_bytes, writes);
    add_read(c, TensorId::K, cols * h.d, h.e, 1);
    add_read(c, TensorId::V, cols * h.dv, h.e, 1);
    for_blocks(h.nq, b.block_rows, [&](Count, Count rows) {
      add_read(c, TensorId::Q, rows * h.d, h.e, 1);
      add_read(c, TensorId::O, rows * h.dv, h.e, 1);
      add_read(c, TensorId::dO, rows * h.dv, h.e, 1);
      add_read(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
      add_read(c, TensorId::l, rows, kStatBytes, 1);
      add_read(c, TensorId::m, rows, kStatBytes, 1);
      add_write(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
      add(c.matmul_flops, 2 * rows * cols * (3 * h.d + 2 * h.dv));
      add(c.exponentials, rows * cols);
    });
  });
  return c;
}

// FA2 backward (FA2 Algorithm 2; 07_fa2_backward.hpp). D = rowsum(dO * O) once (dO, O read,
// D written); per key block with a visible query block: K_j, V_j read once, dK_j, dV_j written
// once; per visible (j, i): Q_i, dO_i, LSE_i, D_i read and dQ_i (fp32) read and written. A key
// block no query sees writes dK_j = dV_j = 0 without loading anything (in_place: adds nothing).
// The atomic variant (fa2_backward_atomic) adds into dQ_i at L2 with atomics: the write stays,
// the read goes.
Counters fa2_backward_head(const Head& h, const BlockSizes& b, bool atomic_dq) {
  Counters c;
  dq_initialise_and_convert(c, h, b.block_rows);
  for_blocks(h.nq, b.block_rows, [&](Count, Count rows) {
    add_read(c, TensorId::dO, rows * h.dv, h.e, 1);
    add_read(c, TensorId::O, rows * h.dv, h.e, 1);
    add_write(c, TensorId::D, rows, kStatBytes, 1);
  });
  for_blocks(h.nk, b.block_cols, [&](Count c0, Count cols) {
    bool any = false;
    for_blocks(h.nq, b.block_rows, [&](Count r0, Count rows) {
      if (!h.visible(r0, r0 + rows, c0, c0 + cols)) return;
      any = true;
      add_read(c, TensorId::Q, rows * h.d, h.e, 1);
      add_read(c, TensorId::dO, rows * h.dv, h.e, 1);
      add_read(c, TensorId::LSE, rows, kStatBytes, 1);
      add_read(c, TensorId::D, rows, kStatBytes, 1);
      if (!atomic_dq) add_read(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
      add_write(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
      add(c.matmul_flops, 2 * rows * cols * (3 * h.d + 2 * h.dv));
      add(c.exponentials, rows * cols);
    });
    if (any) {
      add_read(c, TensorId::K, cols * h.d, h.e, 1);
      add_read(c, TensorId::V, cols * h.dv, h.e, 1);
    }
    if (any || !h.adds_key_gradients) {
      add_write(c, TensorId::dK, cols * h.d, h.grad_kv_bytes, 1);
      add_write(c, TensorId::dV, cols * h.dv, h.grad_kv_bytes, 1);
    }
  });
  return c;
}

// Standard backward (FA1 Algorithm 3; 05_standard_backward.hpp): P read twice (line 1 by
// blocks, line 3 by rows), dP written and read once, dS written once and read twice (lines 4
// and 5); dO read once per key block (line 1) and once more (line 2); V and K re-read once per
// query block, Q once per key block.
Counters standard_backward_head(const Head& h, const BlockSizes& b) {
  Counters c;
  const Count Tr = ceil_div(h.nq, b.block_rows), Tc = ceil_div(h.nk, b.block_cols);
  const Count nn = h.nq * h.nk;
  add_read(c, TensorId::P, nn, h.e, Tr * Tc);  // line 1
  add_read(c, TensorId::dO, Tc * h.nq * h.dv, h.e, Tr * Tc);
  add_write(c, TensorId::dV, h.nk * h.dv, h.grad_kv_bytes, Tc);
  add_read(c, TensorId::dO, h.nq * h.dv, h.e, Tr);  // line 2
  add_read(c, TensorId::V, Tr * h.nk * h.dv, h.e, Tr * Tc);
  add_write(c, TensorId::dP, nn, h.e, Tr * Tc);
  if (Tc == 1) {  // line 3, one block holds the row: P_i, dP_i read once
    add_read(c, TensorId::P, nn, h.e, Tr);
    add_read(c, TensorId::dP, nn, h.e, Tr);
    add_write(c, TensorId::dS, nn, h.e, Tr);
  } else {  // line 3, row-block form: P_ij, dP_ij read for D_i, then again to write dS_ij
    add_read(c, TensorId::P, 2 * nn, h.e, 2 * Tr * Tc);
    add_read(c, TensorId::dP, 2 * nn, h.e, 2 * Tr * Tc);
    add_write(c, TensorId::dS, nn, h.e, Tr * Tc);
  }
  add_read(c, TensorId::dS, 2 * nn, h.e, 2 * Tr * Tc);  // lines 4 and 5
  add_read(c, TensorId::K, Tr * h.nk * h.d, h.e, Tr * Tc);
  add_write(c, TensorId::dQ, h.nq * h.d, h.e, Tr);
  add_read(c, TensorId::Q, Tc * h.nq * h.d, h.e, Tr * Tc);
  add_write(c, TensorId::dK, h.nk * h.d, h.grad_kv_bytes, Tc);
  c.matmul_flops = (2 * nn * (2 * h.d + 2 * h.dv)).value();
  return c;
}

// Split-KV decoding (08_split_kv_decode.hpp): C chunks of L = ceil(Nk / splits) keys. Phase 1 is
// FA2 restricted to each chunk (Q read C times; K, V once per query block over the visible
// blocks; partial O and LSE written in fp32); phase 2 reads them back once per row and writes
// O and LSE. With GQA/MQA the query heads of a KV head are packed: the K, V reads are those of
// one head, made once per KV head (part kv_per_kv_head); everything else once per query head
// (part per_query_head).
// A paged cache of P-token pages: each K, V block read [c0, c0 + cols) first reads the int32 ids of
// pages floor(c0 / P) .. floor((c0 + cols - 1) / P); whole-page reads add those pages' rows before
// c0 and from c0 + cols to the end of the last page, for K and for V (one transfer per side).
enum class SplitKvPart { per_query_head, kv_per_kv_head };
void paged_block_reads(Counters& c, const Head& h, const PagedKvCache& cache, Count c0, Count cols) {
  if (!cache.paged()) return;
  const Count P = cache.page_size, first = c0 / P, last = (c0 + cols - 1) / P;
  add_read(c, TensorId::page_table, last - first + 1, 4, 1);  // int32 page ids
  if (cache.reads != PageReads::whole_pages) return;
  for (const Count rest : {c0 - first * P, (last + 1) * P - (c0 + cols)}) {
    if (rest == 0) continue;
    add_read(c, TensorId::K, rest * h.d, h.e, 1);
    add_read(c, TensorId::V, rest * h.dv, h.e, 1);
  }
}
Counters split_kv_head(const Head& h, const BlockSizes& b, SplitKvPart part, const PagedKvCache& cache = {}) {
  Counters c;
  const bool kv = part == SplitKvPart::kv_per_kv_head;
  const Count splits = b.num_splits > 0 ? b.num_splits : 4;
  const Count length = ceil_div(h.nk, splits), chunks = ceil_div(h.nk, length);
  for (Count chunk = 0; chunk < chunks; chunk += 1) {
    const Count begin = chunk * length, end = std::min(h.nk, begin + length);
    for_blocks(h.nq, b.block_rows, [&](Count r0, Count rows) {
      if (!kv) add_read(c, TensorId::Q, rows * h.d, h.e, 1);
      for (Count c0 = begin; c0 < end; c0 += b.block_cols) {
        const Count cols = std::min<Count>(b.block_cols, end - c0);
        if (!h.visible(r0, r0 + rows, c0, c0 + cols)) continue;
        if (kv) {
          paged_block_reads(c, h, cache, c0, cols);
          add_read(c, TensorId::K, cols * h.d, h.e, 1);
          add_read(c, TensorId::V, cols * h.dv, h.e, 1);
        } else {
          add(c.matmul_flops, 2 * rows * cols * (h.d + h.dv));
          add(c.exponentials, rows * cols + rows);
        }
      }
      if (kv) return;
      add(c.exponentials, rows);
      add_write(c, TensorId::O_partial, rows * h.dv, kStatBytes, 1);
      add_write(c, TensorId::LSE_partial, rows, kStatBytes, 1);
    });
  }
  if (kv) return c;
  add_read(c, TensorId::LSE_partial, h.nq * chunks, kStatBytes, h.nq);  // phase 2, row by row
  add_read(c, TensorId::O_partial, h.nq * chunks * h.dv, kStatBytes, h.nq);
  add_write(c, TensorId::O, h.nq * h.dv, h.e, h.nq);
  add_write(c, TensorId::LSE, h.nq, kStatBytes, h.nq);
  add(c.matmul_flops, 2 * h.nq * chunks * h.dv);
  add(c.exponentials, h.nq * (chunks + 2));
  return c;
}

// Memory-efficient attention (Rabe and Staats; 10_memory_efficient.hpp). Per query chunk i and
// key chunk j: K_j, V_j read, the summary (values r x dv, l, m; fp32) written; the combine reads
// m twice and l and values once. Nothing is skipped.
Counters memory_efficient_head(const Head& h, const BlockSizes& b) {
  Counters c;
  for_blocks(h.nq, b.block_rows, [&](Count, Count rows) {
    add_read(c, TensorId::Q, rows * h.d, h.e, 1);
    for_blocks(h.nk, b.block_cols, [&](Count, Count cols) {
      add_read(c, TensorId::K, cols * h.d, h.e, 1);
      add_read(c, TensorId::V, cols * h.dv, h.e, 1);
      add_write(c, TensorId::O_partial, rows * h.dv, kStatBytes, 1);
      add_write(c, TensorId::l, rows, kStatBytes, 1);
      add_write(c, TensorId::m, rows, kStatBytes, 1);
      add_read(c, TensorId::m, 2 * rows, kStatBytes, 2);
      add_read(c, TensorId::l, rows, kStatBytes, 1);
      add_read(c, TensorId::O_partial, rows * h.dv, kStatBytes, 1);
      add(c.matmul_flops, 2 * rows * cols * (h.d + h.dv));
      add(c.exponentials, rows * cols + rows);
    });
    add(c.exponentials, rows);
    add_write(c, TensorId::O, rows * h.dv, h.e, 1);
    add_write(c, TensorId::LSE, rows, kStatBytes, 1);
  });
  return c;
}

// Square tiling (Saha and Ye, Algorithm 1; 11_square_tiling.hpp), tile side B. Phase 1: for
// every tile (i, j) and slice t of d, Q_{i,t} and K_{j,t} read: Q read Tk times, K read Tq times
// in full; A written once; l and LSE once. Phase 2: for every output tile (i, c): A_ij and
// V_{j,c} read (A read ceil(dv / B) times, V Tq times), l_i read, O_ic written.
Counters square_tiling_head(const Head& h, const BlockSizes& b) {
  Counters c;
  const Count B = b.block_rows;
  const Count Tq = ceil_div(h.nq, B), Tk = ceil_div(h.nk, B), Td = ceil_div(h.d, B), Tv = ceil_div(h.dv, B);
  add_read(c, TensorId::Q, Tk * h.nq * h.d, h.e, Tq * Tk * Td);
  add_read(c, TensorId::K, Tq * h.nk * h.d, h.e, Tq * Tk * Td);
  add_write(c, TensorId::A, h.nq * h.nk, h.e, Tq * Tk);
  add_write(c, TensorId::l, h.nq, kStatBytes, Tq);
  add_write(c, TensorId::LSE, h.nq, kStatBytes, Tq);
  add_read(c, TensorId::A, Tv * h.nq * h.nk, h.e, Tq * Tv * Tk);
  add_read(c, TensorId::V, Tq * h.nk * h.dv, h.e, Tq * Tv * Tk);
  add_read(c, TensorId::l, Tv * h.nq, kStatBytes, Tq * Tv);
  add_write(c, TensorId::O, h.nq * h.dv, h.e, Tq * Tv);
  c.matmul_flops = (2 * h.nq * h.nk * (h.d + h.dv)).value();
  c.exponentials = (h.nq * h.nk + h.nq).value();
  return c;
}

// The GQA/MQA reduction of one backward group (run_backward.hpp, GroupReduction::fp32_partials):
// g fp32 parts of dK and dV read, their sum written in the problem's dtype, by blocks of rows
// that fit the SRAM.
Counters group_partials_sum(const Head& h, Count group, Count sram_bytes) {
  Counters c;
  const auto reduce = [&](TensorId id, Count dim) {
    const Count block = group_reduction_block_rows(sram_bytes.value(), static_cast<int>(dim.value()));
    const Count blocks = ceil_div(h.nk, block);
    add_read(c, id, group * h.nk * dim, kStatBytes, group * blocks);
    add_write(c, id, h.nk * dim, h.e, blocks);
  };
  reduce(TensorId::dK, h.d);
  reduce(TensorId::dV, h.dv);
  return c;
}

// GroupReduction::in_place: the group's fp32 accumulators zeroed once, and converted once to the
// dtype (not when the dtype is fp32: accumulated in the output), by the same row blocks.
Counters group_accumulation(const Head& h, Count sram_bytes) {
  Counters c;
  const auto accumulate = [&](TensorId id, Count dim) {
    const Count block = group_reduction_block_rows(sram_bytes.value(), static_cast<int>(dim.value()));
    const Count blocks = ceil_div(h.nk, block);
    add_write(c, id, h.nk * dim, kStatBytes, blocks);
    if (h.e == kStatBytes) return;
    add_read(c, id, h.nk * dim, kStatBytes, blocks);
    add_write(c, id, h.nk * dim, h.e, blocks);
  };
  accumulate(TensorId::dK, h.d);
  accumulate(TensorId::dV, h.dv);
  return c;
}

Count split_kv_chunks(const BlockSizes& b, Count nk) {
  const Count splits = b.num_splits > 0 ? b.num_splits : 4;
  return ceil_div(nk, ceil_div(nk, splits));
}

// The largest tile side b in [1, cap] whose working set fits in M; make(b) builds the blocks.
template <class Make>
BlockSizes largest_fitting(const ScheduleInfo& info, const Problem& p, std::int64_t sram_bytes, std::int64_t cap, Make make) {
  auto fits = [&](std::int64_t b) { return info.working_set_bytes(p, make(b)) <= sram_bytes; };
  if (!fits(1)) {
    throw std::invalid_argument("SRAM size M = " + std::to_string(sram_bytes) + " B is below the smallest working set of '" +
                                info.name + "' (" + std::to_string(info.working_set_bytes(p, make(1))) +
                                " B with 1-row blocks); allowed: M >= that");
  }
  std::int64_t low = 1, high = std::max<std::int64_t>(1, cap);
  while (low < high) {
    const std::int64_t mid = low + (high - low + 1) / 2;
    if (fits(mid)) low = mid; else high = mid - 1;
  }
  return make(low);
}

int narrow(std::int64_t v) { return static_cast<int>(std::min<std::int64_t>(v, kMaxSequenceLength)); }

// ---------------------------------------------------------------------------------------------
// Ring Attention (12_ring_attention.hpp), from its loop structure. The ordering deals the query
// positions and the key positions to P devices; over the P steps device i meets the keys of every
// device j once. For each segment of i's queries and each segment of j's keys (equal strides s),
// the scores the mask leaves visible are a band: query a sees key b iff a + lo <= b <= a + hi.
// Its rows that see a key and the keys they see are one FA2 problem (a block pair), whose O and
// LSE land in the partial buffers and are merged, Br rows at a time, into O_i, LSE_i (fp32).
struct RingSegment {
  std::int64_t first = 0, length = 0, stride = 1;
};

std::vector<RingSegment> ring_segments(RingOrdering ordering, std::int64_t devices, std::int64_t device, std::int64_t n) {
  std::vector<RingSegment> segments;
  const auto cut = [&](std::int64_t part, std::int64_t parts) { return part * n / parts; };
  const auto add = [&](std::int64_t begin, std::int64_t end) {
    if (end > begin) segments.push_back({begin, end - begin, 1});
  };
  if (ordering == RingOrdering::contiguous) {
    add(cut(device, devices), cut(device + 1, devices));
  } else if (ordering == RingOrdering::striped) {
    if (device < n) segments.push_back({device, (n - device + devices - 1) / devices, devices});
  } else {  // zig-zag: chunks device and 2P - 1 - device of 2P
    add(cut(device, 2 * devices), cut(device + 1, 2 * devices));
    add(cut(2 * devices - 1 - device, 2 * devices), cut(2 * devices - device, 2 * devices));
  }
  return segments;
}

std::int64_t floor_div(std::int64_t a, std::int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The block pair of query segment q and key segment k, as a head of its own, or nothing.
std::optional<Head> ring_pair(const Head& h, const RingSegment& q, const RingSegment& k) {
  const std::int64_t offset = h.mask.alignment == CausalAlignment::bottom_right ? (h.nk - h.nq).value() : 0;
  const bool right_bounded = h.mask.causal || h.mask.window_right >= 0, left_bounded = h.mask.window_left >= 0;
  const std::int64_t s = q.stride, delta = q.first - k.first + offset;
  // Positions: query p_q sees key p_k iff p_q + offset - left <= p_k <= p_q + offset + right.
  const std::int64_t hi = right_bounded ? floor_div(delta + h.mask.effective_window_right(), s) : 0;
  const std::int64_t lo = left_bounded ? -floor_div(h.mask.window_left - delta, s) : 0;  // ceil((delta - left) / s)
  if (right_bounded && left_bounded && lo > hi) return std::nullopt;
  const std::int64_t first_row = right_bounded ? std::max<std::int64_t>(0, -hi) : 0;
  const std::int64_t last_row = left_bounded ? std::min(q.length - 1, k.length - 1 - lo) : q.length - 1;
  if (first_row > last_row) return std::nullopt;
  const std::int64_t first_key = left_bounded ? std::max<std::int64_t>(0, first_row + lo) : 0;
  const std::int64_t last_key = right_bounded ? std::min(k.length - 1, last_row + hi) : k.length - 1;
  if (first_key > last_key) return std::nullopt;
  Head pair = h;
  pair.nq = last_row - first_row + 1;
  pair.nk = last_key - first_key + 1;
  pair.mask = Mask{};
  pair.mask.alignment = CausalAlignment::top_left;
  pair.sparsity = nullptr;
  if (right_bounded) {
    pair.mask.window_right = 0;
    pair.mask.window_left = left_bounded ? static_cast<int>(hi - lo) : -1;
    pair.diagonal_shift = first_row + hi - first_key;
  } else if (left_bounded) {
    pair.mask.window_left = 0;
    pair.diagonal_shift = first_row + lo - first_key;
  }
  return pair;
}

// Calls f(pair) for every block pair of a head: every device i, every device j whose keys it
// meets, every segment pair.
template <class F>
void for_ring_pairs(const Head& h, const BlockSizes& b, F f) {
  const RingTiling t = ring_tiling(b);
  for (int i = 0; i < t.devices; ++i)
    for (int j = 0; j < t.devices; ++j)
      for (const RingSegment& q : ring_segments(t.ordering, t.devices, i, h.nq.value()))
        for (const RingSegment& k : ring_segments(t.ordering, t.devices, j, h.nk.value()))
          if (const std::optional<Head> pair = ring_pair(h, q, k)) f(*pair);
}

// Calls f(length) for every segment of a sequence of n (queries or keys): every device's.
template <class F>
void for_ring_segments(const BlockSizes& b, Count n, F f) {
  const RingTiling t = ring_tiling(b);
  for (int i = 0; i < t.devices; ++i)
    for (const RingSegment& segment : ring_segments(t.ordering, t.devices, i, n.value())) f(Count(segment.length));
}

// A traffic moved from one tensor's counters to another's (the pair's O, LSE go to partials).
void relabel(Counters& c, TensorId from, TensorId to) {
  TensorTraffic& source = c.tensor[static_cast<int>(from)];
  TensorTraffic& target = c.tensor[static_cast<int>(to)];
  target.hbm_read_elements += source.hbm_read_elements, target.hbm_write_elements += source.hbm_write_elements;
  target.hbm_read_bytes += source.hbm_read_bytes, target.hbm_write_bytes += source.hbm_write_bytes;
  source = {};
}

// accumulator (fp32) += part (dtype), `block` rows at a time: both read, the accumulator written.
void ring_add(Counters& c, TensorId id, Count rows, Count width, Count e, Count block) {
  for_blocks(rows, block, [&](Count, Count n) {
    add_read(c, id, n * width, kStatBytes, 1);
    add_read(c, id, n * width, e, 1);
    add_write(c, id, n * width, kStatBytes, 1);
  });
}

Counters ring_head(const Head& h, const BlockSizes& b) {
  Counters c;
  const Count Br = b.block_rows;
  for_ring_segments(b, h.nq, [&](Count length) {
    for_blocks(length, Br, [&](Count, Count rows) {  // line 2: O_i = 0 (fp32), LSE_i = -inf
      add_write(c, TensorId::O, rows * h.dv, kStatBytes, 1);
      add_write(c, TensorId::LSE, rows, kStatBytes, 1);
      if (h.e != kStatBytes) {  // line 9: O_i converted to the dtype
        add_read(c, TensorId::O, rows * h.dv, kStatBytes, 1);
        add_write(c, TensorId::O, rows * h.dv, h.e, 1);
      }
    });
  });
  for_ring_pairs(h, b, [&](const Head& pair) {
    Counters attention = fa2_head(pair, b);  // line 6
    relabel(attention, TensorId::O, TensorId::O_partial);
    relabel(attention, TensorId::LSE, TensorId::LSE_partial);
    c += attention;
    for_blocks(pair.nq, Br, [&](Count, Count rows) {  // line 7: the merge
      add_read(c, TensorId::O, rows * h.dv, kStatBytes, 1);
      add_read(c, TensorId::LSE, rows, kStatBytes, 1);
      add_read(c, TensorId::O_partial, rows * h.dv, h.e, 1);
      add_read(c, TensorId::LSE_partial, rows, kStatBytes, 1);
      add_write(c, TensorId::O, rows * h.dv, kStatBytes, 1);
      add_write(c, TensorId::LSE, rows, kStatBytes, 1);
      add(c.exponentials, 3 * rows);  // two weights e^(LSE - m), one log
    });
  });
  return c;
}

Counters ring_backward_head(const Head& h, const BlockSizes& b) {
  Counters c;
  const Count Br = b.block_rows, Bc = b.block_cols;
  for_ring_segments(b, h.nq, [&](Count length) {
    for_blocks(length, Br, [&](Count, Count rows) {  // line 2: dQ_i = 0 (fp32); line 10: converted
      add_write(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
      if (h.e != kStatBytes) {
        add_read(c, TensorId::dQ, rows * h.d, kStatBytes, 1);
        add_write(c, TensorId::dQ, rows * h.d, h.e, 1);
      }
    });
  });
  for_ring_pairs(h, b, [&](Head pair) {
    pair.grad_kv_bytes = h.e;  // the pair's dK, dV as the kernel writes them
    pair.adds_key_gradients = false;
    c += fa2_backward_head(pair, b, false);  // line 6
    ring_add(c, TensorId::dQ, pair.nq, h.d, h.e, Br);  // line 7
    ring_add(c, TensorId::dK, pair.nk, h.d, h.e, Bc);
    ring_add(c, TensorId::dV, pair.nk, h.dv, h.e, Bc);
  });
  return c;
}

// Per KV head: dK_j, dV_j (fp32) zeroed by their owner, and converted there when they are back.
Counters ring_backward_kv_head(const Head& h, const BlockSizes& b) {
  Counters c;
  for_ring_segments(b, h.nk, [&](Count length) {
    for_blocks(length, Count(b.block_cols), [&](Count, Count cols) {
      for (const auto& [id, width] : {std::pair{TensorId::dK, h.d}, std::pair{TensorId::dV, h.dv}}) {
        add_write(c, id, cols * width, kStatBytes, 1);
        if (h.e != kStatBytes) {
          add_read(c, id, cols * width, kStatBytes, 1);
          add_write(c, id, cols * width, h.e, 1);
        }
      }
    });
  });
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The per-schedule oracle, reached through each schedule's registry entry (schedules.cpp).
namespace oracle {

Counters standard_counts(const ClosedFormHead& h, const BlockSizes& b) { return standard_head(h, b); }
Counters fa1_counts(const ClosedFormHead& h, const BlockSizes& b) { return fa1_head(h, b, false); }
Counters fa1_skipping_counts(const ClosedFormHead& h, const BlockSizes& b) { return fa1_head(h, b, true); }
Counters fa2_counts(const ClosedFormHead& h, const BlockSizes& b) { return fa2_head(h, b); }
Counters fa1_backward_counts(const ClosedFormHead& h, const BlockSizes& b) { return fa1_backward_head(h, b); }
Counters fa2_backward_counts(const ClosedFormHead& h, const BlockSizes& b) { return fa2_backward_head(h, b, false); }
Counters fa2_backward_atomic_counts(const ClosedFormHead& h, const BlockSizes& b) { return fa2_backward_head(h, b, true); }
Counters standard_backward_counts(const ClosedFormHead& h, const BlockSizes& b) { return standard_backward_head(h, b); }
Counters split_kv_counts(const ClosedFormHead& h, const BlockSizes& b) { return split_kv_head(h, b, SplitKvPart::per_query_head); }
Counters split_kv_kv_head_counts(const ClosedFormHead& h, const BlockSizes& b, const PagedKvCache& cache) {
  return split_kv_head(h, b, SplitKvPart::kv_per_kv_head, cache);
}
Counters memory_efficient_counts(const ClosedFormHead& h, const BlockSizes& b) { return memory_efficient_head(h, b); }
Counters ring_counts(const ClosedFormHead& h, const BlockSizes& b) { return ring_head(h, b); }
Counters ring_kv_head_counts(const ClosedFormHead&, const BlockSizes&, const PagedKvCache&) { return {}; }
Counters ring_backward_counts(const ClosedFormHead& h, const BlockSizes& b) { return ring_backward_head(h, b); }
Counters ring_backward_kv_head_counts(const ClosedFormHead& h, const BlockSizes& b, const PagedKvCache&) {
  return ring_backward_kv_head(h, b);
}
Counters square_tiling_counts(const ClosedFormHead& h, const BlockSizes& b) { return square_tiling_head(h, b); }

// The cost model of one head (the run limits): tile steps of a shape-only run and the HBM
// scratch a data run allocates, both upper bounds, from the same loops as the counts above.
std::int64_t block_pair_tile_steps(const ClosedFormHead& h, const BlockSizes& b) {
  const Count Tr = ceil_div(h.nq, b.block_rows), Tc = ceil_div(h.nk, b.block_cols);
  return ((Tr + 1) * (Tc + 1)).value();  // the block pairs, and the passes over rows or keys alone
}
std::int64_t split_kv_tile_steps(const ClosedFormHead& h, const BlockSizes& b) {
  // Chunks split key blocks; phase 2 goes row by row.
  const Count Tr = ceil_div(h.nq, b.block_rows), Tc = ceil_div(h.nk, b.block_cols);
  const Count chunks = split_kv_chunks(b, h.nk);
  return (Tr * (Tc + chunks) + h.nq * chunks).value();
}
std::int64_t ring_tile_steps(const ClosedFormHead& h, const BlockSizes& b) {
  // The block pairs partition the visible scores; each query (key) segment meets at most 2P key
  // (query) segments; at most 4 P^2 pairs; the merges, adds, set-up and conversion per row block.
  const Count Tr = ceil_div(h.nq, b.block_rows), Tc = ceil_div(h.nk, b.block_cols), P = ring_tiling(b).devices;
  return (Tr * Tc + 6 * P * Tr + 4 * P * Tc + 24 * P * P + Tr + Tc).value();
}
std::int64_t square_tiling_tile_steps(const ClosedFormHead& h, const BlockSizes& b) {
  // Every (i, j) tile once per slice of d and of dv.
  const Count B = b.block_rows;
  return (ceil_div(h.nq, B) * ceil_div(h.nk, B) * (ceil_div(h.d, B) + ceil_div(h.dv, B))).value();
}

// HBM tensors a schedule allocates beyond its inputs and outputs, in elements (host fp32).
std::int64_t no_scratch(const ClosedFormHead&, const BlockSizes&) { return 0; }
std::int64_t standard_scratch(const ClosedFormHead& h, const BlockSizes&) { return (2 * h.nq * h.nk).value(); }  // S, P
std::int64_t standard_backward_scratch(const ClosedFormHead& h, const BlockSizes&) {
  return (4 * h.nq * h.nk).value();  // P, S, dP, dS
}
std::int64_t square_tiling_scratch(const ClosedFormHead& h, const BlockSizes&) { return (h.nq * h.nk).value(); }  // A
std::int64_t fa1_scratch(const ClosedFormHead& h, const BlockSizes&) { return (h.nq * (h.dv + 2)).value(); }  // O, l, m
std::int64_t fa1_backward_scratch(const ClosedFormHead& h, const BlockSizes&) {
  return (h.nq * (h.d + h.dv + 4)).value();  // dQ; O, l, m
}
std::int64_t fa2_backward_scratch(const ClosedFormHead& h, const BlockSizes&) { return (h.nq * (h.d + 1)).value(); }  // dQ; D
std::int64_t split_kv_scratch(const ClosedFormHead& h, const BlockSizes& b) {  // per-chunk summaries
  return (h.nq * Count(b.num_splits > 0 ? b.num_splits : 4) * (h.dv + 2)).value();
}
std::int64_t ring_scratch(const ClosedFormHead& h, const BlockSizes&) {  // O_i in fp32, a pair's O and LSE
  return (h.nq * (2 * h.dv + 1)).value();
}
std::int64_t ring_backward_scratch(const ClosedFormHead& h, const BlockSizes&) {  // dQ_i, a pair's dQ, its fp32 dQ, D; dK, dV twice
  return (h.nq * (3 * h.d + 1) + 2 * h.nk * (h.d + h.dv)).value();
}
std::int64_t memory_efficient_scratch(const ClosedFormHead& h, const BlockSizes& b) {  // per-chunk summaries
  return (h.nq * ceil_div(h.nk, b.block_cols) * (h.dv + 2)).value();
}

}  // namespace oracle

Counters closed_form(std::string_view schedule, const Problem& problem, const BlockSizes& blocks, std::int64_t sram_bytes,
                     const PagedKvCache& kv_cache, GroupReduction group_reduction) {
  problem.validate();
  kv_cache.validate();
  const ScheduleInfo& info = find_schedule(schedule);
  require_supported(info, problem);
  const bool backward = info.pass == Pass::backward;
  const std::int64_t group = problem.group_size();
  // Every sequence of a dense batch counts the same: one stands for all, so the cost does not
  // grow with the batch.
  const int sequences = problem.varlen() ? problem.batch : 1;
  const std::int64_t copies = problem.varlen() ? 1 : problem.batch;
  Counters total;
  for (int b = 0; b < sequences; ++b) {
    const Head head(problem, b, backward && group > 1, group_reduction);
    Counters sequence = scaled(info.head_counts(head, blocks), problem.heads_q);
    if (info.kv_head_counts != nullptr) sequence += scaled(info.kv_head_counts(head, blocks, kv_cache), problem.heads_kv);
    if (backward && group > 1 && !info.shares_kv_in_group) {
      const Counters combine = group_reduction == GroupReduction::in_place ? group_accumulation(head, sram_bytes)
                                                                           : group_partials_sum(head, group, sram_bytes);
      sequence += scaled(combine, problem.heads_kv);
    }
    total += scaled(sequence, copies);
  }
  return total;
}

std::int64_t tile_steps(std::string_view schedule, const Problem& problem, int batch_index, const BlockSizes& blocks) {
  return find_schedule(schedule).tile_steps(Head(problem, batch_index, false), blocks);
}

std::int64_t scratch_elements(std::string_view schedule, const Problem& problem, int batch_index, const BlockSizes& blocks) {
  return find_schedule(schedule).scratch_elements(Head(problem, batch_index, false), blocks);
}

std::int64_t working_set_bytes(std::string_view schedule, const Problem& problem, const BlockSizes& blocks) {
  return find_schedule(schedule).working_set_bytes(problem, blocks);
}

bool has_paper_block_rule(std::string_view schedule) { return find_schedule(schedule).has_paper_block_rule; }

BlockSizes derive_blocks(std::string_view schedule, const Problem& problem, std::int64_t sram_bytes, BlockRule rule) {
  const ScheduleInfo& info = find_schedule(schedule);
  if (sram_bytes < 1) throw std::invalid_argument("SRAM size M = " + std::to_string(sram_bytes) + " B; allowed: >= 1");
  const std::int64_t d = problem.head_dim;
  const std::int64_t side = info.paper_block_side(sram_elements(sram_bytes, problem.dtype), d);
  const auto make = [&](std::int64_t b) { return info.blocks_of_side(narrow(b), static_cast<int>(d)); };
  if (rule == BlockRule::paper && info.has_paper_block_rule) return make(std::max<std::int64_t>(side, 1));
  return largest_fitting(info, problem, sram_bytes, side, make);
}

}  // namespace flashlab::sim
