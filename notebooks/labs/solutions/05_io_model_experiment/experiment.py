"""Lab 05, the reference solution (kept out of the student release)."""

import numpy as np

from flashlab import sim


def hbm_elements(schedule, seqlen, head_dim, sram_bytes):
    problem = sim.problem(seqlen_q=seqlen, head_dim=head_dim, dtype="bf16")
    return sim.run(schedule, problem, sram=sram_bytes).counters["hbm_elements"]


def slope(xs, ys):
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def fa2_exponent_in_n():
    seqlens = [4096, 8192, 16384, 32768]
    return slope(seqlens, [hbm_elements("fa2", n, 64, 96 * 1024) for n in seqlens])


def fa2_exponent_in_m():
    srams = [32 * 1024, 64 * 1024, 128 * 1024, 256 * 1024]
    return slope(srams, [hbm_elements("fa2", 8192, 64, m) for m in srams])


def fa1_over_fa2():
    return hbm_elements("fa1", 4096, 64, 96 * 1024) / hbm_elements("fa2", 4096, 64, 96 * 1024)


def crossover_m_over_d2():
    d = 128
    for k in range(-6, 7):
        ratio = 2 ** (k / 2)
        sram_bytes = int(ratio * d * d * 2)  # M = ratio d^2 elements of 2 bytes
        if hbm_elements("square_tiling", 1024, d, sram_bytes) >= hbm_elements("fa2", 1024, d, sram_bytes):
            return ratio
    return float("nan")
