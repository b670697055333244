#!/usr/bin/env python3
"""Candidate changes set beside the base, from one run of scripts/bench_kernels.py with --variant
NAME=PATH: per problem and generation (FA2, FA3, and FA3's deterministic mode with --deterministic,
set beside the default mode), the base's TFLOP/s, each variant's speed-up over
it, and every build's ratio to the anchors (cuDNN and FlashAttention-4 for FA3, SDPA flash for FA2),
all timed in the same interleaved rounds.

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
    printed = False
    for generation, anchors in (("fa2", ["sdpa_flash"]), ("fa3", ["sdpa_cudnn", "fa4"]),
                                ("fa3_deterministic", ["fa3", "sdpa_cudnn"])):
        prefix = generation + "@"
        variants = sorted({name for r in rows for x in (r["fwd"], r["bwd"]) for name in x if name.startswith(prefix)})
        if not variants:
            continue
        anchors = [a for a in anchors if any(x.get(a) for r in rows for x in (r["fwd"], r["bwd"]))]
        printed = True
        header = ["pass", "d", "causal", "seqlen", generation] + [f"{generation} / {a}" for a in anchors]
        for name in variants:
            label = name[len(prefix):]
            header += [label, f"{label} / base"] + [f"{label} / {a}" for a in anchors]
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.3f}"
        for direction in ("fwd", "bwd"):
            for r in rows:
                x = r[direction]
                if x.get(generation) is None:
                    continue
                cells = [direction, str(r["head_dim"]), "yes" if r["causal"] else "no", str(r["seqlen"]),
                         f"{x[generation]:.0f}"] + [ratio(x[generation], x.get(a)) for a in anchors]
                for name in variants:
                    value = x.get(name)
                    cells += ["-" if value is None else f"{value:.0f}", ratio(value, x[generation])]
                    cells += [ratio(value, x.get(a)) for a in anchors]
                print("| " + " | ".join(cells) + " |")
        print()
    if not printed:
        print("compare_bench.py: the result has no fa2@NAME or fa3@NAME variants (run bench_kernels.py with --variant)",
              file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
