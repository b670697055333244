"""Lab 04: Flash-Decoding, split-KV with the log-sum-exp combine. Write the three functions marked TODO.

A decoding step has one query row per sequence (a few with speculative decoding) against a long
KV cache: one block of work per (sequence, head) leaves most of a GPU idle, so Flash-Decoding
splits the keys into chunks that run in parallel, each writing a partial output O_c and its LSE_c
(fp32) to HBM, and a second pass combines them: LSE = log sum_c exp(LSE_c), O = sum_c exp(LSE_c -
LSE) O_c. Write it on the tile-memory interface as in lab 02 (online_softmax_update,
start_softmax_state, finish_softmax_state do lines 9-13 of FA2 for you); HbmScratch(mem.with_data)
makes the partials' HBM tensors. Then answer two questions a serving engineer asks.

Grade it:  flashlab-grade 04 decoding.py
"""

from flashlab import sim  # noqa: F401
from flashlab.schedules import (BlockCoverage, HbmScratch, Range, TensorId, finish_softmax_state,  # noqa: F401
                                online_softmax_update, start_softmax_state)


def split_kv_decode(mem, head, x, block_cols, num_splits):
    """One query head. chunk_length = ceil(seqlen_k / num_splits), chunks = ceil(seqlen_k /
    chunk_length). Partials: O_partial, (seqlen_q * chunks) x head_dim_v fp32, row r's chunk c at
    row r * chunks + c; LSE_partial, seqlen_q x chunks fp32.
      for each chunk, for each query row r (Range(r, 1)): load Q_r, start the state, walk the
        chunk's key blocks the row can see (head.visible_key_range clipped to the chunk; blocks of
        block_cols from the chunk's start), S = scale Q K^T (masked where partial), update; finish
        (O_c normalised, LSE_c), store both;
      for each query row: load its chunk LSEs (1 x chunks) and chunk outputs (chunks x dv), and
        combine them with one online_softmax_update (the LSEs as the scores, the outputs as the
        values); finish; store O and LSE."""
    # TODO
    raise NotImplementedError("split_kv_decode")


def splits_to_fill(batch, heads_kv, seqlen_k, block_cols, sms):
    """The smallest number of splits s with batch x heads_kv x s >= sms (every SM busy), but no
    more than the key blocks, ceil(seqlen_k / block_cols), and at least 1."""
    # TODO
    raise NotImplementedError("splits_to_fill")


def partial_traffic_share(batch, heads_q, heads_kv, seqlen_k, head_dim, num_splits):
    """What the split costs: for one decoding step (seqlen_q 1, bf16) the share of split_kv's HBM
    bytes that are the partials, O_partial and LSE_partial, read and written. Ask the simulator:
    sim.run("split_kv", problem, blocks=(1, 64, num_splits)).counters (its "tensors" and
    "hbm_bytes")."""
    # TODO
    raise NotImplementedError("partial_traffic_share")
