#!/usr/bin/env python3
"""Calibrates the time model (sim/time_model.hpp) on the kernel times committed in docs/bench/, and
checks it on the rows it was not fitted to.

For each kernel (FA1 forward, FA2 forward and backward, the Hopper rung's forward and backward) the
benchmark rows are split by sequence length: the constants (a tensor efficiency per compiled head
dim, softmax cycles per score, seconds per thread block) are fitted on the calibration rows
(seqlen 512, 2048, 8192) by least squares on log(predicted / measured), and the model is then run
with them on the held-out rows (1024, 4096, 16384). FA1 takes FA2's tensor and softmax constants
(the same mma.sync and exp2 instructions) and fits its seconds per dependent round trip and per
thread block. The report gives every
row's prediction, ratio and bound, and the median and largest error of each set.

Measurements (all on the H200; TFLOP/s in the flash-attention convention, turned back into times):
  fa2 forward, fa2 backward, fa1 forward (fp16)   docs/bench/h200_bench.json
  fa3 forward                                     docs/bench/h200_hopper_forward.json
  fa3 backward                                    docs/bench/h200_fa3_backward_same_run_d128_80_rows.json,
      column "fa3": the kernel with d 128's 80-row tiling and its masked variant (seqlen 2048, 8192
      and 16384; docs/fa3_backward_log.md, "80-query blocks at d 128, on the fp32 P^T order"). Earlier fits
      took h200_fa3_backward_shared_space.json and h200_fa3_backward_fa4_same_run.json, each the
      kernel of its day.
The benchmark passes PyTorch's [batch, heads, seqlen, dim] tensors, so the model runs with the
bhsd layout.

Then, not fitted, the Nsight Compute launches of docs/bench/h200_ncu_model.csv (scripts/device_check.sh
ncu-model: one launch of each main kernel, clocks unlocked, the benchmark binaries' flash layout):
the model's main-kernel time beside each, and the benchmark median of the same kernel and shape
where a run has one (a backward's benchmark time is its pass; the model's time of the pass's other
two kernels is taken off it).

usage: PYTHONPATH=build/release/python python3 scripts/calibrate_time_model.py [--refit KERNEL ...]
           [--write-preset] [--json docs/bench/h200_time_model.json] [--markdown docs/bench/h200_time_model.md]
--refit fits only the kernels named (fa2_forward, fa1_forward, fa2_backward, fa3_forward,
fa3_backward); the others keep the preset's constants (the fits of tensor efficiency against
softmax cycles are flat along a line where the two trade off, so a refit of an unchanged kernel
can wander along it without changing a prediction). --write-preset writes the constants into
sim/machines/h200.json ("time_model").
"""
import argparse
import csv
import json
import math
import os
import statistics
import sys

import flop_convention

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "docs", "bench")
PRESET = os.path.join(ROOT, "sim", "machines", "h200.json")
CALIBRATION_SEQLENS = {512, 2048, 8192}

# kernel key -> (generation, direction, file, pass in the file, column per head dim)
MEASUREMENTS = {  # FA1 after FA2's forward, whose compute constants it takes
    "fa2_forward": ("fa2", "forward", "h200_bench.json", "fwd", {64: "fa2", 128: "fa2", 256: "fa2"}),
    "fa1_forward": ("fa1", "forward", "h200_bench.json", "fwd", {64: "fa1_fp16", 128: "fa1_fp16"}),
    "fa2_backward": ("fa2", "backward", "h200_bench.json", "bwd", {64: "fa2", 128: "fa2", 256: "fa2"}),
    "fa3_forward": ("fa3", "forward", "h200_hopper_forward.json", "fwd", {64: "fa3", 128: "fa3", 256: "fa3"}),
    "fa3_backward": ("fa3", "backward", "h200_fa3_backward_same_run_d128_80_rows.json", "bwd", {64: "fa3", 128: "fa3"}),
}
# Later runs of a kernel, never fitted (another day's clocks, the kernel of its commit, its
# tiling unchanged): kernel key -> files in docs/bench with MEASUREMENTS' pass and columns. The
# model runs on every row with the kernel's constants.
LATER_RUNS = {"fa3_backward": ["h200_fa3_backward_same_run_7701a58.json"]}
# The benchmark median of each kernel on the H200, for the Nsight Compute launches: kernel key ->
# (file, pass, column); the kernels in the tree when docs/bench/h200_ncu_model.csv was measured.
BENCHMARK_OF = {
    "fa1_forward": ("h200_bench.json", "fwd", "fa1_fp16"),
    "fa2_forward": ("h200_bench.json", "fwd", "fa2"),
    "fa2_backward": ("h200_bench.json", "bwd", "fa2"),
    "fa3_forward": ("h200_fa3_backward_fa4_same_run.json", "fwd", "fa3@bwd_original"),
    "fa3_backward": ("h200_fa3_backward_fa4_same_run.json", "bwd", "fa3@bwd_original"),
}
NCU_CSV = os.path.join(BENCH, "h200_ncu_model.csv")


