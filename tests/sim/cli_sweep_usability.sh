#!/usr/bin/env bash
# flashlab sweep's usability: --jobs N counts in parallel with the serial result in the serial
# order; progress lines go to stderr (off a terminal: one per point or per percent, with elapsed
# time and ETA), --quiet silences them, and neither changes stdout, the JSON or the CSV; a bad
# --jobs is refused in one line (exit 2, no file); the CSV reads with csv.DictReader's defaults.
# Usage: cli_sweep_usability.sh path/to/flashlab
set -euo pipefail
flashlab="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

grid=(--schedules standard,fa1,fa2,square_tiling,block_sparse --seqlens 129,513 --head-dims 64,128
      --sram 1K,96K --masks none,causal,sparse:0.5 --machine h100)
"$flashlab" sweep "${grid[@]}" --json "$work/serial.json" --csv "$work/serial.csv" >"$work/serial.out" 2>"$work/serial.err"
"$flashlab" sweep "${grid[@]}" --jobs 3 --json "$work/jobs.json" --csv "$work/jobs.csv" >"$work/jobs.out" 2>"$work/jobs.err"
"$flashlab" sweep "${grid[@]}" -j 2 --quiet --json "$work/quiet.json" --csv "$work/quiet.csv" >"$work/quiet.out" 2>"$work/quiet.err"

# The same points in the same order, whatever --jobs and --quiet: the JSON equal but for each
# point's wall time and the command line, the CSV byte for byte, stdout but for its timing line.
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def stripped(name):
    j = json.load(open(f"{work}/{name}.json"))
    j.pop("command")
    for p in j["points"]:
        p.pop("seconds", None)
    return j
serial = stripped("serial")
assert len(serial["points"]) == 5 * 2 * 2 * 2 * 3, len(serial["points"])
assert any(p["status"] == "does_not_fit" for p in serial["points"]), "the grid should hold points that do not fit"
for other in ("jobs", "quiet"):
    assert stripped(other) == serial, f"--{other}: the JSON differs from the serial run's"
PY
cmp "$work/serial.csv" "$work/jobs.csv" || fail "--jobs 3: the CSV differs from the serial run's"
cmp "$work/serial.csv" "$work/quiet.csv" || fail "--quiet: the CSV differs"
for run in jobs quiet; do
  diff <(sed '$d' "$work/serial.out") <(sed '$d' "$work/$run.out") || fail "$run: stdout differs"
  tail -1 "$work/$run.out" | grep -Eq '^120 points in [0-9.e-]+ s$' || fail "$run: stdout's last line"
done

# Progress off a terminal (stderr is a file here): 120 points, so one line per whole percent, 0%
# (the first point) to 100%, each with elapsed time and ETA; nothing else on stderr.
for run in serial jobs; do
  lines=$(wc -l <"$work/$run.err")
  [[ $lines -eq 101 ]] || fail "$run: $lines progress lines, expected 101"
  if grep -Evq '^sweep: [0-9]+/120 points \([0-9]+%\), elapsed [0-9.]+ s, ETA ([0-9.]+ s|\?)$' "$work/$run.err"; then
    fail "$run: a stderr line is not a progress line: $(grep -Ev '^sweep: ' "$work/$run.err" | head -1)"
  fi
  tail -1 "$work/$run.err" | grep -Eq '^sweep: 120/120 points \(100%\), elapsed [0-9.]+ s, ETA 0.00 s$' ||
    fail "$run: the last progress line"
  grep -q $'\r' "$work/$run.err" && fail "$run: carriage returns off a terminal"
done
[[ ! -s "$work/quiet.err" ]] || fail "--quiet: stderr not empty: $(head -1 "$work/quiet.err")"
# A few points: one line per point.
"$flashlab" sweep --schedules fa2 --seqlens 512,1024,2048 --head-dims 64 --sram 32K >/dev/null 2>"$work/few.err"
[[ $(wc -l <"$work/few.err") -eq 3 ]] || fail "3 points: $(wc -l <"$work/few.err") progress lines"
grep -q '^sweep: 2/3 points (66%), elapsed ' "$work/few.err" || fail "3 points: the second line"

