"""Lab 01: softmax three ways and the online softmax (notebooks/labs/01_online_softmax).

The submission (softmax.py) defines, on FlashLab's tile-memory interface (flashlab.schedules):
  softmax_three_pass(mem, X, Y, block_cols)     Milakov and Gimelshein 2018, Algorithm 2
  softmax_online(mem, X, Y, block_cols)         Algorithm 3 (the online normalizer)
  softmax_times_values(mem, X, V, Y, block_cols)  Y = softmax(X) V in one pass (FlashAttention)
each walking the columns of X in blocks of block_cols, all rows at once. Graded on odd shapes
against numpy in float64, and on the passes over X that the memory model counts.
"""

from __future__ import annotations

import numpy as np

from ._framework import Check, Failure, Lab, overrun_hints

# (rows, columns, block_cols): one element, blocks that do not divide the row, one block, many.
SHAPES = [(1, 1, 1), (7, 100, 16), (33, 65, 64), (64, 256, 32), (5, 40, 64)]
TOLERANCE = 1e-5  # fp32 tiles: a correct schedule is within a few units in the last place


def _matrices(rows, cols, dv, seed):
    from flashlab import schedules, sim
    problem = sim.problem(seqlen_q=rows, seqlen_k=cols, head_dim=cols, head_dim_v=dv, dtype="fp32")
    tensors = schedules.random_tensors(problem, seed)  # X (= Q), V standard normal; Y (= O) NaN
    return problem, schedules.head_tensors(tensors, problem, 0, 0)


def _run(fn, rows, cols, block, *, with_values=False, dv=8, sram=0, seed=7):
    from flashlab import schedules
    problem, x = _matrices(rows, cols, dv if with_values else cols, seed)
    mem = schedules.DataMemory(problem.dtype, sram)
    if with_values:
        fn(mem, x.Q, x.V, x.O, block)
    else:
        fn(mem, x.Q, x.O, block)
    X = np.array(x.Q.values, dtype=np.float64)
    return X, np.array(x.V.values, dtype=np.float64), np.array(x.O.values, dtype=np.float64), mem.counters().to_dict()


