#!/usr/bin/env python3
"""What a shape-only sweep point costs: wall time against the number of tile pairs it visits.

Runs `flashlab sweep` (serially, --jobs 1) a few times over N and M for fa1, fa2 and standard
attention at d = 128, bf16, keeps each point's fastest wall time, and prints the table the README
quotes: tile pairs = ceil(N / Br) x ceil(N / Bc), seconds, and nanoseconds per tile pair.

    python3 scripts/sweep_cost.py build/release/sim/flashlab [--repeats 3]
"""
import argparse
import json
import math
import os
import subprocess
import tempfile

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("flashlab")
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--seqlens", default="1024,4096,16384,65536,131072")
parser.add_argument("--sram", default="16K,228K")
args = parser.parse_args()

best = {}
with tempfile.TemporaryDirectory() as work:
    path = os.path.join(work, "sweep.json")
    for _ in range(args.repeats):
        subprocess.run([args.flashlab, "sweep", "--schedules", "standard,fa1,fa2", "--seqlens", args.seqlens, "--head-dims", "128",
                        "--sram", args.sram, "--quiet", "--json", path], check=True, stdout=subprocess.DEVNULL)
        with open(path) as f:
            for p in json.load(f)["points"]:
                key = (p["schedule"], p["sram_bytes"], p["seqlen"])
                if p["status"] == "ok" and (key not in best or p["seconds"] < best[key]["seconds"]):
                    best[key] = p

print(f"{'schedule':10} {'M':>7} {'N':>7} {'Br x Bc':>9} {'tile pairs':>11} {'seconds':>9} {'ns/pair':>8}")
for (schedule, sram, seqlen), p in sorted(best.items()):
    pairs = math.ceil(seqlen / p["block_rows"]) * math.ceil(seqlen / p["block_cols"])
    print(f"{schedule:10} {sram // 1024:>6}K {seqlen:>7} {p['block_rows']:>4}x{p['block_cols']:<4} {pairs:>11} "
          f"{p['seconds']:>9.4f} {1e9 * p['seconds'] / pairs:>8.0f}")
