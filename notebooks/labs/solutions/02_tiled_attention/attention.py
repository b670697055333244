"""Lab 02, the reference solution (kept out of the student release)."""

from flashlab.schedules import (BlockCoverage, Range, TensorId, Transpose, finish_softmax_state,
                                start_softmax_state)


def online_update(mem, state, s, v, head):
    """FA2 Algorithm 1, lines 9-10: m_new = max(m, rowmax(S)), P = exp(S - m_new),
    l = exp(m - m_new) l + rowsum(P), O = diag(exp(m - m_new)) O + P V."""
    m_new = mem.row_max(TensorId.m, s)
    mem.maximum(m_new, state.m)
    p = mem.exp_minus_row(TensorId.P, s, m_new)
    rescale = mem.exp_difference(TensorId.m, state.m, m_new)
    p_row_sum = mem.row_sum(TensorId.l, p)
    mem.scale_rows(state.l, rescale)
    mem.add(state.l, p_row_sum)
    mem.scale_rows(state.o, rescale)
    mem.multiply_add(state.o, p, Transpose.no, v, Transpose.no)
    state.m = m_new
    mem.note_softmax_state(state.m, state.l, rescale)
    del p_row_sum, rescale, p


def fa2_forward(mem, head, x, block_rows, block_cols):
    Br, Bc = block_rows, block_cols
    for row_begin in range(0, head.seqlen_q, Br):  # line 3
        rows = Range(row_begin, min(Br, head.seqlen_q - row_begin))
        mem.mark_line(4)
        q = mem.load(x.Q, rows)  # line 4
        mem.mark_line(5)
        state = start_softmax_state(mem, rows, head.head_dim_v)  # line 5
        first_key, last_key = head.visible_key_range(rows.begin, rows.end)
        for col_begin in range(first_key // Bc * Bc, last_key, Bc):  # line 6
            cols = Range(col_begin, min(Bc, head.seqlen_k - col_begin))
            coverage = head.coverage(rows.begin, rows.end, cols.begin, cols.end)
            if coverage == BlockCoverage.empty:
                continue
            mem.mark_line(7)
            k = mem.load(x.K, cols)  # line 7
            v = mem.load(x.V, cols)
            mem.mark_line(8)
            s = mem.matmul_nt(TensorId.S, q, k, head.scale)  # line 8
            if coverage == BlockCoverage.partial or head.modifies_scores():
                mem.apply_score_mods(s, head)
            mem.mark_line(9)
            online_update(mem, state, s, v, head)  # lines 9-10
            del s, v, k
        mem.mark_line(12)
        lse = finish_softmax_state(mem, state)  # lines 12-13
        mem.mark_line(14)
        mem.store(x.O, rows, state.o)  # line 14
        mem.store(x.LSE, rows, lse)  # line 15
        del lse, state, q
