"""Lab 04, the reference solution (kept out of the student release)."""

from flashlab.schedules import (BlockCoverage, HbmScratch, Range, TensorId, finish_softmax_state,
                                online_softmax_update, start_softmax_state)


def split_kv_decode(mem, head, x, block_cols, num_splits):
    chunk_length = -(-head.seqlen_k // num_splits)  # ceil
    chunks = -(-head.seqlen_k // chunk_length)
    dv = head.head_dim_v
    scratch = HbmScratch(mem.with_data)
    # Row r's partial output of chunk c is row r * chunks + c: a row's chunks are contiguous.
    o_partial = scratch.matrix(TensorId.O_partial, "fp32", head.seqlen_q * chunks, dv)
    lse_partial = scratch.matrix(TensorId.LSE_partial, "fp32", head.seqlen_q, chunks)

    for chunk in range(chunks):  # line 1: each chunk of keys on its own (a block of its own on a GPU)
        chunk_begin, chunk_end = chunk * chunk_length, min(head.seqlen_k, (chunk + 1) * chunk_length)
        for row in range(head.seqlen_q):
            rows = Range(row, 1)
            q = mem.load(x.Q, rows)  # line 2
            state = start_softmax_state(mem, rows, dv)
            first_key, last_key = head.visible_key_range(rows.begin, rows.end)
            first, last = max(first_key, chunk_begin), min(last_key, chunk_end)
            for col_begin in range(first - (first - chunk_begin) % block_cols, last, block_cols):  # line 3
                cols = Range(col_begin, min(block_cols, chunk_end - col_begin))
                coverage = head.coverage(rows.begin, rows.end, cols.begin, cols.end)
                if coverage == BlockCoverage.empty:
                    continue
                k = mem.load(x.K, cols)  # line 4
                v = mem.load(x.V, cols)
                s = mem.matmul_nt(TensorId.S, q, k, head.scale)  # line 5
                if coverage == BlockCoverage.partial or head.modifies_scores():
                    mem.apply_score_mods(s, head)
                online_softmax_update(mem, state, s, v, head)  # line 6
                del s, v, k
            lse = finish_softmax_state(mem, state)  # line 7: O_c and LSE_c
            mem.store(o_partial, Range(row * chunks + chunk, 1), state.o)
            mem.store(lse_partial, rows, Range(chunk, 1), lse)
            del lse, state, q

    for row in range(head.seqlen_q):  # line 8: the log-sum-exp combine, row by row
        rows = Range(row, 1)
        chunk_lse = mem.load(lse_partial, rows, Range(0, chunks))  # line 9: 1 x chunks
        chunk_outputs = mem.load(o_partial, Range(row * chunks, chunks))  # chunks x dv
        combined = start_softmax_state(mem, rows, dv)
        online_softmax_update(mem, combined, chunk_lse, chunk_outputs, head)  # line 10: LSE_c as scores
        lse = finish_softmax_state(mem, combined)  # line 11: O = sum_c exp(LSE_c - LSE) O_c
        mem.store(x.O, rows, combined.o)
        mem.store(x.LSE, rows, lse)
        del lse, combined, chunk_outputs, chunk_lse


def splits_to_fill(batch, heads_kv, seqlen_k, block_cols, sms):
    units = batch * heads_kv
    key_blocks = -(-seqlen_k // block_cols)
    return min(key_blocks, max(1, -(-sms // units)))


def partial_traffic_share(batch, heads_q, heads_kv, seqlen_k, head_dim, num_splits):
    from flashlab import sim
    problem = sim.problem(seqlen_q=1, seqlen_k=seqlen_k, head_dim=head_dim, batch=batch, heads_q=heads_q,
                          heads_kv=heads_kv, dtype="bf16")
    counters = sim.run("split_kv", problem, blocks=(1, 64, num_splits)).counters
    partial = sum(counters["tensors"][t][k] for t in ("O_partial", "LSE_partial") for k in ("read_bytes", "write_bytes"))
    return partial / counters["hbm_bytes"]
