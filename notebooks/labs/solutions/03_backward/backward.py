"""Lab 03, the reference solution (kept out of the student release)."""

from flashlab.schedules import BlockCoverage, HbmScratch, Range, TensorId, Transpose


def fa2_backward(mem, head, x, block_rows, block_cols):
    Br, Bc = block_rows, block_cols
    d, dv = head.head_dim, head.head_dim_v
    row_blocks = [Range(b, min(Br, head.seqlen_q - b)) for b in range(0, head.seqlen_q, Br)]
    scratch = HbmScratch(mem.with_data)

    mem.mark_line(3)  # line 3: dQ = 0, in an fp32 accumulator in HBM
    dq_accumulator = scratch.matrix(TensorId.dQ, "fp32", head.seqlen_q, d)
    for rows in row_blocks:
        zeros = mem.zeros(TensorId.dQ, rows, Range(0, d))
        mem.store(dq_accumulator, rows, zeros)
        del zeros

    mem.mark_line(4)  # line 4: D = rowsum(dO * O)
    D = scratch.matrix(TensorId.D, "fp32", head.seqlen_q, 1)
    for rows in row_blocks:
        d_out = mem.load(x.dO, rows)
        o = mem.load(x.O, rows)
        d_row = mem.row_dot(TensorId.D, d_out, o)
        mem.store(D, rows, d_row)
        del d_row, o, d_out

    for col_begin in range(0, head.seqlen_k, Bc):  # line 5
        cols = Range(col_begin, min(Bc, head.seqlen_k - col_begin))
        visible = []
        for rows in row_blocks:
            coverage = head.coverage(rows.begin, rows.end, cols.begin, cols.end)
            if coverage != BlockCoverage.empty:
                visible.append((rows, coverage == BlockCoverage.partial))
        if not visible:  # no query sees these keys: their gradients are zero
            mem.mark_line(18)
            for target, width in ((x.dK, d), (x.dV, dv)):
                zeros = mem.zeros(target.id, cols, Range(0, width))
                mem.store(target, cols, zeros)
                del zeros
            continue
        mem.mark_line(6)
        k = mem.load(x.K, cols)  # line 6
        v = mem.load(x.V, cols)
        mem.mark_line(7)
        dk = mem.zeros(TensorId.dK, cols, Range(0, d))  # line 7
        dvt = mem.zeros(TensorId.dV, cols, Range(0, dv))
        for rows, partial in visible:  # line 8
            mem.mark_line(9)
            q = mem.load(x.Q, rows)
            d_out = mem.load(x.dO, rows)
            lse = mem.load(x.LSE, rows)
            d_row = mem.load(D, rows)
            mem.mark_line(10)
            s = mem.matmul_nt(TensorId.S, q, k, head.scale)  # line 10
            if partial or head.modifies_scores():
                mem.apply_score_mods(s, head)
            mem.mark_line(11)
            p = mem.exp_minus_row(TensorId.P, s, lse)  # line 11: P = exp(S - L)
            mem.mark_line(12)
            mem.multiply_add(dvt, p, Transpose.yes, d_out, Transpose.no)  # line 12: dV_j += P^T dO_i
            mem.mark_line(13)
            dp = mem.matmul_nt(TensorId.dP, d_out, v)  # line 13: dP = dO_i V_j^T
            mem.mark_line(14)
            ds = mem.softmax_backward(TensorId.dS, p, dp, d_row)  # line 14: dS = P * (dP - D_i)
            mem.mark_line(15)  # line 15: dQ_i += scale dS K_j, read-modify-write in HBM
            dq = mem.load(dq_accumulator, rows)
            mem.multiply_add(dq, ds, Transpose.no, k, Transpose.no, head.scale)
            mem.store(dq_accumulator, rows, dq)
            mem.mark_line(16)
            mem.multiply_add(dk, ds, Transpose.yes, q, Transpose.no, head.scale)  # line 16: dK_j += scale dS^T Q_i
            del dq, ds, dp, p, s, d_row, lse, d_out, q
        mem.mark_line(18)
        mem.store(x.dK, cols, dk)  # line 18
        mem.store(x.dV, cols, dvt)
        del dvt, dk, v, k

    mem.mark_line(20)  # dQ rounded once to the output's dtype
    for rows in row_blocks:
        block = mem.load(dq_accumulator, rows)
        mem.store(x.dQ, rows, block)
        del block
