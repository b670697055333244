"""Lab 02: tiled attention, FlashAttention-2's forward pass as a schedule (Dao 2023, Algorithm 1).
Write the two functions marked TODO.

A schedule is a function of one (sequence, query head): `head` is the HeadProblem (seqlen_q,
seqlen_k, head_dim, head_dim_v, scale, and the mask: head.visible_key_range, head.coverage,
head.modifies_scores), `x` the head's HBM tensors (x.Q, x.K, x.V, x.O, x.LSE). Move tiles with
mem.load / mem.store and compute with mem.matmul_nt, mem.row_max, mem.maximum, mem.exp_minus_row,
mem.exp_difference, mem.row_sum, mem.scale_rows, mem.add, mem.multiply_add,
mem.apply_score_mods; mem.mark_line(n) tells the visualizer which line of Algorithm 1 you are at.
See docs/python_schedules.md. The grader runs it on odd shapes and masks against an oracle, in an
SRAM of FA2's working set, and holds its HBM traffic to FA2's closed form.

Grade it:  flashlab-grade 02 attention.py
Watch it:  schedules.trace(fa2_forward, problem, block_rows=32, block_cols=32, name="fa2", path="my.trace")
           then flashlab_viz --trace my.trace
"""

from flashlab.schedules import (BlockCoverage, Range, TensorId, Transpose, finish_softmax_state,
                                start_softmax_state)


def online_update(mem, state, s, v, head):
    """Lines 9-10: fold the score tile s (and its values v) into the state (state.m, state.l,
    state.o): m_new = max(m, rowmax(S)), P = exp(S - m_new), l = exp(m - m_new) l + rowsum(P),
    O = diag(exp(m - m_new)) O + P V; then state.m = m_new."""
    # TODO
    raise NotImplementedError("online_update")


def fa2_forward(mem, head, x, block_rows, block_cols):
    """Algorithm 1: for each query block Q_i (line 3) load it (4) and start the state (5); for each
    key block K_j, V_j that the mask does not hide entirely (6) load them (7), S = scale Q_i K_j^T
    (8), mask the partial blocks, online_update (9-10); then LSE = finish_softmax_state (12-13),
    store O_i (14) and LSE_i (15). Free tiles (del) where a block's work ends."""
    # TODO
    raise NotImplementedError("fa2_forward")