def flops(row, direction):
    return flop_convention.flops(row["batch"], row["heads"], row["seqlen"], row["head_dim"], row["causal"],
                                 backward=direction == "backward")


def measured_rows(key, name=None):
    """The rows of kernel `key` in its calibration run, or in run `name` (a file in docs/bench)."""
    generation, direction, fitted_name, pass_, columns = MEASUREMENTS[key]
    name = name or fitted_name
    with open(os.path.join(BENCH, name)) as file:
        bench = json.load(file)
    rows = []
    for row in bench["rows"]:
        column = columns.get(row["head_dim"])
        tflops = row[pass_].get(column) if column else None
        if not tflops:
            continue
        rows.append({"kernel": key, "generation": generation, "direction": direction, "head_dim": row["head_dim"],
                     "causal": row["causal"], "seqlen": row["seqlen"], "batch": row["batch"], "heads": row["heads"],
                     "measured_seconds": flops(row, direction) / (tflops * 1e12), "source": f"{name}: {pass_} {column}",
                     "calibration": row["seqlen"] in CALIBRATION_SEQLENS})
    return rows


def benchmark_run(sim, row):
    """The model's run of a benchmark row (measured_rows): FA1 in fp16, the others in bf16, the
    benchmark's bhsd layout."""
    problem = sim.problem(seqlen_q=row["seqlen"], head_dim=row["head_dim"], batch=row["batch"], heads_q=row["heads"],
                          causal=row["causal"], dtype="fp16" if row["generation"] == "fa1" else "bf16")
    return sim.hardware_run(row["generation"], problem, direction=row["direction"], layout="bhsd")


def nelder_mead(f, x0, steps, iterations=400):
    """Minimises f over R^n from x0 (a plain Nelder-Mead, enough for three or four constants)."""
    points = [list(x0)] + [[x + (steps[i] if j == i else 0) for j, x in enumerate(x0)] for i in range(len(x0))]
    values = [f(p) for p in points]
    for _ in range(iterations):
        order = sorted(range(len(points)), key=values.__getitem__)
        points, values = [points[i] for i in order], [values[i] for i in order]
        centroid = [sum(p[i] for p in points[:-1]) / (len(points) - 1) for i in range(len(x0))]
        def along(t):
            return [c + t * (w - c) for c, w in zip(centroid, points[-1])]
        reflected = along(-1)
        fr = f(reflected)
        if fr < values[0]:
            expanded = along(-2)
            fe = f(expanded)
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            contracted = along(0.5)
            fc = f(contracted)
            if fc < values[-1]:
                points[-1], values[-1] = contracted, fc
            else:
                points = [points[0]] + [[b + 0.5 * (p - b) for p, b in zip(q, points[0])] for q in points[1:]]
                values = [values[0]] + [f(p) for p in points[1:]]
    best = min(range(len(points)), key=values.__getitem__)
    return points[best], values[best]


def fit(runs, rows, free, fixed):
    """The constants minimising the squared log error on `rows` (pairs of a run index and a row):
    `free` names the fitted ones (a tensor efficiency per head dim as ("tensor_efficiency", d)),
    searched in log space; `fixed` holds the others."""
    def constants(x):
        c = dict(fixed)
        for name, v in zip(free, x):
            if isinstance(name, tuple):
                c.setdefault("tensor_efficiency_by_head_dim", {})[str(name[1])] = math.exp(v)
            else:
                c[name] = math.exp(v)
        if "tensor_efficiency_by_head_dim" in c:  # the default: the least efficient instance's
            c["tensor_efficiency"] = min(c["tensor_efficiency_by_head_dim"].values())
        return c

    def loss(x):
        c = constants(x)
        return sum(math.log(runs[i].time(c)["seconds"] / row["measured_seconds"]) ** 2 for i, row in rows)

    starts = {"tensor_efficiency": [0.45, 0.8], "softmax_cycles_per_score": [0.05, 0.2],
              "block_seconds": [3e-6], "round_trip_seconds": [3e-7]}
    best = None
    for a in starts["tensor_efficiency"]:
        for b in starts["softmax_cycles_per_score"]:
            x0 = [math.log(a if isinstance(n, tuple) else b if n == "softmax_cycles_per_score" else starts[n][0]) for n in free]
            x, value = nelder_mead(loss, x0, [0.5] * len(free), iterations=150 * len(free))
            if best is None or value < best[1]:
                best = (x, value)
    return constants(best[0])