# On a terminal (a pseudo-terminal from util-linux's script, where present): one line rewritten in
# place, a carriage return per point and one line end.
if command -v script >/dev/null; then
  script -qec "'$flashlab' sweep --schedules fa2 --seqlens 512,1024,2048 --head-dims 64 --sram 32K >/dev/null" /dev/null \
    >"$work/tty.txt"
  python3 - "$work/tty.txt" <<'PY'
import re, sys
text = open(sys.argv[1], "rb").read().decode()
assert len(re.findall(r"\rsweep: [123]/3 points \(\d+%\), elapsed [0-9.]+ s, ETA [0-9.]+ s", text)) == 3, repr(text)
assert text.count("\n") == 1 and text.endswith("\n"), repr(text)
PY
fi

# A bad --jobs: one line naming the option and the range, exit 2, nothing on stdout, no file.
for jobs in 0 257 -1 x 1.5; do
  set +e
  "$flashlab" sweep --schedules fa2 --sram 32K --jobs "$jobs" --json "$work/bad.json" >"$work/bad.out" 2>"$work/bad.err"
  status=$?
  set -e
  [[ $status -eq 2 ]] || fail "--jobs $jobs: exit status $status, expected 2"
  [[ $(wc -l <"$work/bad.err") -eq 1 ]] || fail "--jobs $jobs: $(wc -l <"$work/bad.err") lines on stderr"
  grep -q -- "--jobs" "$work/bad.err" && grep -q "allowed: 1..256" "$work/bad.err" || fail "--jobs $jobs: $(cat "$work/bad.err")"
  [[ ! -s "$work/bad.out" && ! -e "$work/bad.json" ]] || fail "--jobs $jobs: output written"
done

# The CSV: a single header row, read with csv.DictReader's defaults, one row per JSON point with
# the JSON's values; pandas' defaults too, where pandas is installed.
python3 - "$work" <<'PY'
import csv, json, sys
work = sys.argv[1]
points = json.load(open(f"{work}/serial.json"))["points"]
with open(f"{work}/serial.csv", newline="") as f:
    first = f.readline()
    assert not first.startswith("#"), f"a comment line: {first!r}"
    f.seek(0)
    rows = list(csv.DictReader(f))
expected = ("schedule,mask,seqlen,head_dim,sram_bytes,status,block_rows,block_cols,kept_fraction,hbm_bytes,"
            "hbm_read_bytes,hbm_write_bytes,hbm_elements,matmul_flops,exponentials,other_flops,sram_peak_bytes,"
            "bound_elements,lower_bound_elements,roofline_seconds,bound_by").split(",")
assert list(rows[0].keys()) == expected, list(rows[0].keys())
assert len(rows) == len(points), (len(rows), len(points))
for row, point in zip(rows, points):
    assert None not in row and all(v is not None for v in row.values()), f"a row of the wrong width: {row}"
    for name in ("schedule", "mask", "status"):
        assert row[name] == point[name], (name, row[name], point[name])
    for name in ("seqlen", "head_dim", "sram_bytes"):
        assert int(row[name]) == point[name], (name, row, point)
    if point["status"] == "ok":
        for name in ("hbm_bytes", "hbm_read_bytes", "hbm_write_bytes", "matmul_flops", "block_rows", "block_cols"):
            assert int(row[name]) == point[name], (name, row[name], point[name])
        assert row["bound_by"] == point["roofline"]["bound_by"]
    else:
        assert all(row[name] == "" for name in expected[6:]), row
try:
    import pandas
except ImportError:
    pandas = None
if pandas is not None:
    frame = pandas.read_csv(f"{work}/serial.csv")
    assert list(frame.columns) == expected and len(frame) == len(points)
    assert frame["hbm_bytes"].dropna().astype("int64").tolist() == [p["hbm_bytes"] for p in points if p["status"] == "ok"]
print(f"the CSV: {len(rows)} rows with the JSON's values" + (", read by pandas too" if pandas else ""))
PY
echo "flashlab sweep: --jobs, progress, --quiet and the CSV behave"
