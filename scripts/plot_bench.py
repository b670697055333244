#!/usr/bin/env python3
"""Plots a kernel benchmark JSON (scripts/bench_kernels.py's output) to a PNG: TFLOP/s against
seqlen, one panel per (pass, head dim), our kernels (FA3, FA2) next to FlashAttention-4 and SDPA's
flash and cuDNN backends, whichever the run timed; causal dashed. The matmul ceiling of the same
run is the dotted line at the top.

    python3 scripts/plot_bench.py docs/bench/h200_hopper_forward.json docs/images/h200_bench.png
"""
import json
import sys

SERIES = [("fa3", "FlashLab FA3", "tab:red"), ("fa2", "FlashLab FA2", "tab:orange"),
          ("fa4", "FlashAttention-4", "tab:purple"), ("sdpa_cudnn", "SDPA cuDNN", "tab:green"),
          ("sdpa_flash", "SDPA flash", "tab:blue")]


def main():
    if len(sys.argv) != 3:
        print("usage: plot_bench.py BENCH.json OUT.png", file=sys.stderr)
        sys.exit(2)
    with open(sys.argv[1]) as f:
        result = json.load(f)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    head_dims = sorted({r["head_dim"] for r in rows})
    passes = [p for p in ("fwd", "bwd") if any(r[p].get("fa2") or r[p].get("fa3") for r in rows)]
    figure, axes = plt.subplots(len(passes), len(head_dims), figsize=(4.2 * len(head_dims), 3.4 * len(passes)),
                                squeeze=False, sharey=True)
    ceiling = result.get("matmul_bf16_8192_tflops")
    for i, direction in enumerate(passes):
        for j, d in enumerate(head_dims):
            axis = axes[i][j]
            for causal, style in ((False, "-"), (True, "--")):
                chosen = sorted((r for r in rows if r["head_dim"] == d and r["causal"] == causal), key=lambda r: r["seqlen"])
                for key, label, color in SERIES:
                    points = [(r["seqlen"], r[direction][key]) for r in chosen if r[direction].get(key)]
                    if points:
                        axis.plot(*zip(*points), style, marker="o", markersize=3, color=color,
                                  label=label if not causal else None)
            if ceiling:
                axis.axhline(ceiling, linestyle=":", color="gray")
            axis.set_xscale("log", base=2)
            axis.set_title(f"{'forward' if direction == 'fwd' else 'backward'}, d = {d}")
            axis.set_xlabel("seqlen (16k tokens per batch)")
            if j == 0:
                axis.set_ylabel("TFLOP/s")
            axis.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    env = result.get("environment", {})
    figure.suptitle(f"{env.get('gpu', 'GPU')}, bf16; solid: non-causal, dashed: causal; dotted: bf16 matmul "
                    "ceiling of the same run", fontsize=9, x=0.01, ha="left")
    figure.tight_layout(rect=(0, 0.05, 1, 0.95))
    figure.savefig(sys.argv[2], dpi=110)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
