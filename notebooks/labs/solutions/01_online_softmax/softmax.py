"""Lab 01, the reference solution (kept out of the student release)."""

from flashlab import sim
from flashlab.schedules import Range, TensorId, finish_softmax_state, online_softmax_update, start_softmax_state

NEG_INF = float("-inf")


def unmasked_head(rows, cols):
    """The head online_softmax_update asks for (it reads its dropout: none): `rows` queries, `cols` keys."""
    return sim.problem(seqlen_q=rows, seqlen_k=cols, head_dim=1).head(0, 0)


def column_blocks(X, block_cols):
    for begin in range(0, X.cols, block_cols):
        yield Range(begin, min(block_cols, X.cols - begin))


def softmax_three_pass(mem, X, Y, block_cols):
    rows = Range(0, X.rows)
    m = mem.vector(TensorId.m, rows, NEG_INF)  # line 1: m_0 = -inf
    for cols in column_blocks(X, block_cols):  # lines 2-3: the max
        x = mem.load(X, rows, cols)
        block_max = mem.row_max(TensorId.m, x)
        mem.maximum(m, block_max)
        del block_max, x
    d = mem.vector(TensorId.l, rows, 0.0)  # line 5: d_0 = 0
    for cols in column_blocks(X, block_cols):  # lines 6-7: the sum
        x = mem.load(X, rows, cols)
        e = mem.exp_minus_row(TensorId.P, x, m)
        block_sum = mem.row_sum(TensorId.l, e)
        mem.add(d, block_sum)
        del block_sum, e, x
    for cols in column_blocks(X, block_cols):  # lines 9-10: normalise
        x = mem.load(X, rows, cols)
        y = mem.exp_minus_row(TensorId.Y, x, m)
        mem.divide_rows(y, d)
        mem.store(Y, rows, cols, y)
        del y, x


def softmax_online(mem, X, Y, block_cols):
    rows = Range(0, X.rows)
    m = mem.vector(TensorId.m, rows, NEG_INF)  # line 1
    d = mem.vector(TensorId.l, rows, 0.0)  # line 2
    for cols in column_blocks(X, block_cols):  # line 3: the one pass
        x = mem.load(X, rows, cols)
        m_new = mem.row_max(TensorId.m, x)
        mem.maximum(m_new, m)  # line 4
        rescale = mem.exp_difference(TensorId.m, m, m_new)
        mem.scale_rows(d, rescale)  # line 5: d = d e^(m - m_new) + sum e^(x - m_new)
        e = mem.exp_minus_row(TensorId.P, x, m_new)
        block_sum = mem.row_sum(TensorId.l, e)
        mem.add(d, block_sum)
        m = m_new
        del block_sum, e, rescale, m_new, x
    for cols in column_blocks(X, block_cols):  # lines 7-8: normalise
        x = mem.load(X, rows, cols)
        y = mem.exp_minus_row(TensorId.Y, x, m)
        mem.divide_rows(y, d)
        mem.store(Y, rows, cols, y)
        del y, x


def softmax_times_values(mem, X, V, Y, block_cols):
    rows = Range(0, X.rows)
    head = unmasked_head(X.rows, X.cols)
    state = start_softmax_state(mem, rows, V.cols)  # m = -inf, l = 0, O = 0
    for cols in column_blocks(X, block_cols):
        x = mem.load(X, rows, cols)
        v = mem.load(V, cols)
        online_softmax_update(mem, state, x, v, head)  # m, l, O rescaled; O += P V
        del v, x
    lse = finish_softmax_state(mem, state)  # O = diag(l)^-1 O
    mem.store(Y, rows, state.o)
    del lse, state
