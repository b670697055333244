#!/usr/bin/env python3
"""A pass's time split into a per-call constant and a per-seqlen rate, from bench_kernels.py's JSON.

At a fixed number of tokens per batch (batch x seqlen), the attention kernels launch the same
number of thread blocks at every seqlen (one per key block of a KV head, or per query block: the
batch shrinks as the blocks per sequence grow), and each block's walk grows with seqlen. So a
call's time is close to

    time = constant + rate x seqlen

where the constant holds what a block pays once (its start, first loads, epilogue) times the
blocks an SM runs, the other kernels of the call (the backward's preprocess and dQ convert, which
stream the same bytes at every seqlen) and the launches, and the rate holds the steps of the walks.
Least squares over the seqlens of one head dim and mask give both, per implementation. Two
implementations with the same rate and different constants differ per block or per call; with
the same constant and different rates, per step.

Times come from the rows' TFLOP/s and the JSON's FLOP convention (forward 4 b h s^2 d, halved when
causal; backward 2.5x forward), which the script checks. A tiling that changes with seqlen inside
the fitted range (d 128's causal backward takes 80-row query blocks from 8192 queries) makes the
fit mix two rates; the residuals show how well one line holds.

Usage:
  python3 scripts/seqlen_fit.py docs/bench/h200_fa3_backward_same_run_7701a58.json \
      [--pass bwd] [--ours fa3] [--anchor fa4] [--min-seqlen 1024] [--json out.json] [--markdown out.md]
"""
import argparse
import json
import os

import argument_checks
import flop_convention

SCRIPT = "seqlen_fit.py"


def refuse(message):
    argument_checks.refuse(SCRIPT, message)


def call_microseconds(row, pass_name, tflops):
    """A call's time from its TFLOP/s under the benchmarks' FLOP convention (flop_convention.py)."""
    flops = flop_convention.flops(row["batch"], row["heads"], row["seqlen"], row["head_dim"], row["causal"],
                                  backward=pass_name == "bwd")
    return flops / (tflops * 1e12) * 1e6


def least_squares(points):
    """(constant, rate per seqlen, largest residual as a fraction of its time) of time = constant + rate x seqlen."""
    n = len(points)
    sx = sum(s for s, _ in points)
    sy = sum(t for _, t in points)
    sxx = sum(s * s for s, _ in points)
    sxy = sum(s * t for s, t in points)
    rate = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    constant = (sy - rate * sx) / n
    residual = max(abs(t - constant - rate * s) / t for s, t in points)
    return constant, rate, residual


def fits(rows, pass_name, implementations, min_seqlen=1):
    """One fit per (head dim, mask, tokens) and implementation, over the seqlens from min_seqlen that
    have a time for every implementation named; groups with fewer than 3 such seqlens are left out."""
    groups = {}
    for row in rows:
        key = (row["head_dim"], bool(row["causal"]), row["batch"] * row["seqlen"])
        groups.setdefault(key, []).append(row)
    result = []
    for (head_dim, causal, tokens), members in sorted(groups.items()):
        times = {}
        for row in sorted(members, key=lambda r: r["seqlen"]):
            if row["seqlen"] < min_seqlen:
                continue
            rates = row.get(pass_name, {})
            if all(isinstance(rates.get(name), (int, float)) and rates[name] > 0 for name in implementations):
                times[row["seqlen"]] = {name: call_microseconds(row, pass_name, rates[name]) for name in implementations}
        if len(times) < 3:
            continue
        entry = {"head_dim": head_dim, "causal": causal, "tokens": tokens, "seqlens": sorted(times)}
        for name in implementations:
            constant, rate, residual = least_squares([(s, t[name]) for s, t in sorted(times.items())])
            entry[name] = {"constant_us": constant, "us_per_1k_seqlen": rate * 1024, "largest_residual": residual}
        result.append(entry)
    return result