def _softmax(X):
    e = np.exp(X - X.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _without_rescale(X, block):
    """The online normalizer's classic mistake: the running sum never rescaled when the max rises."""
    m = np.full(X.shape[0], -np.inf)
    d = np.zeros(X.shape[0])
    for begin in range(0, X.shape[1], block):
        x = X[:, begin:begin + block]
        m = np.maximum(m, x.max(axis=1))
        d = d + np.exp(x - m[:, None]).sum(axis=1)
    return np.exp(X - m[:, None]) / d[:, None]


def _diagnose(Y, expected, X, block, *, online=False):
    if np.isnan(Y).any():
        cols = sorted(set(np.nonzero(np.isnan(Y))[1].tolist()))
        raise Failure(f"Y has {int(np.isnan(Y).sum())} elements never written (still NaN), in columns "
                      f"{cols[0]}..{cols[-1]}",
                      "store every block of Y, the last one too: it may be narrower than block_cols "
                      "(Range(begin, min(block_cols, n - begin)))")
    error = np.abs(Y - expected)
    if error.max() <= TOLERANCE:
        return
    if online and Y.shape[1] > block and np.abs(Y - _without_rescale(X, block)).max() <= TOLERANCE:
        raise Failure(f"Y is off by up to {error.max():.3g}: it is what a running sum that is never rescaled gives",
                      "when the running max rises from m_old to m_new, the sum so far was taken against m_old: "
                      "multiply it by exp(m_old - m_new) (mem.exp_difference, mem.scale_rows) before adding the block's")
    sums = Y.sum(axis=1) if Y.shape == X.shape else None
    r, c = np.unravel_index(np.argmax(error), error.shape)
    if sums is not None and np.abs(sums - 1).max() > 1e-3:
        raise Failure(f"rows of Y do not sum to 1 (row {int(np.argmax(np.abs(sums - 1)))} sums to "
                      f"{sums[np.argmax(np.abs(sums - 1))]:.6g})",
                      "divide by the sum over the whole row, known only after the pass that finishes it, "
                      "not by a block's sum")
    raise Failure(f"Y differs from the softmax by up to {error.max():.3g} (row {r}, column {c}: {Y[r, c]:.6g}, "
                  f"expected {expected[r, c]:.6g}); allowed: {TOLERANCE:g}")


def _correct(name, *, online=False):
    def run(module):
        fn = getattr(module, name)
        for rows, cols, block in SHAPES:
            X, _, Y, _ = _run(fn, rows, cols, block)
            try:
                _diagnose(Y, _softmax(X), X, block, online=online)
            except Failure as failure:
                raise Failure(f"X {rows} x {cols}, block_cols {block}: {failure.message}", failure.hint) from None
    return run


def _passes(name, expected_passes):
    def run(module):
        rows, cols, block = 33, 65, 16
        _, _, _, counters = _run(getattr(module, name), rows, cols, block)
        reads = counters["tensors"].get("Q", {}).get("read_elements", 0)
        writes = counters["tensors"].get("O", {}).get("write_elements", 0)
        if reads != expected_passes * rows * cols:
            raise Failure(f"X {rows} x {cols}: {reads} elements of X read, {reads / (rows * cols):.3g} passes; "
                          f"allowed: {expected_passes} passes ({expected_passes * rows * cols} elements)",
                          f"this algorithm reads X {expected_passes} time(s): "
                          + {3: "one pass for the max, one for the sum, one to normalise",
                             2: "the max and the sum together in one pass, one pass to normalise",
                             1: "each block of X and V once; O rescaled as the max rises"}[expected_passes])
        if writes != rows * cols:
            raise Failure(f"{writes} elements of Y written; allowed: {rows * cols}, each element once",
                          "store each block of Y once, in the last pass")
    return run


def _times_values_correct(module):
    for rows, cols, block in SHAPES:
        X, V, Y, _ = _run(module.softmax_times_values, rows, cols, block, with_values=True)
        expected = _softmax(X) @ V
        if np.isnan(Y).any():
            raise Failure(f"X {rows} x {cols}: Y has elements never written (NaN)", "store O once, after the last block")
        error = np.abs(Y - expected).max()
        if error > 10 * TOLERANCE:
            raise Failure(f"X {rows} x {cols}, block_cols {block}: Y differs from softmax(X) V by up to {error:.3g}; "
                          f"allowed: {10 * TOLERANCE:g}",
                          "keep O unnormalised in the loop (rescale it and l by exp(m_old - m_new) when the max "
                          "rises; online_softmax_update does it) and divide by l once after the last block")


def _times_values_one_pass(module):
    rows, cols, block, dv = 33, 65, 16, 8
    _, _, _, counters = _run(module.softmax_times_values, rows, cols, block, with_values=True, dv=dv)
    tensors = counters["tensors"]
    reads_x = tensors.get("Q", {}).get("read_elements", 0)
    reads_v = tensors.get("V", {}).get("read_elements", 0)
    if reads_x != rows * cols or reads_v != cols * dv:
        raise Failure(f"X read {reads_x / (rows * cols):.3g} times, V {reads_v / (cols * dv):.3g} times; allowed: once each",
                      "one pass: each block of X meets its rows of V once")


def _times_values_sram(module):
    rows, cols, block, dv = 64, 256, 32, 32
    element = 4
    # One block at a time: X_j and P_j (rows x block), V_j (block x dv), O (rows x dv) and the row
    # statistics, with room for a block's tiles to overlap the next's; all of X (64 KB) does not fit.
    sram = element * (2 * (2 * rows * block + block * dv) + rows * dv + 8 * rows)
    from flashlab import schedules
    try:
        _run(module.softmax_times_values, rows, cols, block, with_values=True, dv=dv, sram=sram)
    except schedules.SramOverflow as error:
        raise Failure(f"with M = {sram} bytes (one block's tiles, twice over; X alone is {rows * cols * element}): "
                      f"{str(error).splitlines()[0]}",
                      "hold one block of X and V at a time: free each block's tiles (del x, v, p) before "
                      "loading the next") from None


LAB = Lab(
    key="01", folder="01_online_softmax", title="softmax three ways and the online softmax", submission="softmax.py",
    checks=[
        Check("three-pass softmax is correct on odd shapes", 2, _correct("softmax_three_pass"),
              "Algorithm 2: m = max over the row; d = sum of exp(x - m); y = exp(x - m) / d"),
        Check("three-pass softmax reads X three times and writes Y once", 1, _passes("softmax_three_pass", 3)),
        Check("online softmax is correct on odd shapes", 2, _correct("softmax_online", online=True),
              "Algorithm 3: per block, m_new = max(m, block max); d = d exp(m - m_new) + sum exp(x - m_new)"),
        Check("online softmax reads X twice and writes Y once", 1, _passes("softmax_online", 2)),
        Check("softmax(X) V in one pass is correct on odd shapes", 2, _times_values_correct,
              "start_softmax_state, online_softmax_update per block, finish_softmax_state, store O"),
        Check("softmax(X) V reads X and V once", 1, _times_values_one_pass),
        Check("softmax(X) V holds one block at a time (a bounded SRAM)", 1, _times_values_sram),
    ],
    error_hints=overrun_hints(),
)
