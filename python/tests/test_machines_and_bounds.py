"""flashlab.sim.machines (the packaged presets), the kernels' tilings, the bounds and the version."""
import json
import math
import pathlib
import re

import pytest

import flashlab
from flashlab import sim

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_machines_are_the_source_presets():
    presets = {p["key"]: p for p in (json.loads(f.read_text()) for f in (ROOT / "sim" / "machines").glob("*.json"))}
    machines = sim.machines()
    assert [m["key"] for m in machines] == sorted(presets)
    for m in machines:
        assert m["sram_bytes"] == presets[m["key"]]["sram_bytes"]
        assert m["hbm_bytes_per_second"] == presets[m["key"]]["hbm_bytes_per_second"]


def test_machine_by_key_or_path():
    assert sim.machine("h200")["name"].startswith("NVIDIA H200")
    assert sim.machine(str(ROOT / "sim" / "machines" / "t4.json"))["key"] == "t4"
    with pytest.raises(ValueError, match=r"machine 'z80' is unknown; allowed: a100, b200, h100, h200, t4, titan_rtx"):
        sim.machine("z80")


def test_kernel_tilings_a_machine_runs():
    h200, t4 = sim.machine("h200"), sim.machine("t4")
    on_h200 = sim.kernel_tilings("h200")
    assert on_h200 and all(t["min_shared_limit"] <= h200["sram_bytes"] for t in on_h200)
    assert len(sim.kernel_tilings("t4")) < len(on_h200) <= len(sim.kernel_tilings())
    assert all(t["min_shared_limit"] <= t4["sram_bytes"] for t in sim.kernel_tilings("t4"))
    (fa2,) = sim.kernel_tilings("h200", "fa2", "forward")[3:4]
    assert (fa2["generation"], fa2["direction"]) == ("fa2", "forward")
    with pytest.raises(ValueError, match="generation 'fa9' is unknown; allowed: fa1, fa2"):
        sim.kernel_tilings(generation="fa9")


def test_bounds_by_hand():
    n, d, m_bytes = 4096, 64, 96 * 1024
    p = sim.problem(seqlen_q=n, head_dim=d, dtype="bf16")
    m = m_bytes / 2  # bf16 elements
    formulas = sim.bound_formulas(p, m_bytes)
    assert formulas["standard"] == pytest.approx(2 * n * d + n * n)  # (Nq + Nk) d + Nq Nk
    assert formulas["flash"] == pytest.approx(n * n * d * d / m)
    assert formulas["saha_ye_lower"] == pytest.approx(min(n * n * d / math.sqrt(m), n * n * d * d / m))
    assert sim.bound("fa2", p, m_bytes)["elements"] == pytest.approx(formulas["flash"])
    assert sim.lower_bound(p, m_bytes)["elements"] == pytest.approx(formulas["saha_ye_lower"])
    small = sim.bound_formulas(p, 1024)  # M = 512 elements < d^2: the sqrt(M) branch
    assert small["saha_ye_lower"] == pytest.approx(n * n * d / math.sqrt(512))


def test_theory_exponents():
    assert sim.theory_exponents("fa2", 48 * 1024, 64) == {"n": 2.0, "m": -1.0, "d": 2.0}
    assert sim.theory_exponents("square_tiling", 1024, 64) == {"n": 2.0, "m": -0.5, "d": 1.0}


def test_derived_blocks_fit_their_sram():
    p = sim.problem(seqlen_q=4096, head_dim=64)
    for schedule in ("fa1", "fa2", "square_tiling"):
        blocks = sim.derive_blocks(schedule, p, "96K")
        assert 0 < sim.working_set_bytes(schedule, p, blocks) <= 96 * 1024
    with pytest.raises(ValueError, match="below the smallest working set"):
        sim.derive_blocks("fa2", p, 64)


def test_version_is_the_cmake_project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert flashlab.__version__ == re.search(r"project\(FlashLab VERSION ([0-9.]+)", cmake).group(1)


def test_lower_bound_clamped_to_compulsory_traffic_and_range_warned():
    n, d = 1024, 64
    p = sim.problem(seqlen_q=n, head_dim=d, dtype="bf16")
    large = 2 * n * d * 2  # M = 2 N d elements of bf16: N^2 d^2 / M = N d / 2
    low = sim.lower_bound(p, large)
    assert low["elements"] == 4 * n * d  # Q, K, V read, O written
    assert "above N d" in low["warning"]
    assert "warning" in sim.bound("fa2", p, large)
    assert "warning" not in sim.lower_bound(p, 96 * 1024)
    assert sim.lower_bound(p, 16 * 1024)["elements"] == n * n * d * d / 8192
    assert sim.bound_formulas(p, large)["compulsory"] == 4 * n * d


def test_split_kv_reads_an_mqa_cache_once():
    # 32 query heads, 1 KV head, 32K keys, d 128, bf16: K and V of the one KV head are 16 777 216 B.
    p = sim.problem(seqlen_q=1, seqlen_k=32768, head_dim=128, heads_q=32, heads_kv=1, dtype="bf16")
    tensors = sim.run("split_kv", p, sram="228K").counters["tensors"]
    assert tensors["K"]["read_bytes"] + tensors["V"]["read_bytes"] == 2 * 32768 * 128 * 2


def test_block_rule_paper_or_fitting_and_the_run_says_which():
    # FA1, d 128, M 228 KB, bf16: the paper's 128 x 228 (Bc = ceil(116736 / 512)), or 114 x 114 fitted.
    p = sim.problem(seqlen_q=2048, head_dim=128, dtype="bf16")
    fitting = sim.run("fa1", p, sram="228K")
    paper = sim.run("fa1", p, sram="228K", block_rule="paper")
    assert fitting.block_rule == "fitting" and paper.block_rule == "paper"
    assert (paper.blocks["block_rows"], paper.blocks["block_cols"]) == (128, 228)
    assert (fitting.blocks["block_rows"], fitting.blocks["block_cols"]) == (114, 114)
    assert paper.arena_bytes == 369152 and fitting.arena_bytes == 228 * 1024
    assert paper.closed_form_equal
    with pytest.raises(ValueError):
        sim.run("fa1", p, sram="228K", block_rule="square")
