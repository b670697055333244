"""Standard attention (Dao et al. 2022, FlashAttention, Algorithm 0), written in Python.

The baseline FlashAttention improves on, as algorithms/02_standard_attention.hpp writes it: the
whole score matrix S and probability matrix P round-trip through HBM (tensors the schedule makes
in an HbmScratch), so its HBM traffic grows as N^2 where FA2's grows as N^2 d^2 / M:
  line 1: S = Q K^T, written to HBM,
  line 2: S read back, P = softmax(S), written to HBM (and LSE = m + log(l)); when a row spans
          more than one key block, S is read twice by blocks: the row max and sum, then P,
  line 3: P and V read back, O = P V, written to HBM.
Every block is computed; masked scores are -inf in S. Dropout multiplies P as it is read back in
line 3. Counted on the C++ memory models it counts exactly what the C++ schedule counts
(python/tests/test_schedules.py).
"""

from ..schedules import HbmScratch, Range, TensorId, Transpose


def standard_attention(mem, head, x, block_rows=64, block_cols=64):
    for name, size in (("block_rows", block_rows), ("block_cols", block_cols)):
        if size < 1:
            raise ValueError(f"{name} = {size}; allowed: >= 1")
    Br, Bc = block_rows, block_cols
    scratch = HbmScratch(mem.with_data)
    S = scratch.matrix(TensorId.S, head.dtype, head.seqlen_q, head.seqlen_k)
    P = scratch.matrix(TensorId.P, head.dtype, head.seqlen_q, head.seqlen_k)

    def row_block(begin):
        return Range(begin, min(Br, head.seqlen_q - begin))

    def col_block(begin):
        return Range(begin, min(Bc, head.seqlen_k - begin))

    # Line 1: load Q, K by blocks from HBM, compute S = QK^T (scaled, modified, masked), write S.
    for row_begin in range(0, head.seqlen_q, Br):
        rows = row_block(row_begin)
        mem.mark_line(1)
        q = mem.load(x.Q, rows)
        for col_begin in range(0, head.seqlen_k, Bc):
            cols = col_block(col_begin)
            k = mem.load(x.K, cols)
            s = mem.matmul_nt(TensorId.S, q, k, head.scale)
            mem.apply_score_mods(s, head)
            mem.store(S, rows, cols, s)
            del s, k
        del q

    # Line 2: read S from HBM, compute P = softmax(S) row by row, write P (and LSE).
    for row_begin in range(0, head.seqlen_q, Br):
        rows = row_block(row_begin)
        mem.mark_line(2)
        if Bc >= head.seqlen_k:  # one block holds the whole row: S_i read once
            s = mem.load(S, rows)
            m = mem.row_max(TensorId.m, s)
            p = mem.exp_minus_row(TensorId.P, s, m)  # a fully masked row gives zeros
            l = mem.row_sum(TensorId.l, p)  # noqa: E741 (the paper's name)
            mem.divide_rows(p, l)
            mem.store(P, rows, p)
            lse = mem.log_sum_exp(TensorId.LSE, m, l)
            mem.store(x.LSE, rows, lse)
            del lse, l, p, m, s
            continue
        # Row-block form: the row statistics over the key blocks first (online max and sum) ...
        m = mem.vector(TensorId.m, rows, float("-inf"))
        l = mem.vector(TensorId.l, rows, 0.0)  # noqa: E741 (the paper's name)
        for col_begin in range(0, head.seqlen_k, Bc):
            s = mem.load(S, rows, col_block(col_begin))
            m_new = mem.row_max(TensorId.m, s)
            mem.maximum(m_new, m)
            p = mem.exp_minus_row(TensorId.P, s, m_new)
            rescale = mem.exp_difference(TensorId.m, m, m_new)
            p_row_sum = mem.row_sum(TensorId.l, p)
            mem.scale_rows(l, rescale)
            mem.add(l, p_row_sum)
            m = m_new  # the old m is freed
            del m_new, p_row_sum, rescale, p, s
        # ... then P_ij = exp(S_ij - m) / l, block by block.
        for col_begin in range(0, head.seqlen_k, Bc):
            cols = col_block(col_begin)
            s = mem.load(S, rows, cols)
            p = mem.exp_minus_row(TensorId.P, s, m)
            mem.divide_rows(p, l)
            mem.store(P, rows, cols, p)
            del p, s
        lse = mem.log_sum_exp(TensorId.LSE, m, l)
        mem.store(x.LSE, rows, lse)
        del lse, l, m

    # Line 3: load P and V by blocks from HBM, compute O = PV, write O.
    for row_begin in range(0, head.seqlen_q, Br):
        rows = row_block(row_begin)
        mem.mark_line(3)
        o = mem.zeros(TensorId.O, rows, Range(0, head.head_dim_v))
        for col_begin in range(0, head.seqlen_k, Bc):
            cols = col_block(col_begin)
            p = mem.load(P, rows, cols)
            mem.apply_dropout(p, head)
            v = mem.load(x.V, cols)
            mem.multiply_add(o, p, Transpose.no, v, Transpose.no)
            del v, p
        mem.store(x.O, rows, o)
        del o
    mem.mark_line(4)  # line 4: return O
