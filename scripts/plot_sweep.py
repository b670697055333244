#!/usr/bin/env python3
"""Plots a flashlab sweep or experiment JSON (schema: sim/sweep.hpp) to a PNG.

    python3 scripts/plot_sweep.py build/experiment/experiment.json build/experiment/experiment.png

Panels: HBM traffic against N (at one d and M) and against M (at one N and d) for every
schedule, each with its Theta bound drawn dashed through the schedule's middle point (the bound
has no constant, so the dashed line shows the slope the theory predicts); with an experiment
file, a third panel: the Saha-Ye crossover (FA1, FA2 and square tiling against M / d^2, and
the lower bound min(N^2 d / sqrt(M), N^2 d^2 / M)).
"""
import collections
import json
import math
import sys


def groups(points, variable):
    """(schedule, mask, fixed values) -> [(x, bytes, bound)] along one variable."""
    key_of = {
        "N": lambda p: (p["head_dim"], p["sram_bytes"]),
        "M": lambda p: (p["seqlen"], p["head_dim"]),
        "d": lambda p: (p["seqlen"], p["sram_bytes"]),
    }[variable]
    x_of = {"N": "seqlen", "M": "sram_bytes", "d": "head_dim"}[variable]
    result = collections.defaultdict(list)
    for p in points:
        if p["status"] != "ok":
            continue
        result[(p["schedule"], p["mask"], key_of(p))].append((p[x_of], p["hbm_bytes"], p["bound"]["elements"]))
    return {k: sorted(v) for k, v in result.items() if len({x for x, _, _ in v}) >= 3}


def draw(axis, series, xlabel, title):
    import matplotlib.pyplot as plt
    axis.set_prop_cycle(color=[plt.cm.tab20(i) for i in range(0, 20, 2)] + [plt.cm.tab20(i) for i in range(1, 20, 2)])
    colors = {}
    for (schedule, mask, fixed), rows in sorted(series.items()):
        label = schedule if mask == "none" else f"{schedule} ({mask})"
        x = [r[0] for r in rows]
        y = [r[1] for r in rows]
        line, = axis.loglog(x, y, "o-", label=label, markersize=3)
        colors[label] = line.get_color()
        middle = rows[len(rows) // 2]
        scale = middle[1] / middle[2]  # bound through the middle point
        axis.loglog(x, [r[2] * scale for r in rows], "--", color=line.get_color(), linewidth=0.8)
    axis.set_xlabel(xlabel)
    axis.set_ylabel("HBM traffic (bytes)")
    axis.set_title(title, fontsize=9)
    axis.grid(True, which="both", linewidth=0.3)
    axis.legend(fontsize=6)


def pick(series):
    """The fixed values with the most series (one panel per variable)."""
    by_fixed = collections.Counter(fixed for _, _, fixed in series)
    if not by_fixed:
        return {}
    best = by_fixed.most_common(1)[0][0]
    return {k: v for k, v in series.items() if k[2] == best}, best


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_sweep.py SWEEP_OR_EXPERIMENT.json OUT.png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_sweep.py: matplotlib is not installed (bash scripts/install-deps.sh installs it)")
    with open(sys.argv[1]) as file:
        data = json.load(file)
    if data.get("format") not in ("flashlab-sweep", "flashlab-experiment"):
        sys.exit(f"plot_sweep.py: {sys.argv[1]} is not a flashlab sweep or experiment file")
    points = data["points"]
    crossover = data.get("crossover")
    panels = 2 + (1 if crossover else 0)
    figure, axes = plt.subplots(1, panels, figsize=(6 * panels, 5))
    machine = data.get("machine") or {}
    n_series = pick(groups(points, "N"))
    if n_series:
        series, (d, m) = n_series
        draw(axes[0], series, "N (sequence length)", f"traffic vs N at d = {d}, M = {m} B; dashed: Theta bound")
    m_series = pick(groups(points, "M"))
    if m_series:
        series, (n, d) = m_series
        draw(axes[1], series, "M (SRAM bytes)", f"traffic vs M at N = {n}, d = {d}; dashed: Theta bound")
    if crossover:
        rows = crossover["rows"]
        axis = axes[2]
        x = [r["m_over_d2"] for r in rows]
        for key, label in (("fa1_bytes", "FA1"), ("fa2_bytes", "FA2"), ("square_tiling_bytes", "square tiling")):
            xs = [xi for xi, r in zip(x, rows) if r[key] > 0]
            axis.loglog(xs, [r[key] for r in rows if r[key] > 0], "o-", label=label, markersize=3)
        n, d = crossover["seqlen"], crossover["head_dim"]
        bound = [n * n * d * min(1 / math.sqrt(xi * d * d), d / (xi * d * d)) for xi in x]
        scale = rows[-1]["fa2_bytes"] / bound[-1]
        axis.loglog(x, [b * scale for b in bound], "k--", linewidth=0.8, label="lower bound (Saha-Ye Thm 3.1), scaled")
        axis.axvline(1.0, color="grey", linewidth=0.5)
        axis.set_xticks(x)
        axis.set_xticklabels([f"1/{round(1 / xi)}" if xi < 1 else f"{xi:g}" for xi in x])
        axis.minorticks_off()
        axis.set_xlabel("M / d^2")
        axis.set_ylabel("HBM traffic (bytes)")
        axis.set_title(f"Saha-Ye crossover at N = {n}, d = {d}", fontsize=9)
        axis.grid(True, which="both", linewidth=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(f"FlashLab: counted HBM traffic ({machine.get('name', 'no machine')}, {data.get('dtype')})", fontsize=10)
    figure.tight_layout()
    figure.savefig(sys.argv[2], dpi=120)
    print(f"wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
