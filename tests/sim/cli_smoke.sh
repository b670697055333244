#!/usr/bin/env bash
# flashlab check passes on every schedule, the default experiment writes its JSON, and
# kernel-tiles exports the GPU kernels' tilings.
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
head -1 "$work/s.csv" | grep -q "^schedule,mask,seqlen,head_dim,sram_bytes,status,"  # the header row first
"$flashlab" machines | grep -q h100
"$flashlab" kernel-tiles --machine h200 --generation fa2 --json "$work/tiles.json" | grep -q "128x64"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['format']=='flashlab-kernel-tiles' and j['machine']=='h200'; assert any(t['direction']=='forward' and t['head_dim']==128 and (t['block_rows'],t['block_cols'])==(128,64) for t in j['tilings'])" "$work/tiles.json"
# search: FA2's least-traffic tiling of 64 KB at N = 1024, d = 64, fp16 is 176 x 16 (tests/sim/test_search.cpp derives it).
"$flashlab" search --schedule fa2 -n 1024 -d 64 --dtype fp16 --sram 64K --multiple-of 16 >"$work/search.txt"
grep -q "^best (fa2) *176 x 16" "$work/search.txt"
grep -q "equal to the closed form per tensor" "$work/search.txt"
# hardware: the FA2 forward at b 16, s 1024 (Nsight Compute: 201 MB of DRAM reads, 2359296 write sectors).
"$flashlab" hardware --kernel fa2 --batch 16 --seqlen 1024 --heads 16 --head-dim 128 --json "$work/hw.json" >"$work/hw.txt"
grep -q "^DRAM read *201 MB" "$work/hw.txt"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert j['format']=='flashlab-hardware' and j['l2']['sm_to_l2_write_sectors']==2359296 and j['time']['bound']=='tensor'" "$work/hw.json"
echo "flashlab check, experiment, sweep, machines, kernel-tiles, search and hardware ran"
