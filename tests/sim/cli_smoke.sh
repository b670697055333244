#!/usr/bin/env bash
# flashlab check passes on every schedule, and the default experiment writes its JSON.
# Usage: cli_smoke.sh path/to/flashlab
set -euo pipefail
flashlab="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$flashlab" check
"$flashlab" experiment --out-dir "$work" >"$work/table.txt"
grep -q "crossover at M" "$work/table.txt"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['format']=='flashlab-experiment' and j['points'] and j['fits']" "$work/experiment.json"
"$flashlab" sweep --schedules fa1,fa2 --seqlens 512,1024,2048 --head-dims 64 --sram 32K --json "$work/s.json" --csv "$work/s.csv" >/dev/null
head -1 "$work/s.csv" | grep -q "flashlab-sweep v1; command: "
"$flashlab" machines | grep -q h100
echo "flashlab check, experiment, sweep and machines ran"
