"""FlashAttention-2 forward pass (Dao 2023, Algorithm 1), written in Python.

The same schedule as algorithms/04_fa2_forward.hpp, line for line: query blocks Q_i outer; O_i and
the softmax state (m, l) stay on chip for the whole inner loop over key/value blocks; O_i is
normalised once at the end. Key blocks the mask hides entirely are skipped, not masked. Run on
the C++ memory models it counts exactly what the C++ schedule counts (python/tests/test_schedules.py
holds it to that), and its trace replays in the visualizer with FA2's pseudocode:

    from flashlab import schedules
    from flashlab.examples.fa2_forward import fa2_forward

    run = schedules.run(fa2_forward, problem, block_rows=64, block_cols=64, memory="shape")
    trace = schedules.trace(fa2_forward, problem, block_rows=32, block_cols=32, name="fa2")

Tiles are freed (``del``) where the C++ tiles leave their scope, last made first, so that the SRAM
in use, its peak and the trace's free events are the C++ schedule's too.
"""

from ..schedules import (
    BlockCoverage,
    Range,
    TensorId,
    Transpose,
    finish_softmax_state,
    online_softmax_update,
    start_softmax_state,
)


def fa2_forward(mem, head, x, block_rows=64, block_cols=64, update=online_softmax_update):
    """FA2 Algorithm 1 on one head. ``update`` folds a score tile into the state (lines 9-10): the
    C++ helper by default, or ``online_softmax_update_in_python`` below, the same steps by hand."""
    for name, size in (("block_rows", block_rows), ("block_cols", block_cols)):
        if size < 1:
            raise ValueError(f"{name} = {size}; allowed: >= 1")
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
                continue  # skipped, not masked
            mem.mark_line(7)
            k = mem.load(x.K, cols)  # line 7
            v = mem.load(x.V, cols)
            mem.mark_line(8)
            s = mem.matmul_nt(TensorId.S, q, k, head.scale)  # line 8
            if coverage == BlockCoverage.partial or head.modifies_scores():
                mem.apply_score_mods(s, head)
            mem.mark_line(9)
            update(mem, state, s, v, head)  # lines 9-10
            del s, v, k
        mem.mark_line(12)
        lse = finish_softmax_state(mem, state)  # lines 12-13
        mem.mark_line(14)
        mem.store(x.O, rows, state.o)  # line 14
        mem.store(x.LSE, rows, lse)  # line 15
        del lse, state, q


def online_softmax_update_in_python(mem, state, s, v, head):
    """FA2 Algorithm 1, lines 9-10, as algorithms/online_softmax.hpp writes them:
    m_new = max(m, rowmax(S)), P = exp(S - m_new), l = exp(m - m_new) l + rowsum(P),
    o = diag(exp(m - m_new)) o + P V. Dropout drops from P after its row sum."""
    m_new = mem.row_max(TensorId.m, s)
    mem.maximum(m_new, state.m)
    p = mem.exp_minus_row(TensorId.P, s, m_new)
    rescale = mem.exp_difference(TensorId.m, state.m, m_new)
    p_row_sum = mem.row_sum(TensorId.l, p)
    mem.scale_rows(state.l, rescale)
    mem.add(state.l, p_row_sum)
    mem.apply_dropout(p, head)
    mem.scale_rows(state.o, rescale)
    mem.multiply_add(state.o, p, Transpose.no, v, Transpose.no)
    state.m = m_new  # moves m_new into the state; the old m is freed
    mem.note_softmax_state(state.m, state.l, rescale)
    del p_row_sum, rescale, p
