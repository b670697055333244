"""Lab 04: Flash-Decoding, split-KV with the log-sum-exp combine (notebooks/labs/04_flash_decoding).

The submission (decoding.py) defines:
  split_kv_decode(mem, head, x, block_cols, num_splits)   one query head of a decoding step: the keys
      in num_splits chunks, each chunk's partial O_c and LSE_c to HBM (fp32), then per query row
      O = sum_c exp(LSE_c - LSE) O_c
  splits_to_fill(batch, heads_kv, seqlen_k, block_cols, sms)   the smallest split count whose
      (sequence, KV head, chunk) units fill `sms` SMs, at most one chunk per key block
  partial_traffic_share(batch, heads_q, heads_kv, seqlen_k, head_dim, num_splits)   the share of
      the simulator's split_kv HBM bytes (bf16, blocks 64 keys) that the partials O_c, LSE_c take
Graded against the oracle, split_kv's closed form, its working set, and numbers the grader
computes itself.
"""

from __future__ import annotations

from ._framework import Check, Failure, Lab, overrun_hints, traffic_differences

BLOCK_COLS = 64
CASES = [(1, 1, 1), (1, 100, 3), (1, 1000, 5), (1, 4097, 8), (3, 700, 4)]  # (seqlen_q, seqlen_k, num_splits)


def _problem(seqlen_q, seqlen_k, **mask):
    from flashlab import sim
    return sim.problem(seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=64, heads_q=2, heads_kv=2, dtype="bf16", **mask)


def _describe(case, mask):
    text = f"seqlen_q {case[0]}, seqlen_k {case[1]}, {case[2]} splits"
    return text + (", " + ", ".join(f"{k}={v}" for k, v in mask.items()) if mask else "")


def _outputs(cases, hint):
    def run(module):
        from flashlab import schedules
        for case, mask in cases:
            problem = _problem(case[0], case[1], **mask)
            result = schedules.run(module.split_kv_decode, problem, BLOCK_COLS, case[2], name="split_kv").check()
            if not result.passed:
                worst = max(result.errors, key=result.errors.get)
                raise Failure(f"{_describe(case, mask)}: max |error| of {worst} = {result.errors[worst]:.3g}; "
                              f"allowed: {result.tolerance:.3g}", hint)
    return run


def _traffic(module):
    from flashlab import schedules, sim
    for case, mask in [((1, 1000, 5), {}), ((3, 700, 4), dict(causal=True))]:
        problem = _problem(case[0], case[1], **mask)
        got = schedules.run(module.split_kv_decode, problem, BLOCK_COLS, case[2], memory="shape").counters["tensors"]
        expected = sim.closed_form("split_kv", problem, (1, BLOCK_COLS, case[2]))["tensors"]
        if got != expected:
            raise Failure(f"{_describe(case, mask)}: HBM traffic is not split-KV's closed form; "
                          + traffic_differences(got, expected),
                          "each chunk reads its own keys once and writes one O_c row and one LSE_c per query row "
                          "(fp32); the combine reads them once and writes O and LSE")


def _sram(module):
    from flashlab import schedules, sim
    problem = _problem(1, 4097)
    sram = sim.working_set_bytes("split_kv", problem, (1, BLOCK_COLS, 8))
    try:
        schedules.run(module.split_kv_decode, problem, BLOCK_COLS, 8, memory="shape", sram=sram)
    except schedules.SramOverflow as error:
        raise Failure(f"with M = {sram} bytes, split-KV's working set: {str(error).splitlines()[0]}",
                      "hold one block of keys at a time, and free each chunk's tiles before the next") from None


def _splits(module):
    for batch, heads_kv, seqlen_k, sms in [(1, 8, 8192, 132), (4, 8, 8192, 132), (1, 1, 300, 132), (16, 8, 4096, 132),
                                           (2, 4, 65536, 108)]:
        key_blocks = -(-seqlen_k // BLOCK_COLS)
        expected = min(key_blocks, max(1, -(-sms // (batch * heads_kv))))
        got = module.splits_to_fill(batch, heads_kv, seqlen_k, BLOCK_COLS, sms)
        if got != expected:
            raise Failure(f"splits_to_fill(batch {batch}, heads_kv {heads_kv}, seqlen_k {seqlen_k}, sms {sms}) = {got}; "
                          f"expected {expected}",
                          "batch x heads_kv units run at once without splits; the smallest s with batch x heads_kv x s "
                          ">= sms fills the GPU, and there are no more chunks than key blocks")


def _share(module):
    from flashlab import sim
    for args in [(1, 32, 8, 8192, 128, 16), (8, 32, 8, 2048, 128, 2)]:
        batch, heads_q, heads_kv, seqlen_k, head_dim, splits = args
        problem = sim.problem(seqlen_q=1, seqlen_k=seqlen_k, head_dim=head_dim, batch=batch, heads_q=heads_q,
                              heads_kv=heads_kv, dtype="bf16")
        counters = sim.run("split_kv", problem, blocks=(1, BLOCK_COLS, splits)).counters
        partial = sum(counters["tensors"].get(t, {}).get(k, 0) for t in ("O_partial", "LSE_partial")
                      for k in ("read_bytes", "write_bytes"))
        expected = partial / counters["hbm_bytes"]
        got = float(module.partial_traffic_share(*args))
        if abs(got - expected) > 1e-6 + 1e-3 * expected:
            raise Failure(f"partial_traffic_share{args} = {got:.6g}; the simulator gives {expected:.6g}",
                          "sim.run('split_kv', problem, blocks=(1, 64, splits)): the O_partial and LSE_partial bytes "
                          "read and written, over hbm_bytes")


LAB = Lab(
    key="04", folder="04_flash_decoding", title="Flash-Decoding: split-KV and the log-sum-exp combine",
    submission="decoding.py",
    checks=[
        Check("split-KV decoding is correct (1 to 8 splits, odd lengths)", 3, _outputs(
            [(c, {}) for c in CASES],
            "each chunk's O_c is normalised by its own l; the combine weighs them by exp(LSE_c - LSE), "
            "LSE the log-sum-exp of the LSE_c (the chunk LSEs are the combine's scores, the O_c its values)")),
        Check("correct under a causal mask and a window", 2, _outputs(
            [(c, m) for c in CASES[2:] for m in (dict(causal=True), dict(window_left=200, window_right=0))],
            "a chunk whose keys the row cannot see contributes nothing: LSE_c = -inf, and the combine must give "
            "it weight 0 (the visible key range of the row, clipped to the chunk)")),
        Check("HBM traffic equals split-KV's closed form", 2, _traffic),
        Check("runs within split-KV's working set (a bounded SRAM)", 1, _sram),
        Check("splits_to_fill: how many splits fill the GPU", 1, _splits),
        Check("partial_traffic_share: what the partials cost, from the simulator", 1, _share),
    ],
    error_hints=overrun_hints("a block overruns the chunk or the sequence: blocks end at min(begin + block, chunk end)"),
)
