"""flashlab.sim.sweep: records for a DataFrame, each point counted as a run, the fits, refusals."""
import copy
import json
import math

import pytest

from flashlab import sim


def grid():
    return sim.sweep(["fa1", "fa2"], [512, 1024, 2048, 4096], [64], sram=["48K", "96K"], masks=["none", "causal"])


def test_one_flat_record_per_point():
    points = grid()
    assert len(points) == 2 * 4 * 1 * 2 * 2
    assert all(not isinstance(value, (dict, list)) for point in points for value in point.values())
    assert {(p["schedule"], p["mask"], p["seqlen"], p["sram_bytes"]) for p in points} == {
        (s, mask, n, m) for s in ("fa1", "fa2") for mask in ("none", "causal") for n in (512, 1024, 2048, 4096)
        for m in (48 * 1024, 96 * 1024)}
    assert all(p["status"] == "ok" for p in points)


def test_a_point_counts_what_a_run_counts():
    points = grid()
    point = next(p for p in points if (p["schedule"], p["mask"], p["seqlen"], p["sram_bytes"]) == ("fa2", "causal", 2048, 48 * 1024))
    p = sim.problem(seqlen_q=2048, head_dim=64, causal=True, dtype="bf16")  # the sweep's default dtype
    blocks = (point["block_rows"], point["block_cols"])
    assert point["hbm_bytes"] == sim.closed_form("fa2", p, blocks, sram=48 * 1024)["hbm_bytes"]
    assert point["bound_formula"] == "N^2 d^2 / M"
    assert point["bound_elements"] == pytest.approx(2048**2 * 64**2 / (48 * 1024 / 2))


def test_fits_are_least_squares_slopes_of_the_counts():
    points = grid()
    fit = next(f for f in points.fits if (f["schedule"], f["mask"], f["variable"]) == ("fa2", "none", "N")
               and f["fixed"]["sram_bytes"] == 96 * 1024)
    xs, ys = zip(*sorted((math.log(p["seqlen"]), math.log(p["hbm_bytes"])) for p in points
                         if (p["schedule"], p["mask"], p["sram_bytes"]) == ("fa2", "none", 96 * 1024)))
    x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / sum((x - x_mean) ** 2 for x in xs)
    assert fit["points"] == 4 and fit["exponent"] == pytest.approx(slope)
    assert fit["theory"] == 2.0 and 1.8 < fit["exponent"] < 2.05


def test_a_point_that_does_not_fit_is_a_record_too():
    (point,) = sim.sweep("fa2", 64, 64, sram=16)
    assert point["status"] == "does_not_fit"
    assert "below the smallest working set of 'fa2'" in point["reason"]


def test_machine_gives_M_dtype_and_roofline():
    preset = sim.machine("a100")
    points = sim.sweep("fa2", [1024, 2048], 128, machine="a100")
    assert {p["sram_bytes"] for p in points} == {preset["sram_bytes"]}
    assert all(p["roofline_seconds"] > 0 for p in points)
    assert points.to_json()["dtype"] == preset["dtype"]


def test_json_is_the_cli_schema(tmp_path):
    points = sim.sweep("fa2", [256, 512], 64, sram="16K")
    path = tmp_path / "sweep.json"
    points.save(str(path))
    saved = json.loads(path.read_text())
    assert (saved["format"], saved["version"]) == ("flashlab-sweep", 1)
    assert [p["hbm_bytes"] for p in saved["points"]] == [p["hbm_bytes"] for p in points]


def test_into_pandas():
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(grid())
    assert frame.shape[0] == 32 and {"schedule", "hbm_bytes", "bound_elements"} <= set(frame.columns)


@pytest.mark.parametrize("arguments, message", [
    (dict(seqlens=[0]), "seqlen 0 is out of range; allowed: [1, 16777216]"),
    (dict(seqlens=[2**40]), "seqlens[0] = 1099511627776 is out of range; allowed: [1, 16777216]"),
    (dict(head_dims=[5000]), "4096"),
    (dict(masks=["diag"]), "mask 'diag' is not understood; allowed: none, causal, window:W"),
    (dict(schedules=["fa9"]), "schedule 'fa9' is unknown"),
    (dict(sram=None), "sram: give the SRAM sizes"),
    (dict(dtype="int8"), "dtype 'int8' is unknown"),
])
def test_sweep_refusals(arguments, message):
    call = dict(schedules=["fa2"], seqlens=[256], head_dims=[64], sram=["16K"])
    call.update(arguments)
    with pytest.raises(ValueError) as error:
        sim.sweep(call.pop("schedules"), call.pop("seqlens"), call.pop("head_dims"), **call)
    assert message in str(error.value)


def test_jobs_give_the_serial_result_in_order():
    def without_times(points):
        saved = copy.deepcopy(points.to_json())
        for point in saved["points"]:
            point.pop("seconds", None)
        return saved["points"], saved["fits"]
    serial = sim.sweep(["standard", "fa1", "fa2"], [129, 513, 1031], [64, 128], sram=["1K", "16K"], masks=["none", "causal"])
    parallel = sim.sweep(["standard", "fa1", "fa2"], [129, 513, 1031], [64, 128], sram=["1K", "16K"], masks=["none", "causal"],
                         jobs=3)
    assert {p["status"] for p in serial} == {"ok", "does_not_fit"}
    assert without_times(parallel) == without_times(serial)
    assert parallel.to_json()["command"].endswith(", jobs=3)")


@pytest.mark.parametrize("jobs, message", [(0, "--jobs = 0 is out of range; allowed: 1..256"),
                                           (257, "--jobs = 257 is out of range"), (2**40, "jobs = 1099511627776"),
                                           ("2", "jobs = '2'; allowed: an integer in [1, 256]")])
def test_jobs_refused(jobs, message):
    with pytest.raises(ValueError) as error:
        sim.sweep("fa2", 256, 64, sram="16K", jobs=jobs)
    assert message in str(error.value)


def test_block_rule_paper_gives_the_runs_blocks_and_arena():
    # FA1 Algorithm 1 line 1 as written at d = 64, M = 64 KiB bf16 (32768 elements):
    # Bc = ceil(32768 / 256) = 128, Br = min(Bc, d) = 64; the arena grows to its working set.
    point = sim.sweep("fa1", 1024, 64, sram="64K", block_rule="paper")[0]
    run = sim.run("fa1", sim.problem(1024, 64, dtype="bf16"), sram="64K", block_rule="paper")
    assert (point["block_rows"], point["block_cols"]) == (64, 128)
    assert point["block_rule"] == run.block_rule == "paper"
    assert point["arena_bytes"] == run.arena_bytes > 64 * 1024
    assert point["hbm_bytes"] == run.counters["hbm_bytes"]
    fitting = sim.sweep("fa1", 1024, 64, sram="64K")
    assert fitting[0]["block_rule"] == "fitting" and fitting[0]["arena_bytes"] == 64 * 1024
    assert fitting.to_json()["block_rule"] == "fitting"
    with pytest.raises(ValueError, match="block rule 'papr' is unknown; allowed: fitting, paper"):
        sim.sweep("fa1", 1024, 64, sram="64K", block_rule="papr")
