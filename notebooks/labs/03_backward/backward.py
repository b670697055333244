"""Lab 03: the backward pass with recomputation, FlashAttention-2's Algorithm 2 (Dao 2023).
Write fa2_backward, marked TODO.

x holds the head's HBM tensors: the inputs Q, K, V, the forward's outputs O and LSE (the
log-sum-exp of each row, what lets you recompute P = exp(S - LSE) without the row max and sum),
the incoming gradient dO, and the outputs dQ, dK, dV to write. As in lab 02, move tiles with
mem.load / mem.store and compute with mem.matmul_nt, mem.exp_minus_row, mem.multiply_add(c, a,
Transpose.yes/no, b, Transpose.yes/no, alpha), mem.row_dot, mem.softmax_backward(TensorId.dS, p, dp,
d_row) (dS = P * (dP - D)), mem.zeros; HbmScratch(mem.with_data).matrix(TensorId.D, "fp32", rows, 1)
makes an HBM tensor of your own (D, and the fp32 accumulator of dQ). The grader checks the
gradients by the 3x rule, the HBM traffic against FA2 backward's closed form, the SRAM of its
working set, and the keys no query sees.

Grade it:  flashlab-grade 03 backward.py
"""

from flashlab.schedules import BlockCoverage, HbmScratch, Range, TensorId, Transpose  # noqa: F401


def fa2_backward(mem, head, x, block_rows, block_cols):
    """Algorithm 2 on one head:
      line 3: dQ = 0 in an fp32 accumulator in HBM (store zero tiles, one per query block);
      line 4: D = rowsum(dO * O) per query block, stored in an fp32 HBM vector;
      line 5: for each key block K_j, V_j (blocks of block_cols keys):
        no query sees it: store dK_j = dV_j = 0 and go on;
        line 6-7: load K_j, V_j; dK_j = dV_j = 0 on chip;
        line 8: for each query block i that sees it (head.coverage, empty blocks skipped):
          line 9: load Q_i, dO_i, LSE_i, D_i;
          line 10-11: S = scale Q_i K_j^T (masked where partial), P = exp(S - LSE_i);
          line 12: dV_j += P^T dO_i;  line 13: dP = dO_i V_j^T;  line 14: dS = P * (dP - D_i);
          line 15: dQ_i += scale dS K_j, read from and written back to the accumulator;
          line 16: dK_j += scale dS^T Q_i;
        line 18: store dK_j, dV_j;
      then dQ converted once: each block of the accumulator loaded and stored to x.dQ."""
    # TODO
    raise NotImplementedError("fa2_backward")