def markdown(source, pass_name, ours, anchor, entries):
    lines = [f"# {pass_name} time = constant + rate x seqlen: {ours} beside {anchor}", "",
             f"{os.path.basename(source)}; least squares over the seqlens at fixed tokens per batch; "
             "rate in us per 1024 of seqlen; residual: the largest of the fit's, as a share of that time", "",
             f"| d | causal | seqlens | constant {ours} | constant {anchor} | difference | rate {ours} | rate {anchor} "
             f"| rate {ours} / {anchor} | residual {ours}, {anchor} |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for e in entries:
        a, b = e[ours], e[anchor]
        seqlens = " / ".join(f"{s // 1024}k" if s % 1024 == 0 else str(s) for s in e["seqlens"])
        lines.append(f"| {e['head_dim']} | {'yes' if e['causal'] else 'no'} | {seqlens} | {a['constant_us']:.0f} "
                     f"| {b['constant_us']:.0f} | {a['constant_us'] - b['constant_us']:+.0f} | {a['us_per_1k_seqlen']:.1f} "
                     f"| {b['us_per_1k_seqlen']:.1f} | {a['us_per_1k_seqlen'] / b['us_per_1k_seqlen']:.3f} "
                     f"| {100 * a['largest_residual']:.1f} %, {100 * b['largest_residual']:.1f} % |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bench_json", help="a JSON written by scripts/bench_kernels.py")
    parser.add_argument("--pass", dest="pass_name", default="bwd", help="fwd or bwd (default bwd)")
    parser.add_argument("--ours", default="fa3", help="the implementation to fit (a column of the rows; default fa3)")
    parser.add_argument("--anchor", default="fa4", help="the one beside it (default fa4)")
    parser.add_argument("--min-seqlen", type=int, default=1,
                        help="fit the seqlens from this one up (default all): the shortest rows, whose few steps "
                             "a block's start and the launch outweigh, can bend the line")
    parser.add_argument("--json", help="write the fits here too")
    parser.add_argument("--markdown", help="write the table here too")
    args = parser.parse_args()
    if args.pass_name not in ("fwd", "bwd"):
        refuse(f"--pass {args.pass_name}: give fwd or bwd")
    if args.ours == args.anchor:
        refuse(f"--ours and --anchor are both {args.ours}: give two implementations")
    argument_checks.check_ranges(SCRIPT, [("--min-seqlen", args.min_seqlen, 1, 1 << 20)])
    argument_checks.check_output_folders(SCRIPT, (("--json", args.json), ("--markdown", args.markdown)))
    try:
        with open(args.bench_json) as f:
            bench = json.load(f)
        rows, convention = bench["rows"], bench["convention"]
    except OSError as error:
        refuse(f"{args.bench_json}: cannot read it ({error.strerror})")
    except (ValueError, KeyError, TypeError):
        refuse(f"{args.bench_json}: not a bench_kernels.py JSON (rows and convention)")
    if not str(convention).startswith(flop_convention.TEXT):
        refuse(f"{args.bench_json}: FLOP convention {convention!r}; allowed: one starting {flop_convention.TEXT!r}")
    for name in (args.ours, args.anchor):
        if not any(isinstance(row.get(args.pass_name), dict) and name in row[args.pass_name] for row in rows):
            refuse(f"--ours/--anchor {name}: no {args.pass_name} time of that name in {args.bench_json}")
    entries = fits(rows, args.pass_name, [args.ours, args.anchor], args.min_seqlen)
    if not entries:
        refuse(f"{args.bench_json}: no head dim and mask with 3 seqlens from {args.min_seqlen} at equal tokens timed "
               f"for both {args.ours} and {args.anchor}")
    table = markdown(args.bench_json, args.pass_name, args.ours, args.anchor, entries)
    print(table, end="")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"source": args.bench_json, "pass": args.pass_name, "ours": args.ours, "anchor": args.anchor,
                       "min_seqlen": args.min_seqlen, "fits": entries}, f, indent=1)


if __name__ == "__main__":
    main()
