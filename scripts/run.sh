#!/usr/bin/env bash
# The main job, on a fresh machine: installs the dependencies, builds the flashlab program, checks
# every CPU schedule against the double-precision oracle, and runs the default experiment on the
# embedded H100 preset (a table of traffic, fitted exponents against theory and the Saha-Ye
# crossover; build/experiment/experiment.json; and build/experiment/experiment.png where python3
# has matplotlib).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default --target flashlab -j "$(nproc)"
flashlab=build/release/sim/flashlab
out=build/experiment
mkdir -p "$out"
start=$(date +%s.%N)
"$flashlab" check
echo
"$flashlab" experiment --out-dir "$out"
if python3 -c "import matplotlib" 2>/dev/null; then
  python3 scripts/plot_sweep.py "$out/experiment.json" "$out/experiment.png"
else
  echo "no matplotlib for $(command -v python3): skipped the plot (bash scripts/install-deps.sh installs it)"
fi
echo "main job: $(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)") s after the build"