def benchmark_seconds(key, shape):
    """The benchmark median of kernel `key` at `shape` (head_dim, causal, seqlen, batch, heads) in
    BENCHMARK_OF's run, in seconds, and its source; (None, None) where that run has no such row."""
    name, pass_, column = BENCHMARK_OF[key]
    with open(os.path.join(BENCH, name)) as file:
        bench = json.load(file)
    for row in bench["rows"]:
        if tuple(row[k] for k in ("head_dim", "causal", "seqlen", "batch", "heads")) == shape and row[pass_].get(column):
            return flops(row, MEASUREMENTS[key][1]) / (row[pass_][column] * 1e12), f"{name}: {pass_} {column}"
    return None, None


def ncu_rows(sim, constants_of):
    """The Nsight Compute launches of NCU_CSV beside the model's main-kernel time (not fitted)."""
    rows = []
    with open(NCU_CSV) as file:
        for m in csv.DictReader(file):
            key = f"{m['kernel']}_{m['direction']}"
            shape = (int(m["head_dim"]), m["causal"] in ("True", "true", "1"), int(m["seqlen"]), int(m["batch"]), int(m["heads"]))
            problem = sim.problem(seqlen_q=shape[2], head_dim=shape[0], batch=shape[3], heads_q=shape[4], causal=shape[1],
                                  dtype=m["dtype"])
            time = sim.hardware_run(m["kernel"], problem, direction=m["direction"]).time(constants_of[key])
            bench, source = benchmark_seconds(key, shape)
            bench_kernel = bench - time["other_kernels_seconds"] if bench else None  # a backward: the pass less D and dQ
            measured = float(m["seconds"])
            rows.append({"kernel": key, "head_dim": shape[0], "causal": shape[1], "seqlen": shape[2], "batch": shape[3],
                         "heads": shape[4], "ncu_seconds": measured, "predicted_kernel_seconds": time["kernel_seconds"],
                         "ratio": time["kernel_seconds"] / measured, "bound": time["bound"],
                         "benchmark_kernel_seconds": bench_kernel, "benchmark_source": source,
                         "ncu_over_benchmark": measured / bench_kernel if bench_kernel else None,
                         "predicted_over_benchmark": time["kernel_seconds"] / bench_kernel if bench_kernel else None,
                         "source": f"docs/bench/h200_ncu_model.csv: {m['source']}"})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--refit", nargs="+", choices=list(MEASUREMENTS), metavar="KERNEL",
                        help="fit these kernels only; the others keep the preset's constants (default: fit all)")
    parser.add_argument("--write-preset", action="store_true", help="write the constants into sim/machines/h200.json")
    parser.add_argument("--json", help="write every row and the summary as JSON")
    parser.add_argument("--markdown", help="write the table as markdown")
    args = parser.parse_args()
    from flashlab import sim  # noqa: PLC0415 (the build tree's package, on PYTHONPATH)

    with open(PRESET) as file:
        preset_constants = json.load(file)["time_model"]["kernels"]
    refit = set(args.refit or MEASUREMENTS)
    report = {"format": "flashlab-time-model-calibration", "version": 2, "machine": "h200",
              "command": "python3 scripts/calibrate_time_model.py " + " ".join(sys.argv[1:]),
              "calibration_seqlens": sorted(CALIBRATION_SEQLENS), "kernels": {}, "rows": []}
    for key in MEASUREMENTS:
        rows = measured_rows(key)
        runs = [benchmark_run(sim, row) for row in rows]
        calibration = [(i, r) for i, r in enumerate(rows) if r["calibration"]]
        if key not in refit:
            constants = preset_constants[key]
        elif key == "fa1_forward":
            # FA1's steps wait on their round trips: its mma.sync and exp2 work are FA2's (the same
            # instructions), whose constants it takes; its own are the round trip and the block.
            shared = report["kernels"]["fa2_forward"]["constants"]
            fixed = {"tensor_efficiency": shared["tensor_efficiency"], "softmax_cycles_per_score": shared["softmax_cycles_per_score"]}
            constants = fit(runs, calibration, ["block_seconds", "round_trip_seconds"], fixed)
        else:
            head_dims = sorted({r["head_dim"] for r in rows})
            free = [("tensor_efficiency", d) for d in head_dims] + ["softmax_cycles_per_score", "block_seconds"]
            constants = fit(runs, calibration, free, {})
        errors = {"calibration": [], "held_out": []}
        for run, row in zip(runs, rows):
            time = run.time(constants)
            row.update(predicted_seconds=time["seconds"], ratio=time["seconds"] / row["measured_seconds"],
                       bound=time["bound"], kernel_seconds=time["kernel_seconds"])
            errors["calibration" if row["calibration"] else "held_out"].append(abs(row["ratio"] - 1))
            report["rows"].append(row)
        report["kernels"][key] = {"constants": constants, "fitted": key in refit, "rows": len(rows),
                                  "source": MEASUREMENTS[key][2],
                                  **{f"{part}_median_error": statistics.median(e) for part, e in errors.items() if e},
                                  **{f"{part}_max_error": max(e) for part, e in errors.items() if e}}
        print(f"{key}: {len(rows)} rows, constants {'fitted' if key in refit else 'of the preset'} {json.dumps(constants)}" +
              "; median error " + ", ".join(f"{part} {statistics.median(e):.1%}" for part, e in errors.items() if e))
    for part, flag in (("calibration", True), ("held_out", False)):
        errors = [abs(r["ratio"] - 1) for r in report["rows"] if r["calibration"] == flag]
        report[f"{part}_median_error"] = statistics.median(errors)
        report[f"{part}_rows"] = len(errors)
    print(f"all kernels: calibration median error {report['calibration_median_error']:.1%} "
          f"({report['calibration_rows']} rows), held out {report['held_out_median_error']:.1%} ({report['held_out_rows']} rows)")
    report["later_rows"] = []
    for key, names in LATER_RUNS.items():
        for name in names:
            errors = []
            for row in measured_rows(key, name):
                time = benchmark_run(sim, row).time(report["kernels"][key]["constants"])
                row.update(predicted_seconds=time["seconds"], ratio=time["seconds"] / row["measured_seconds"], bound=time["bound"])
                report["later_rows"].append(row)
                errors.append(abs(row["ratio"] - 1))
            print(f"{key} on a later run, {name} (not fitted): median error {statistics.median(errors):.1%}, "
                  f"largest {max(errors):.1%} ({len(errors)} rows)")
    report["ncu_rows"] = ncu_rows(sim, {key: k["constants"] for key, k in report["kernels"].items()})
    report["ncu_median_error"] = statistics.median(abs(r["ratio"] - 1) for r in report["ncu_rows"])
    print(f"Nsight Compute launches (not fitted): median error {report['ncu_median_error']:.1%} ({len(report['ncu_rows'])} rows)")

    if args.write_preset:
        with open(PRESET) as file:
            preset = json.load(file)
        preset["time_model"]["kernels"] = {key: rounded(k["constants"]) for key, k in report["kernels"].items()}
        preset["time_model"]["source"] = (
            "scripts/calibrate_time_model.py --write-preset: least squares on log time over the benchmark rows of seqlen "
            "512, 2048, 8192 (docs/bench/h200_bench.json, h200_hopper_forward.json, h200_fa3_backward_fa4_same_run.json); "
            "checked on 1024, 4096, 16384 and on the Nsight Compute launches of h200_ncu_model.csv (docs/bench/h200_time_model.md)")
        with open(PRESET, "w") as file:
            file.write(json.dumps(preset, indent=2) + "\n")
        print(f"wrote {PRESET}")
    if args.json:
        with open(args.json, "w") as file:
            file.write(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write(markdown(report))


def rounded(constants, digits=4):
    """The constants to `digits` significant digits (the per-head-dim efficiencies too)."""
    return {n: rounded(v, digits) if isinstance(v, dict) else float(f"{v:.{digits}g}") for n, v in constants.items()}


def markdown(report):
    lines = ["# The time model against the measured kernel times (H200)", "",
             f"`{report['command']}`; constants fitted on seqlen {', '.join(map(str, report['calibration_seqlens']))}, "
             "checked on the other rows (held out). Ratio = predicted / measured.", "",
             "| kernel | measured in | constants | calibration median / max error | held-out median / max error |",
             "| --- | --- | --- | --- | --- |"]
    for key, k in report["kernels"].items():
        constants = ", ".join(f"{n} {v}" for n, v in rounded(k["constants"], 3).items())
        origin = "" if k["fitted"] else " (the preset's, not refitted)"
        lines.append(f"| {key} | {k['source']} | {constants}{origin} | {k['calibration_median_error']:.1%} / "
                     f"{k['calibration_max_error']:.1%} | {k.get('held_out_median_error', float('nan')):.1%} / "
                     f"{k.get('held_out_max_error', float('nan')):.1%} |")
    lines += ["", f"All kernels: calibration median error {report['calibration_median_error']:.1%} "
              f"({report['calibration_rows']} rows), held-out median error {report['held_out_median_error']:.1%} "
              f"({report['held_out_rows']} rows).", "",
              "| kernel | d | causal | seqlen | set | measured ms | predicted ms | ratio | bound |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["rows"]:
        lines.append(f"| {r['kernel']} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} | {r['seqlen']} | "
                     f"{'calibration' if r['calibration'] else 'held out'} | {r['measured_seconds'] * 1e3:.3f} | "
                     f"{r['predicted_seconds'] * 1e3:.3f} | {r['ratio']:.2f} | {r['bound']} |")
    lines += ["", "## Later runs (not fitted)", "",
              "The same kernel timed in a later run (its commit's code, its tiling unchanged, another day's clocks), "
              "every row predicted with the constants above. Ratio = predicted / measured.", "",
              "| kernel | run | d | causal | seqlen | measured ms | predicted ms | ratio | bound |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["later_rows"]:
        lines.append(f"| {r['kernel']} | {r['source'].split(':')[0]} | {r['head_dim']} | {'yes' if r['causal'] else 'no'} | "
                     f"{r['seqlen']} | {r['measured_seconds'] * 1e3:.3f} | {r['predicted_seconds'] * 1e3:.3f} | "
                     f"{r['ratio']:.2f} | {r['bound']} |")
    if report["later_rows"]:
        errors = [abs(r["ratio"] - 1) for r in report["later_rows"]]
        lines += ["", f"Median error on the later runs: {statistics.median(errors):.1%}, largest {max(errors):.1%} "
                  f"({len(errors)} rows)."]
    lines += ["", "## Nsight Compute launches (not fitted)", "",
              "One launch of each main kernel under Nsight Compute with the clocks unlocked (`--clock-control none`, "
              "`scripts/device_check.sh ncu-model`, docs/bench/h200_ncu_model.csv; d 128, 16 heads, non-causal, the "
              "benchmark binaries' flash layout): single launches, not benchmark medians. Beside them the benchmark "
              "median of the same kernel and shape where a run has one (a backward's pass less the model's time of "
              "its D and dQ-conversion kernels). Ratio = predicted / measured.", "",
              "| kernel | b | seqlen | ncu ms | predicted ms | ratio | bound | benchmark ms | ncu / benchmark | predicted / benchmark |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["ncu_rows"]:
        bench = "-" if r["benchmark_kernel_seconds"] is None else f"{r['benchmark_kernel_seconds'] * 1e3:.3f}"
        over = "-" if r["ncu_over_benchmark"] is None else f"{r['ncu_over_benchmark']:.2f}"
        predicted_over = "-" if r["predicted_over_benchmark"] is None else f"{r['predicted_over_benchmark']:.2f}"
        lines.append(f"| {r['kernel']} | {r['batch']} | {r['seqlen']} | {r['ncu_seconds'] * 1e3:.3f} | "
                     f"{r['predicted_kernel_seconds'] * 1e3:.3f} | {r['ratio']:.2f} | {r['bound']} | {bench} | {over} | {predicted_over} |")
    lines += ["", f"Median error on these launches: {report['ncu_median_error']:.1%} ({len(report['ncu_rows'])} rows). "
              "Benchmark medians: " + "; ".join(sorted({f'{key} {v[0]} ({v[2]})' for key, v in BENCHMARK_OF.items()})) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
