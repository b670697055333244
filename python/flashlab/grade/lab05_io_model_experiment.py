"""Lab 05: an IO-model experiment (notebooks/labs/05_io_model_experiment).

The submission (experiment.py) runs the simulator and reports four numbers:
  fa2_exponent_in_n()     the exponent of FA2's HBM traffic in N (N = 4K..32K, d 64, M 96 KB, bf16)
  fa2_exponent_in_m()     its exponent in M (M = 32K..256K bytes, N 8K, d 64)
  fa1_over_fa2()          FA1's traffic over FA2's (N 4K, d 64, M 96 KB)
  crossover_m_over_d2()   the smallest M / d^2 (M in elements) on the grid 2^(k/2), k = -6..6, at
                          which square tiling (Saha and Ye) moves at least as much as FA2 (N 1K, d 128)
The grader measures each itself with the simulator, on the same definitions, and holds the
reported numbers to it within the tolerances stated here: the numbers are checked, not the cells.
"""

from __future__ import annotations

from ._framework import Check, Failure, Lab

SEQLENS = (4096, 8192, 16384, 32768)
SRAMS = (32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024)
CROSSOVER_GRID = tuple(2 ** (k / 2) for k in range(-6, 7))
EXPONENT_TOLERANCE = 0.02
RATIO_TOLERANCE = 0.01  # relative


def hbm_elements(schedule, seqlen, head_dim, sram_bytes):
    from flashlab import sim
    problem = sim.problem(seqlen_q=seqlen, head_dim=head_dim, dtype="bf16")
    return sim.run(schedule, problem, sram=sram_bytes).counters["hbm_elements"]


def _slope(xs, ys):
    import numpy as np
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def measured():
    """The four numbers, as the grader measures them."""
    crossover = next(r for r in CROSSOVER_GRID
                     if hbm_elements("square_tiling", 1024, 128, int(r * 128 * 128 * 2))
                     >= hbm_elements("fa2", 1024, 128, int(r * 128 * 128 * 2)))
    return {
        "fa2_exponent_in_n": _slope(SEQLENS, [hbm_elements("fa2", n, 64, 96 * 1024) for n in SEQLENS]),
        "fa2_exponent_in_m": _slope(SRAMS, [hbm_elements("fa2", 8192, 64, m) for m in SRAMS]),
        "fa1_over_fa2": hbm_elements("fa1", 4096, 64, 96 * 1024) / hbm_elements("fa2", 4096, 64, 96 * 1024),
        "crossover_m_over_d2": crossover,
    }


def _number(module, name):
    value = getattr(module, name)()
    if not isinstance(value, (int, float)) or value != value:
        raise Failure(f"{name}() returned {value!r}; allowed: a number", "return the number itself, e.g. float(slope)")
    return float(value)


def _exponent(name, hint):
    def run(module):
        got, expected = _number(module, name), measured()[name]
        if abs(got - expected) > EXPONENT_TOLERANCE:
            raise Failure(f"{name}() = {got:.4g}; the simulator gives {expected:.4g} on the stated grid "
                          f"(allowed: within {EXPONENT_TOLERANCE})", hint)
    return run


def _ratio(module):
    got, expected = _number(module, "fa1_over_fa2"), measured()["fa1_over_fa2"]
    if abs(got / expected - 1) > RATIO_TOLERANCE:
        raise Failure(f"fa1_over_fa2() = {got:.4g}; the simulator gives {expected:.4g} (allowed: within 1 %)",
                      "both at N 4096, d 64, M 96 KB, bf16: the ratio of hbm_elements, FA1's over FA2's")


def _crossover(module):
    got, expected = _number(module, "crossover_m_over_d2"), measured()["crossover_m_over_d2"]
    if abs(got - expected) > 1e-9 * expected:
        below = [r for r in CROSSOVER_GRID if r < expected]
        hint = ("that is the last M at which square tiling still wins: the question asks for the first at which "
                "it no longer does") if below and abs(got - below[-1]) < 1e-9 else (
                "M in elements is M / 2 in bf16 bytes: M = r d^2 elements is r * 128 * 128 * 2 bytes; walk the grid "
                "from small M up")
        raise Failure(f"crossover_m_over_d2() = {got:.4g}; the simulator gives {expected:.4g}", hint)


LAB = Lab(
    key="05", folder="05_io_model_experiment", title="an IO-model experiment", submission="experiment.py",
    checks=[
        Check("FA2's exponent in N", 3, _exponent("fa2_exponent_in_n",
              "a least-squares line through (log N, log traffic) over N = 4K..32K: numpy.polyfit(log N, log y, 1)")),
        Check("FA2's exponent in M", 3, _exponent("fa2_exponent_in_m",
              "the same fit against log M over M = 32K..256K bytes, at N 8192")),
        Check("FA1's traffic over FA2's", 2, _ratio),
        Check("the Saha-Ye crossover, M / d^2", 2, _crossover),
    ],
)
