#!/usr/bin/env python3
"""The three-level model (flashlab hardware) beside Nsight Compute's counts of the same kernels.

  collect LOGDIR --csv OUT.csv [--json OUT.json]
      reads the logs of `scripts/device_check.sh ncu-model` (ncu_model_<kernel>_<direction>_b<B>_s<S>.log,
      ncu --metrics output) into one row per kernel launch; needs no flashlab package (it runs on the
      GPU machine).
  compare CSV --markdown OUT.md --json OUT.json
      runs the model on each row's problem (bf16 or FA1's fp16, d 128, 16 heads, the benchmark binaries'
      flash layout) and sets its DRAM read and write bytes, L2 -> SM bytes, SM -> L2 write sectors of
      the stores and of the reductions (atomics, bulk reductions: counted apart, as Nsight Compute's
      op_write and op_red sectors are) and kernel time beside the measured ones (ratio = model /
      measured; a metric the run did not collect shows the model alone), with the bound the model
      names and the unit Nsight Compute shows busiest. The times are single launches with the
      clocks unlocked, not benchmark medians (docs/bench/h200_time_model.md sets both beside the model).
  committed --markdown OUT.md --json OUT.json
      the same from the Nsight Compute logs committed in docs/bench/ (FA1 b 4 s 4096; FA2 forward b 16
      s 1024 and b 1 s 16384, and b 4 s 4096 from docs/kernels.md's table; the FA3 forward's persistent
      grid at b 4 s 4096, non-causal and causal before the L2 sections; the first FA3 backward's
      DRAM bytes at d 64 and 128), each with its source.

Run `compare` and `committed` with the build tree's package: PYTHONPATH=build/release/python.
"""
import argparse
import csv
import json
import os
import re
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "docs", "bench")
METRICS = {  # Nsight Compute metric -> the column it fills
    "dram__bytes_read.sum": "dram_read_bytes",
    "dram__bytes_write.sum": "dram_write_bytes",
    "l1tex__m_xbar2l1tex_read_bytes.sum": "l2_to_sm_bytes",
    "lts__t_sectors_srcunit_tex_op_write.sum": "sm_to_l2_write_sectors",
    "lts__t_sectors_srcunit_tex_op_red.sum": "sm_to_l2_reduction_sectors",
    "smsp__cycles_elapsed.avg.per_second": "sm_clock_hz",
    "gpu__time_duration.sum": "seconds",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pct",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pct",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active": "xu_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "lts__t_sectors.avg.pct_of_peak_sustained_elapsed": "l2_pct",
}
UNITS = {"": 1, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "sector": 1, "%": 1,
         "ns": 1e-9, "us": 1e-6, "usecond": 1e-6, "ms": 1e-3, "msecond": 1e-3, "s": 1, "second": 1, "nsecond": 1e-9,
         "cycle/nsecond": 1e9, "cycle/usecond": 1e6, "cycle/second": 1, "Ghz": 1e9, "Mhz": 1e6, "hz": 1}
NAME = re.compile(r"ncu_model_(fa[123])_(forward|backward)_b(\d+)_s(\d+)\.log$")
COMPARED = ("dram_read_bytes", "dram_write_bytes", "l2_to_sm_bytes", "sm_to_l2_write_sectors", "sm_to_l2_reduction_sectors",
            "seconds")
SHOWN_UNMEASURED = ("sm_to_l2_reduction_sectors",)  # shown with the model's count where the run did not collect it


def parse_log(path):
    """The metric values of one `ncu --metrics` log, in bytes, sectors, seconds and percent."""
    values = {}
    with open(path, errors="replace") as file:
        for line in file:
            match = re.match(r"\s+([a-z0-9_]+__\S+)\s+(?:(\S+)\s+)?([\d,.]+)\s*$", line)
            if match and match.group(1) in METRICS and (match.group(2) or "") in UNITS:
                values[METRICS[match.group(1)]] = float(match.group(3).replace(",", "")) * UNITS[match.group(2) or ""]
    return values


def collect(log_dir):
    rows = []
    for name in sorted(os.listdir(log_dir)):
        match = NAME.match(name)
        if not match:
            continue
        generation, direction, batch, seqlen = match.group(1), match.group(2), int(match.group(3)), int(match.group(4))
        row = {"kernel": generation, "direction": direction, "batch": batch, "heads": 16, "seqlen": seqlen,
               "head_dim": 128, "causal": False, "dtype": "fp16" if generation == "fa1" else "bf16",
               "source": name, **parse_log(os.path.join(log_dir, name))}
        rows.append(row)
    return rows


def ncu_bound(row):
    """The unit Nsight Compute shows busiest of those it measured (tensor pipe, exp: the XU pipe, dram,
    l2; DRAM from its bytes over the time at the 4.27 TB/s copy rate where its percentage was not
    collected), "latency" when none reaches 20 % of its peak."""
    parts = {"tensor": row.get("tensor_pct"), "exp": row.get("xu_pct"), "dram": row.get("dram_pct"), "l2": row.get("l2_pct")}
    if parts["dram"] is None and row.get("seconds") and row.get("dram_read_bytes") is not None:
        parts["dram"] = 100 * (float(row["dram_read_bytes"]) + float(row.get("dram_write_bytes") or 0)) / float(row["seconds"]) / 4.27e12
    parts = {k: float(v) for k, v in parts.items() if v not in (None, "")}
    if not parts:
        return None
    unit, value = max(parts.items(), key=lambda kv: kv[1])
    return f"{unit if value >= 20 else 'latency'} ({unit} {value:.0f} %)"


