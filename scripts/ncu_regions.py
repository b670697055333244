#!/usr/bin/env python3
"""Where a kernel's warps wait, region by region of its SASS.

Reads Nsight Compute's per-instruction page (`ncu -i REPORT --page source --csv --print-source sass`)
and sums the warp stall samples of one kernel over address ranges of its code (offsets from the
kernel's first instruction, as `cuobjdump -sass` prints them), with each range's instructions per
pass and its stall reasons. Samples not given a reason in the page's columns are listed as
"other" (the wgmma wait, among them). Usage:

    python3 scripts/ncu_regions.py ncu_bwd_ours_sass.csv --kernel fa3_backward_kernel \\
        --bounds 1d40 2080 40f0 5050 5090 52e0 5500 --names head exp dS barrier dQ/dK staging \\
        [--passes 1048576]

--passes divides each range's executed warp instructions (e.g. the consumer warps' query blocks).
--opcodes N then lists the N opcodes (the mnemonic without its predicate and suffixes) with the
most executed warp instructions over the ranges, in millions.
--max-executions N counts only the instructions executed at most N times (e.g. 12 warps x 2048
blocks: what runs once per warp and block, a block's start and end). The page may be gzipped
(a name ending in .gz).
"""
import argparse
import collections
import csv
import gzip
import re
import sys

from sass_loop_mix import opcode


def kernel_rows(path, pattern):
    """The per-instruction rows of the first kernel whose name matches `pattern`."""
    rows, name, header = [], None, None
    with (gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")) as f:
        for record in csv.reader(f):
            if record and record[0] == "Kernel Name":
                if rows:
                    break
                name, header = record[1], None
            elif record and record[0] == "Address":
                header = record
            elif name is not None and header is not None and re.search(pattern, name):
                rows.append(dict(zip(header, record)))
    return rows


def number(text):
    try:
        return float(text)
    except ValueError:
        return 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--kernel", required=True, help="regex on the kernel's name")
    parser.add_argument("--bounds", nargs="+", required=True, help="hex offsets: range i is [bounds[i], bounds[i+1])")
    parser.add_argument("--names", nargs="*", default=[])
    parser.add_argument("--passes", type=float, default=1.0)
    parser.add_argument("--reasons", type=int, default=6, help="stall reasons listed per range")
    parser.add_argument("--max-executions", type=float, default=None,
                        help="count only instructions executed at most this many times")
    parser.add_argument("--opcodes", type=int, default=0, help="list the N opcodes executed most over the ranges")
    args = parser.parse_args()
    try:
        bounds = [int(b, 16) for b in args.bounds]
    except ValueError:
        print(f"ncu_regions: --bounds must be hex offsets, got {args.bounds}", file=sys.stderr)
        sys.exit(2)
    if len(bounds) < 2 or any(a >= b for a, b in zip(bounds, bounds[1:])):
        print("ncu_regions: --bounds needs at least two increasing offsets", file=sys.stderr)
        sys.exit(2)
    if len(args.names) > len(bounds) - 1:
        print(f"ncu_regions: --names gives {len(args.names)} names; allowed: at most one per range ({len(bounds) - 1})",
              file=sys.stderr)
        sys.exit(2)
    if args.passes <= 0:
        print(f"ncu_regions: --passes = {args.passes:g}; allowed: more than 0", file=sys.stderr)
        sys.exit(2)
    if args.opcodes < 0:
        print(f"ncu_regions: --opcodes = {args.opcodes}; allowed: 0 or more", file=sys.stderr)
        sys.exit(2)
    if args.max_executions is not None and args.max_executions < 0:
        print(f"ncu_regions: --max-executions = {args.max_executions:g}; allowed: 0 or more", file=sys.stderr)
        sys.exit(2)
    try:
        rows = kernel_rows(args.csv, args.kernel)
    except (OSError, EOFError) as error:
        print(f"ncu_regions: {args.csv}: {getattr(error, 'strerror', None) or error}", file=sys.stderr)
        sys.exit(2)
    if not rows:
        print(f"ncu_regions: no kernel matching '{args.kernel}' in {args.csv}", file=sys.stderr)
        sys.exit(2)
    base = int(rows[0]["Address"], 16)
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    ranges = len(bounds) - 1
    names = args.names + [f"{bounds[i]:05x}-{bounds[i + 1]:05x}" for i in range(len(args.names), ranges)]
    samples, executed = [0.0] * ranges, [0.0] * ranges
    why = [collections.Counter() for _ in range(ranges)]
    by_opcode = collections.Counter()
    total = 0.0
    for row in rows:
        offset, count = int(row["Address"], 16) - base, number(row["Warp Stall Sampling (All Samples)"])
        total += count
        if args.max_executions is not None and number(row["Instructions Executed"]) > args.max_executions:
            continue
        for i in range(ranges):
            if bounds[i] <= offset < bounds[i + 1]:
                samples[i] += count
                executed[i] += number(row["Instructions Executed"])
                by_opcode[opcode(row["Source"])] += number(row["Instructions Executed"])
                named = 0.0
                for k in reasons:
                    why[i][k[len("stall_"):]] += number(row[k])
                    named += number(row[k])
                why[i]["other"] += count - named
    print(f"kernel matching {args.kernel!r}: {total:.0f} stall samples in all")
    print("| range | offsets | samples | share | instructions per pass | top reasons |")
    print("| --- | --- | --- | --- | --- | --- |")
    for i in range(ranges):
        top = ", ".join(f"{k} {v:.0f}" for k, v in why[i].most_common(args.reasons) if v > 0)
        print(f"| {names[i]} | {bounds[i]:05x}-{bounds[i + 1]:05x} | {samples[i]:.0f} | {100 * samples[i] / total:.1f} % "
              f"| {executed[i] / args.passes:.0f} | {top} |")
    if args.opcodes:
        print()
        print("| opcode | executed warp instructions (millions) |")
        print("| --- | --- |")
        for name, count in by_opcode.most_common(args.opcodes):
            print(f"| {name} | {count / 1e6:.2f} |")


if __name__ == "__main__":
    main()
