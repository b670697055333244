#!/usr/bin/env python3
"""Candidate changes set beside the base, from one run of scripts/bench_kernels.py with --variant
NAME=PATH: per problem and generation (FA2, FA3, and FA3's deterministic mode with --deterministic,
set beside the default mode), the base's TFLOP/s, each variant's speed-up over
it, and every build's ratio to the anchors (cuDNN and FlashAttention-4 for FA3, SDPA flash for FA2),
all timed in the same interleaved rounds. Then, per pass and head dim (and band of seqlens, split at
each --split-at), each variant's speed-up over the base as the geometric mean of its rows and their
range: beside the control's (an unchanged copy of the base), the run's noise floor.

Usage: compare_bench.py RESULT.json [--split-at SEQLEN ...]
"""
import argparse
import json
import math

import argument_checks

SCRIPT = "compare_bench.py"


def seqlen_label(seqlen):
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def speedup_summary(rows, generation, variants, split_at):
    """Rows of (pass, d, seqlens, {variant: (geometric mean, lowest, highest)}) of variant / base,
    over the rows where both were timed, grouped by pass, head dim and band of seqlens."""
    groups = {}
    for direction in ("fwd", "bwd"):
        for r in rows:
            x = r[direction]
            if not x.get(generation):
                continue
            band = sum(r["seqlen"] >= s for s in split_at)
            groups.setdefault((direction, r["head_dim"], band), []).append((r["seqlen"], x))
    summary = []
    for (direction, head_dim, _), members in sorted(groups.items(), key=lambda g: (g[0][0] == "bwd", g[0][1], g[0][2])):
        seqlens = sorted({s for s, _ in members})
        speedups = {}
        for name in variants:
            ratios = [x[name] / x[generation] for _, x in members if x.get(name)]
            if ratios:
                mean = math.exp(sum(math.log(v) for v in ratios) / len(ratios))
                speedups[name] = (mean, min(ratios), max(ratios))
        summary.append((direction, head_dim, seqlens, speedups))
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", help="a JSON written by scripts/bench_kernels.py with --variant")
    parser.add_argument("--split-at", type=int, nargs="+", default=[],
                        help="the summary's bands of seqlens start at each of these (default one band)")
    args = parser.parse_args()
    argument_checks.check_ranges(SCRIPT, [("--split-at", s, 2, 1 << 20) for s in args.split_at])
    split_at = sorted(set(args.split_at))
    try:
        with open(args.result) as f:
            rows = json.load(f)["rows"]
        well_formed = isinstance(rows, list) and all(
            isinstance(r, dict) and isinstance(r.get("fwd"), dict) and isinstance(r.get("bwd"), dict)
            and isinstance(r.get("head_dim"), int) and isinstance(r.get("seqlen"), int) and "causal" in r for r in rows)
    except OSError as error:
        argument_checks.refuse(SCRIPT, f"{args.result}: cannot read it ({error.strerror})")
    except (ValueError, KeyError, TypeError):
        well_formed = False
    if not well_formed:
        argument_checks.refuse(SCRIPT, f"{args.result}: not a bench_kernels.py JSON (rows with fwd, bwd, head_dim, "
                                       "causal, seqlen)")
    printed = False
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.3f}"
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
        labels = [name[len(prefix):] for name in variants]
        print(f"Each variant / {generation}: the geometric mean of its rows (their lowest-highest)")
        print()
        print("| pass | d | seqlens | " + " | ".join(labels) + " |")
        print("|" + " --- |" * (3 + len(labels)))
        for direction, head_dim, seqlens, speedups in speedup_summary(rows, generation, variants, split_at):
            cells = [direction, str(head_dim), ", ".join(seqlen_label(s) for s in seqlens)]
            cells += [f"{speedups[n][0]:.3f} ({speedups[n][1]:.3f}-{speedups[n][2]:.3f})" if n in speedups else "-"
                      for n in variants]
            print("| " + " | ".join(cells) + " |")
        print()
    if not printed:
        argument_checks.refuse(SCRIPT, "the result has no fa2@NAME or fa3@NAME variants (run bench_kernels.py with --variant)")


if __name__ == "__main__":
    main()
