#!/usr/bin/env python3
"""Two runs of scripts/bench_kernels.py side by side: our kernel in each (TFLOP/s), the variant's
speed-up over the base, and each run's ratio to SDPA flash measured in that same run.

Usage: compare_bench.py BASE.json VARIANT.json
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print("usage: compare_bench.py BASE.json VARIANT.json", file=sys.stderr)
        sys.exit(2)
    runs = []
    for path in sys.argv[1:]:
        with open(path) as f:
            runs.append({(r["head_dim"], r["causal"], r["seqlen"]): r for r in json.load(f)["rows"]})
    base, variant = runs
    print("| pass | d | causal | seqlen | base | variant | variant / base | base / flash | variant / flash |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for direction in ("fwd", "bwd"):
        for key in sorted(base.keys() & variant.keys()):
            b, v = base[key][direction], variant[key][direction]
            if "fa2" not in b or "fa2" not in v:
                continue
            d, causal, seqlen = key
            print(f"| {direction} | {d} | {'yes' if causal else 'no'} | {seqlen} | {b['fa2']:.0f} | {v['fa2']:.0f} | "
                  f"{v['fa2'] / b['fa2']:.3f} | {b['fa2'] / b['sdpa_flash']:.3f} | {v['fa2'] / v['sdpa_flash']:.3f} |")


if __name__ == "__main__":
    main()
