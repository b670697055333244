"""Lab 01: softmax three ways and the online softmax. Write the three functions marked TODO.

Each works on FlashLab's tile-memory interface (docs/python_schedules.md): X and Y are matrices in
HBM (HbmMatrix: X.rows, X.cols); `mem` moves tiles between HBM and SRAM (mem.load, mem.store) and
computes on them (mem.row_max, mem.maximum, mem.exp_minus_row, mem.row_sum, mem.add,
mem.exp_difference, mem.scale_rows, mem.divide_rows, mem.vector). Every row of X is softmaxed on
its own; walk the columns in blocks of block_cols, all rows at once. The memory model counts every
element you load: the grader checks how many passes over X you make, as well as the values.

Grade it:  flashlab-grade 01 softmax.py
"""

from flashlab import sim
from flashlab.schedules import Range, TensorId, finish_softmax_state, online_softmax_update, start_softmax_state

NEG_INF = float("-inf")


def column_blocks(X, block_cols):
    """The column blocks of X: Range(begin, size), the last one possibly narrower."""
    for begin in range(0, X.cols, block_cols):
        yield Range(begin, min(block_cols, X.cols - begin))


def unmasked_head(rows, cols):
    """The head online_softmax_update asks for (it reads its dropout: none): `rows` queries, `cols` keys."""
    return sim.problem(seqlen_q=rows, seqlen_k=cols, head_dim=1).head(0, 0)


def softmax_three_pass(mem, X, Y, block_cols):
    """Y = softmax(X) row by row, the safe softmax in three passes over X (Milakov and Gimelshein
    2018, Algorithm 2): m = the row max; d = the sum of exp(x - m); y = exp(x - m) / d."""
    rows = Range(0, X.rows)
    # TODO: m = mem.vector(TensorId.m, rows, NEG_INF); one pass for m, one for d, one to store Y.
    raise NotImplementedError("softmax_three_pass")


def softmax_online(mem, X, Y, block_cols):
    """Y = softmax(X) with the online normalizer (Algorithm 3): the max and the sum in one pass
    (the sum rescaled by exp(m_old - m_new) whenever the max rises), a second pass to store Y."""
    rows = Range(0, X.rows)
    # TODO: the one pass for m and d, then the pass that stores Y.
    raise NotImplementedError("softmax_online")


def softmax_times_values(mem, X, V, Y, block_cols):
    """Y = softmax(X) V in one pass over X and V (FlashAttention's online update): block j of X
    (X.rows x block_cols) meets rows j of V; O stays unnormalised until the last block."""
    rows = Range(0, X.rows)
    # TODO: state = start_softmax_state(mem, rows, V.cols); per block online_softmax_update(mem,
    # state, x, v, unmasked_head(X.rows, X.cols)); finish_softmax_state; store state.o in Y.
    raise NotImplementedError("softmax_times_values")