def model_row(sim, row, **options):
    problem = sim.problem(seqlen_q=int(row["seqlen"]), head_dim=int(row["head_dim"]), batch=int(row["batch"]),
                          heads_q=int(row["heads"]), causal=str(row["causal"]) in ("True", "true", "1"), dtype=row["dtype"])
    record = sim.hardware(row["kernel"], problem, direction=row["direction"], **options)
    return {"dram_read_bytes": record["l2"]["dram_read_bytes"], "dram_write_bytes": record["l2"]["dram_write_bytes"],
            "l2_to_sm_bytes": record["l2"]["l2_to_sm_bytes"], "sm_to_l2_write_sectors": record["l2"]["sm_to_l2_write_sectors"],
            "sm_to_l2_reduction_sectors": record["l2"]["sm_to_l2_reduction_sectors"],
            "seconds": record["time"]["kernel_seconds"] if record["time"] else None,
            "bound": record["time"]["bound"] if record["time"] else None,
            "dram_total_bytes": record["l2"]["dram_read_bytes"] + record["l2"]["dram_write_bytes"]}


def compare(rows, sim):
    out = []
    for row in rows:
        options = {k: row[k] for k in ("l2_sections",) if k in row}
        model = model_row(sim, row, **options)
        entry = {"kernel": f"{row['kernel']} {row['direction']}", "batch": int(row["batch"]), "seqlen": int(row["seqlen"]),
                 "head_dim": int(row["head_dim"]), "causal": str(row["causal"]) in ("True", "true", "1"),
                 "source": row["source"], "model_bound": model["bound"], "ncu_bound": ncu_bound(row), "metrics": {}}
        for column in COMPARED + ("dram_total_bytes",):
            measured = row.get(column)
            if measured in (None, ""):
                if column in SHOWN_UNMEASURED and model[column]:
                    entry["metrics"][column] = {"model": model[column], "measured": None, "ratio": None}
                continue
            measured = float(measured)
            entry["metrics"][column] = {"model": model[column], "measured": measured,
                                        "ratio": model[column] / measured if measured and model[column] is not None else None}
        if row.get("note"):
            entry["note"] = row["note"]
        out.append(entry)
    return out


def summary(entries):
    """The largest |ratio - 1| of each traffic column, and the median of the time's."""
    result = {}
    for column in COMPARED + ("dram_total_bytes",):
        ratios = [e["metrics"][column]["ratio"] for e in entries if column in e["metrics"] and e["metrics"][column]["ratio"]]
        if ratios:
            result[column] = {"rows": len(ratios), "max_error": max(abs(r - 1) for r in ratios),
                              "median_error": statistics.median(abs(r - 1) for r in ratios)}
    return result


def fmt(column, value):
    if value is None:
        return "-"
    if column == "seconds":
        return f"{value * 1e3:.3f} ms"
    if column in ("sm_to_l2_write_sectors", "sm_to_l2_reduction_sectors"):
        return f"{value / 1e6:.2f} M"
    return f"{value / 1e9:.3f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"


def markdown(entries, title):
    lines = [f"# {title}", "", "Ratio = model / measured. Model: `flashlab hardware` (sim/hierarchy.hpp, sim/time_model.hpp) on the "
             "H200 preset; measured: Nsight Compute, `--clock-control none`, one launch per row; \"-\": a metric the "
             "run did not collect.", "",
             "| kernel | b | s | causal | metric | model | measured | ratio | source |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    names = {"dram_read_bytes": "DRAM read", "dram_write_bytes": "DRAM written", "dram_total_bytes": "DRAM read + written",
             "l2_to_sm_bytes": "L2 -> SM", "sm_to_l2_write_sectors": "SM -> L2 write sectors (stores)",
             "sm_to_l2_reduction_sectors": "SM -> L2 reduction sectors", "seconds": "kernel time (one launch)"}
    for e in entries:
        for column, m in e["metrics"].items():
            if column == "dram_total_bytes" and "dram_read_bytes" in e["metrics"]:
                continue
            ratio = "-" if m["ratio"] is None else f"{m['ratio']:.2f}"
            lines.append(f"| {e['kernel']} | {e['batch']} | {e['seqlen']} | {'yes' if e['causal'] else 'no'} | {names[column]} | "
                         f"{fmt(column, m['model'])} | {fmt(column, m['measured'])} | {ratio} | {e['source']} |")
        lines.append(f"| {e['kernel']} | {e['batch']} | {e['seqlen']} | {'yes' if e['causal'] else 'no'} | bound | "
                     f"{e['model_bound']} | {e['ncu_bound'] or '-'} | | {e.get('note', '')} |")
    lines += ["", "| metric | rows | median error | largest error |", "| --- | --- | --- | --- |"]
    for column, s in summary(entries).items():
        lines.append(f"| {names[column]} | {s['rows']} | {s['median_error']:.1%} | {s['max_error']:.1%} |")
    return "\n".join(lines) + "\n"


