"""Lab 03: the backward pass with recomputation, FA2 Algorithm 2 (notebooks/labs/03_backward).

The submission (backward.py) defines fa2_backward(mem, head, x, block_rows, block_cols) on the
tile-memory interface: D = rowsum(dO * O) precomputed, key blocks outer, P recomputed from the
stored LSE, dQ added in an fp32 accumulator in HBM. Graded by the reference-test library's 3x rule
(dQ, dK, dV against the fp64 oracle's, within 3x the naive same-precision backward's error) on odd
shapes and masks, on FA2 backward's closed form for the tiling used, in a bounded SRAM of its
working set, and on keys no query sees (zero gradients, never NaN).
"""

from __future__ import annotations

from ._framework import Check, Failure, Lab, overrun_hints, traffic_differences

BLOCKS = (32, 64)
SHAPES = [(1, 1), (113, 203), (128, 217), (239, 113)]


def _problem(seqlen_q, seqlen_k, **mask):
    from flashlab import sim
    return sim.problem(seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=32, heads_q=2, heads_kv=2, dtype="bf16", **mask)


def _describe(shape, mask):
    return f"seqlen {shape[0]} x {shape[1]}" + (", " + ", ".join(f"{k}={v}" for k, v in mask.items()) if mask else ", no mask")


def _implementation(module):
    """The submission as the reference-test library calls a backward: numpy in, (dq, dk, dv) out."""
    import numpy as np
    from flashlab import schedules

    def run(problem, q, k, v, o, lse, d_o):
        t = schedules.random_tensors(problem, 1, backward=True)
        for name, values in (("Q", q), ("K", k), ("V", v), ("O", o), ("LSE", lse), ("dO", d_o)):
            array = np.ascontiguousarray(values, dtype=np.float32)
            t.assign(getattr(schedules.TensorId, name), array.reshape(array.shape[0], array.shape[1], -1))
        for b in range(problem.batch):
            for h in range(problem.heads_q):
                mem = schedules.DataMemory(problem.dtype, 0)
                module.fa2_backward(mem, problem.head(b, h), schedules.head_tensors(t, problem, b, h), *BLOCKS)
        return np.array(t.dQ), np.array(t.dK), np.array(t.dV)
    return run


def _gradients(cases, hint):
    def run(module):
        from flashlab import _core
        for shape, mask in cases:
            result = _core.testing.check_backward_case(_implementation(module), _problem(*shape, **mask))
            if str(result.status).split(".")[-1] != "passed":
                dq, dk, dv = result.errors
                naive_dv = result.naive_errors[2]
                specific = hint
                if dv <= 3 * naive_dv + 1e-4 and max(dq, dk) > 0:  # dV right: P is right, dS is not
                    specific = ("dV is right, so P is: look at dS = P * (dP - D) with D = rowsum(dO * O) (line 4), "
                                "and the scale in dQ += scale dS K_j and dK += scale dS^T Q_i")
                raise Failure(f"{_describe(shape, mask)}: {result.report}", specific)
    return run


def _traffic(module):
    from flashlab import schedules, sim
    for shape, mask in [((239, 113), {}), ((113, 203), dict(causal=True))]:
        problem = _problem(*shape, **mask)
        got = schedules.run(module.fa2_backward, problem, *BLOCKS, memory="shape").counters["tensors"]
        expected = sim.closed_form("fa2_backward", problem, BLOCKS)["tensors"]
        if got != expected:
            raise Failure(f"{_describe(shape, mask)}, blocks {BLOCKS}: HBM traffic is not FA2 backward's closed form; "
                          + traffic_differences(got, expected),
                          "Algorithm 2: zero dQ (line 3), D from dO and O once (line 4), per key block K_j and V_j once, "
                          "per visible query block Q_i, dO_i, LSE_i, D_i once and dQ_i read and written (line 15), "
                          "dK_j and dV_j written once; dQ converted once at the end")


def _sram(module):
    from flashlab import schedules, sim
    problem = _problem(239, 113)
    sram = sim.working_set_bytes("fa2_backward", problem, BLOCKS)
    try:
        schedules.run(module.fa2_backward, problem, *BLOCKS, memory="shape", sram=sram)
    except schedules.SramOverflow as error:
        raise Failure(f"with M = {sram} bytes, FA2 backward's working set at blocks {BLOCKS}: {str(error).splitlines()[0]}",
                      "hold K_j, V_j, dK_j, dV_j and one query block's tiles; free each query block's (del) before "
                      "the next") from None


def _unseen_keys(module):
    import numpy as np
    from flashlab import schedules
    problem = _problem(40, 200, causal=True, alignment="top_left")  # keys 40..199 seen by no query
    t = schedules.random_tensors(problem, 3, backward=True)
    reference = _implementation(module)
    o = np.zeros_like(np.array(t.Q))
    lse = np.zeros(np.array(t.LSE).shape, dtype=np.float32)
    _, dk, dv = reference(problem, np.array(t.Q), np.array(t.K), np.array(t.V), o, lse, np.array(t.dO))
    tail_k, tail_v = dk[40:], dv[40:]
    if not (np.isfinite(tail_k).all() and np.isfinite(tail_v).all()) or np.abs(tail_k).max() > 0 or np.abs(tail_v).max() > 0:
        raise Failure("causal top-left, 40 queries and 200 keys: the gradients of keys 40..199, which no query sees, "
                      "are not all zero" + (" (NaN: never written)" if not np.isfinite(tail_k).all() else ""),
                      "a key block no query sees still gets dK_j = dV_j = 0 written (FA2 skips its work, not its output)")


LAB = Lab(
    key="03", folder="03_backward", title="the backward pass with recomputation (FA2 Algorithm 2)", submission="backward.py",
    checks=[
        Check("gradients within the 3x rule on odd shapes, no mask", 3, _gradients(
            [(s, {}) for s in SHAPES],
            "P = exp(S - LSE) recomputed; dV += P^T dO; dP = dO V^T; dS = P * (dP - D); dQ += scale dS K; "
            "dK += scale dS^T Q")),
        Check("gradients within the 3x rule under causal masks", 2, _gradients(
            [(s, m) for s in SHAPES[1:] for m in (dict(causal=True), dict(causal=True, alignment="top_left"))],
            "mask the partial blocks (mem.apply_score_mods) before P = exp(S - LSE), as the forward did")),
        Check("HBM traffic equals FA2 backward's closed form for the tiling used", 2, _traffic),
        Check("runs within FA2 backward's working set (a bounded SRAM)", 2, _sram),
        Check("keys no query sees get zero gradients, never NaN", 1, _unseen_keys),
    ],
    error_hints=overrun_hints(),
)
