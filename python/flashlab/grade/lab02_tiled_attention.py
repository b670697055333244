"""Lab 02: tiled attention, FlashAttention-2's forward as a schedule (notebooks/labs/02_tiled_attention).

The submission (attention.py) defines, on the tile-memory interface (flashlab.schedules):
  online_update(mem, state, s, v, head)                FA2 Algorithm 1, lines 9-10
  fa2_forward(mem, head, x, block_rows, block_cols)    FA2 Algorithm 1, the whole of it
Graded on the official odd shapes and masks against the double-precision oracle (the simulator's
tolerance), in a bounded SRAM arena of the schedule's own working set, on the HBM traffic its
closed form gives for the tiling used, and on a trace the visualizer replays.
"""

from __future__ import annotations

from ._framework import Check, Failure, Lab, overrun_hints, traffic_differences

BLOCKS = (32, 64)  # block_rows, block_cols: neither divides most of the shapes
SHAPES = [(1, 1), (113, 203), (128, 217), (239, 113), (256, 256)]  # (seqlen_q, seqlen_k), odd shapes
MASKS = [dict(causal=True), dict(causal=True, alignment="top_left"), dict(window_left=48, window_right=16)]


def _problem(seqlen_q, seqlen_k, head_dim=32, **mask):
    from flashlab import sim
    return sim.problem(seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim, batch=1, heads_q=2, heads_kv=1,
                       dtype="bf16", **mask)


def _describe(problem_args, mask):
    text = f"seqlen {problem_args[0]} x {problem_args[1]}"
    return text + (", " + ", ".join(f"{k}={v}" for k, v in mask.items()) if mask else ", no mask")


def _run(module, problem, **options):
    from flashlab import schedules
    return schedules.run(module.fa2_forward, problem, block_rows=BLOCKS[0], block_cols=BLOCKS[1], name="fa2", **options)


def _check_outputs(module, cases, hint):
    for shape, mask in cases:
        problem = _problem(*shape, **mask)
        result = _run(module, problem).check()
        if not result.passed:
            worst = max(result.errors, key=result.errors.get)
            raise Failure(f"{_describe(shape, mask)}: max |error| of {worst} = {result.errors[worst]:.3g}; "
                          f"allowed: {result.tolerance:.3g} (O and LSE against the oracle)", hint(shape, mask, result))


def _no_mask(module):
    def hint(shape, mask, result):
        if result.errors.get("O", 0) > 0.1:
            return ("when the running max rises from m to m_new, O and l were summed against m: multiply both by "
                    "exp(m - m_new) before adding the block's P V and row sum, and divide O by l once, at the end")
        return "LSE = m + log(l), stored per row with O"
    _check_outputs(module, [(shape, {}) for shape in SHAPES], hint)


def _masks(module):
    def hint(shape, mask, result):
        return ("a mask off by one: with causal bottom-right alignment query i sees keys j <= i + seqlen_k - seqlen_q "
                "(top-left: j <= i); let head.coverage classify each block and mem.apply_score_mods mask the "
                "partial ones")
    _check_outputs(module, [(shape, mask) for shape in SHAPES[1:] for mask in MASKS], hint)


def _traffic(module):
    from flashlab import sim
    for shape, mask in [((239, 113), {}), ((113, 203), dict(causal=True)), ((256, 256), dict(window_left=48, window_right=16))]:
        problem = _problem(*shape, **mask)
        run = _run(module, problem, memory="shape")
        expected = sim.closed_form("fa2", problem, BLOCKS)["tensors"]
        got = run.counters["tensors"]
        if got != expected:
            raise Failure(f"{_describe(shape, mask)}, blocks {BLOCKS}: HBM traffic is not FA2's closed form; "
                          + traffic_differences(got, expected),
                          "FA2 reads Q_i once per query block, K_j and V_j once per visible block pair, and writes O_i "
                          "and LSE_i once; blocks the mask hides entirely are skipped, never loaded")


def _sram(module):
    from flashlab import schedules, sim
    for shape, mask in [((239, 113), {}), ((256, 256), dict(causal=True))]:
        problem = _problem(*shape, **mask)
        sram = sim.working_set_bytes("fa2", problem, BLOCKS)
        try:
            _run(module, problem, memory="shape", sram=sram)
        except schedules.SramOverflow as error:
            raise Failure(f"{_describe(shape, mask)}: with M = {sram} bytes, FA2's working set at blocks {BLOCKS}: "
                          f"{str(error).splitlines()[0]}",
                          "hold Q_i, one K_j and V_j, S_ij and P_ij and the row state: load K_j and V_j inside the "
                          "loop over key blocks and free each block's tiles (del s, v, k) before the next") from None


def _trace(module):
    from flashlab import schedules, sim
    problem = sim.problem(seqlen_q=70, seqlen_k=100, head_dim=32, dtype="bf16", causal=True)  # one head
    trace = schedules.trace(module.fa2_forward, problem, block_rows=BLOCKS[0], block_cols=BLOCKS[1], name="fa2")
    try:
        schedules.check_replayable(trace)
    except ValueError as error:
        raise Failure(f"the trace does not replay: {error}",
                      "free every tile you make (del) and keep to the tile-memory calls") from None


LAB = Lab(
    key="02", folder="02_tiled_attention", title="tiled attention: FlashAttention-2's forward", submission="attention.py",
    checks=[
        Check("FA2 forward is correct on the odd shapes, no mask", 3, _no_mask),
        Check("FA2 forward is correct under causal masks and a window", 2, _masks),
        Check("HBM traffic equals FA2's closed form for the tiling used", 2, _traffic),
        Check("runs within FA2's working set (a bounded SRAM)", 2, _sram),
        Check("its trace replays in the visualizer", 1, _trace),
    ],
    error_hints=overrun_hints(),
)
