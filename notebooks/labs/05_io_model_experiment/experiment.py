"""Lab 05: an IO-model experiment. Write the four functions marked TODO; each returns a number.

Every count comes from the simulator: sim.run(schedule, problem, sram=M) counts a schedule's HBM
traffic at SRAM size M (bytes) with the block rule derived from M; its counters["hbm_elements"] is
the traffic in elements. All problems here are one head, bf16 (sim.problem(seqlen_q=N,
head_dim=d, dtype="bf16")). The grader measures the same numbers itself and checks yours within
the tolerances of the lab's page.

Grade it:  flashlab-grade 05 experiment.py
"""

import numpy as np  # noqa: F401  (numpy.polyfit fits a line)

from flashlab import sim  # noqa: F401


def fa2_exponent_in_n():
    """The exponent of FA2's HBM traffic in N: the slope of the least-squares line through
    (log N, log traffic) for N = 4096, 8192, 16384, 32768 at d = 64, M = 96 KB."""
    # TODO
    raise NotImplementedError("fa2_exponent_in_n")


def fa2_exponent_in_m():
    """Its exponent in M: the same fit against log M for M = 32, 64, 128, 256 KB at N = 8192, d = 64."""
    # TODO
    raise NotImplementedError("fa2_exponent_in_m")


def fa1_over_fa2():
    """FA1's HBM traffic over FA2's at N = 4096, d = 64, M = 96 KB."""
    # TODO
    raise NotImplementedError("fa1_over_fa2")


def crossover_m_over_d2():
    """At N = 1024, d = 128: the smallest r on the grid 2^(k/2), k = -6..6, at which square tiling
    (schedule "square_tiling", Saha and Ye) moves at least as many HBM elements as FA2, with M = r d^2
    elements (r * d * d * 2 bytes in bf16)."""
    # TODO
    raise NotImplementedError("crossover_m_over_d2")
