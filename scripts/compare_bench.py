#!/usr/bin/env python3
"""Candidate changes set beside the base, from one run of scripts/bench_kernels.py with --variant
NAME=PATH: per problem, the base's FA2 (TFLOP/s), each variant's speed-up over it, and every
build's ratio to SDPA flash, all timed in the same interleaved rounds.

Usage: compare_bench.py RESULT.json
"""
import json
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: compare_bench.py RESULT.json", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        rows = json.load(f)["rows"]
    variants = sorted({name for r in rows for x in (r["fwd"], r["bwd"]) for name in x if name.startswith("fa2@")})
    if not variants:
        print("compare_bench.py: the result has no fa2@NAME variants (run bench_kernels.py with --variant)",
              file=sys.stderr)
        sys.exit(2)
    header = ["pass", "d", "causal", "seqlen", "base", "base / flash"]
    for name in variants:
        header += [name[4:], f"{name[4:]} / base", f"{name[4:]} / flash"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.3f}"
    for direction in ("fwd", "bwd"):
        for r in rows:
            x = r[direction]
            if x.get("fa2") is None:
                continue
            cells = [direction, str(r["head_dim"]), "yes" if r["causal"] else "no", str(r["seqlen"]),
                     f"{x['fa2']:.0f}", ratio(x["fa2"], x.get("sdpa_flash"))]
            for name in variants:
                value = x.get(name)
                cells += ["-" if value is None else f"{value:.0f}", ratio(value, x["fa2"]), ratio(value, x.get("sdpa_flash"))]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