def committed_rows():
    """The Nsight Compute measurements already in docs/bench/, as rows of collect()'s shape."""
    rows = []
    for name, kernel, batch, seqlen, dtype in (("h200_ncu_fa1_b4_s4096.txt", "fa1", 4, 4096, "fp16"),
                                               ("h200_ncu_fa2_b16_s1024.txt", "fa2", 16, 1024, "bf16"),
                                               ("h200_ncu_fa2_b1_s16384.txt", "fa2", 1, 16384, "bf16")):
        rows.append({"kernel": kernel, "direction": "forward", "batch": batch, "heads": 16, "seqlen": seqlen, "head_dim": 128,
                     "causal": False, "dtype": dtype, "source": f"docs/bench/{name}",
                     **parse_log(os.path.join(BENCH, name))})
    rows.append({"kernel": "fa2", "direction": "forward", "batch": 4, "heads": 16, "seqlen": 4096, "head_dim": 128,
                 "causal": False, "dtype": "bf16", "source": "docs/kernels.md (IO model vs hardware, FA1 vs FA2; its log not kept)",
                 "dram_read_bytes": 0.205e9, "dram_write_bytes": 0.057e9, "seconds": 1.54e-3, "tensor_pct": 56.5})
    for causal in (0, 1):
        name = f"h200_ncu_fa3_persistent_causal{causal}.txt"
        rows.append({"kernel": "fa3", "direction": "forward", "batch": 4, "heads": 16, "seqlen": 4096, "head_dim": 128,
                     "causal": bool(causal), "dtype": "bf16", "source": f"docs/bench/{name}", "l2_sections": False,
                     "note": "persistent grid; causal: longest first over every head (before the L2 sections)",
                     **parse_log(os.path.join(BENCH, name))})
    for d, heads in ((128, 16), (64, 32)):
        name = f"h200_ncu_fa3_backward_d{d}_s4096.txt"
        with open(os.path.join(BENCH, name)) as file:
            text = file.read()
        duration = float(re.search(r"Duration\s+ms\s+([\d.]+)", text).group(1)) * 1e-3
        throughput = float(re.search(r"Memory Throughput\s+Gbyte/s\s+([\d.]+)", text).group(1)) * 1e9
        percent = {key: float(re.search(pattern, text).group(1)) for key, pattern in
                   (("tensor_pct", r"Tensor is the highest-utilized pipeline \(([\d.]+)%\)"),
                    ("dram_pct", r"DRAM Throughput\s+%\s+([\d.]+)"), ("l2_pct", r"L2 Cache Throughput\s+%\s+([\d.]+)"))}
        rows.append({"kernel": "fa3", "direction": "backward", "batch": 4, "heads": heads, "seqlen": 4096, "head_dim": d,
                     "causal": False, "dtype": "bf16", "source": f"docs/bench/{name}", "dram_total_bytes": throughput * duration,
                     **percent,
                     "note": "DRAM bytes from Memory Throughput x Duration; the first version of the kernel (its time not compared)"})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["collect", "compare", "committed"])
    parser.add_argument("input", nargs="?", help="collect: the log directory; compare: the CSV")
    parser.add_argument("--csv")
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    if args.mode == "collect":
        if not args.input or not os.path.isdir(args.input):
            print(f"model_vs_ncu.py collect: '{args.input}' is not a directory of ncu_model_*.log", file=sys.stderr)
            return 2
        rows = collect(args.input)
        columns = ["kernel", "direction", "batch", "heads", "seqlen", "head_dim", "causal", "dtype", "source"] + \
                  sorted({v for v in METRICS.values()})
        with open(args.csv or os.path.join(args.input, "ncu_model.csv"), "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            for row in rows:
                writer.writerow({c: row.get(c, "") for c in columns})
        if args.json:
            with open(args.json, "w") as file:
                json.dump(rows, file, indent=1)
        print(f"{len(rows)} kernel launches collected")
        return 0
    from flashlab import sim  # noqa: PLC0415
    if args.mode == "compare":
        if not args.input or not os.path.isfile(args.input):
            print(f"model_vs_ncu.py compare: '{args.input}' is not a CSV written by collect", file=sys.stderr)
            return 2
        with open(args.input) as file:
            rows = [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(file)]
        entries = compare(rows, sim)
        title = "The three-level model against Nsight Compute (scripts/device_check.sh ncu-model)"
    else:
        entries = compare(committed_rows(), sim)
        title = "The three-level model against the Nsight Compute logs in docs/bench"
    report = {"format": "flashlab-model-vs-ncu", "version": 1, "command": " ".join(sys.argv), "rows": entries,
              "summary": summary(entries)}
    text = markdown(entries, title)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write(text)
    if args.json:
        with open(args.json, "w") as file:
            file.write(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
