"""One schedule, one problem, one M: every entry point gives the same blocks and counts, or the
same refusal: `flashlab run --json`, `flashlab sweep --json`, and flashlab.sim's run() and
sweep() (the notebooks' path). The experiment counts its points with the sweep's count_point
and the visualizer records through run_schedule (tests/sim/test_entry_points_agree.cpp, the
viz tests).

usage: entry_points_agree.py <flashlab>   (PYTHONPATH: the build tree's python/)
"""
import json
import os
import subprocess
import sys
import tempfile

from flashlab import sim

FLASHLAB = sys.argv[1]
SCALARS = ("hbm_bytes", "hbm_read_bytes", "hbm_write_bytes", "matmul_flops", "exponentials", "other_flops",
           "sram_peak_bytes")

# (schedule, N, d, M, dtype, block rule)
CASES = [
    ("standard", 16384, 64, "96K", "fp32", "fitting"),  # run refused it, sweep counted it, before
    ("standard_backward", 2048, 64, "48K", "bf16", "fitting"),
    ("fa2", 4096, 64, "100K", "bf16", "fitting"),
    ("fa1_backward", 2048, 64, "64K", "bf16", "fitting"),
    ("fa1", 2048, 128, "96K", "fp16", "paper"),
]
REFUSED = ("fa2", 1024, 256, "1K", "fp32", "fitting")

failures = []


def check(condition, text):
    if not condition:
        failures.append(text)


def cli(*args):
    return subprocess.run([FLASHLAB, *args], capture_output=True, text=True)


def problem(n, d, dtype):
    return sim.problem(seqlen_q=n, head_dim=d, dtype=dtype)


with tempfile.TemporaryDirectory() as work:
    for schedule, n, d, m, dtype, rule in CASES:
        name = f"{schedule} N {n} d {d} M {m} {dtype} {rule}"
        run_path, sweep_path = os.path.join(work, "run.json"), os.path.join(work, "sweep.json")
        ran = cli("run", "--schedule", schedule, "-n", str(n), "-d", str(d), "--sram", m, "--dtype", dtype,
                  "--block-rule", rule, "--json", run_path)
        check(ran.returncode == 0, f"{name}: flashlab run exited {ran.returncode}: {ran.stderr.strip()}")
        swept = cli("sweep", "--schedules", schedule, "--seqlens", str(n), "--head-dims", str(d), "--sram", m,
                    "--dtype", dtype, "--block-rule", rule, "--quiet", "--json", sweep_path)
        check(swept.returncode == 0, f"{name}: flashlab sweep exited {swept.returncode}: {swept.stderr.strip()}")
        if ran.returncode or swept.returncode:
            continue
        run = json.load(open(run_path))
        point = json.load(open(sweep_path))["points"][0]
        library = sim.run(schedule, problem(n, d, dtype), sram=m, block_rule=rule)
        library_point = sim.sweep(schedule, n, d, sram=m, dtype=dtype, block_rule=rule)[0]
        blocks = (run["blocks"]["block_rows"], run["blocks"]["block_cols"])
        check(point["status"] == "ok", f"{name}: the sweep's point does not fit: {point.get('reason')}")
        check((point["block_rows"], point["block_cols"]) == blocks, f"{name}: sweep blocks differ from run's {blocks}")
        check((library.blocks["block_rows"], library.blocks["block_cols"]) == blocks, f"{name}: sim.run blocks differ")
        check((library_point["block_rows"], library_point["block_cols"]) == blocks, f"{name}: sim.sweep blocks differ")
        check(run["closed_form_equal"], f"{name}: the run differs from its closed form")
        for key in SCALARS:
            values = (run["counters"][key], point[key], library.counters[key], library_point[key])
            check(len(set(values)) == 1, f"{name}: {key} differs: run, sweep, sim.run, sim.sweep = {values}")
        for record in (point, library_point):
            check(record["block_rule"] == run["block_rule"] == library.block_rule,
                  f"{name}: block rules differ: {record['block_rule']}, {run['block_rule']}, {library.block_rule}")
            check(record["arena_bytes"] == run["arena_bytes"] == library.arena_bytes, f"{name}: arenas differ")
        flat_bound = {key: library_point["bound_" + key] for key in ("formula", "source", "elements")}
        for bound in (point["bound"], flat_bound, {key: library.bound[key] for key in ("formula", "source", "elements")}):
            check(bound == run["bound"], f"{name}: bounds differ: {bound} vs {run['bound']}")

    # The same refusal everywhere: the working set of the smallest blocks exceeds M.
    schedule, n, d, m, dtype, rule = REFUSED
    ran = cli("run", "--schedule", schedule, "-n", str(n), "-d", str(d), "--sram", m, "--dtype", dtype)
    check(ran.returncode == 2, f"refused case: flashlab run exited {ran.returncode}")
    reason = ran.stderr.strip().removeprefix("flashlab: ")
    sweep_path = os.path.join(work, "refused.json")
    swept = cli("sweep", "--schedules", schedule, "--seqlens", str(n), "--head-dims", str(d), "--sram", m, "--dtype", dtype,
                "--quiet", "--json", sweep_path)
    check(swept.returncode == 0, f"refused case: flashlab sweep exited {swept.returncode}")
    point = json.load(open(sweep_path))["points"][0]
    check(point["status"] == "does_not_fit" and point["reason"] == reason,
          f"refused case: sweep says {point.get('status')}: {point.get('reason')!r}, run says {reason!r}")
    check(sim.sweep(schedule, n, d, sram=m, dtype=dtype)[0].get("reason") == reason, "refused case: sim.sweep's reason")
    try:
        sim.run(schedule, problem(n, d, dtype), sram=m)
        check(False, "refused case: sim.run ran")
    except ValueError as error:
        check(str(error) == reason, f"refused case: sim.run says {error}, run says {reason!r}")

# The backward's bound is FA1 Theorem 5's, reported by the run: N^2 d^2 / M with M in elements.
fa1_backward = sim.run("fa1_backward", problem(2048, 64, "bf16"), sram="64K")
check(fa1_backward.bound["source"] == "FA1 Theorem 5" and fa1_backward.bound["formula"] == "N^2 d^2 / M",
      f"fa1_backward's bound: {fa1_backward.bound}")
check(fa1_backward.bound["elements"] == 2048 ** 2 * 64 ** 2 / (64 * 1024 / 2), f"fa1_backward's bound: {fa1_backward.bound}")

if failures:
    print("\n".join("FAILED: " + f for f in failures))
    sys.exit(1)
print(f"{len(CASES)} cases and one refusal agree across flashlab run, flashlab sweep, sim.run and sim.sweep")
