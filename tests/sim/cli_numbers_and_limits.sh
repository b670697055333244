#!/usr/bin/env bash
# The flashlab command line on numbers it must not take and problems past its limits: exit
# status 2 and exactly one line on stderr naming the input and the allowed range, no output
# file, and no time spent first (every refusal comes before the work; each call is given 20 s).
# Usage: cli_numbers_and_limits.sh path/to/flashlab
set -u
flashlab="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failures=0

# A preset whose 16-byte SRAM makes square tiling run 1 x 1 tiles.
cat >"$work/tiny.json" <<'EOF'
{"format": "flashlab-machine", "version": 1, "key": "tiny", "name": "16-byte SRAM", "dtype": "bf16",
 "sram_bytes": 16, "sram_source": "test", "hbm_bytes_per_second": 1e12, "hbm_source": "test",
 "matmul_flops_per_second": 1e14, "matmul_source": "test", "exp_per_second": 1e12, "exp_source": "test",
 "fp32_flops_per_second": 1e13, "fp32_source": "test"}
EOF

# expect_refusal "words the message must contain" args...
expect_refusal() {
  local needle="$1"
  shift
  rm -f "$work/out.json"
  timeout 20 "$flashlab" "$@" >"$work/stdout" 2>"$work/stderr"
  local status=$?
  local lines
  lines=$(wc -l <"$work/stderr")
  if [[ $status -ne 2 || $lines -ne 1 ]] || ! grep -qF -- "$needle" "$work/stderr" || ! grep -q "allowed" "$work/stderr" ||
    [[ -e "$work/out.json" ]]; then
    echo "FAILED: flashlab $* -> status $status, $lines stderr lines, output file $([[ -e $work/out.json ]] && echo present || echo absent)"
    head -c 2000 "$work/stderr"
    failures=$((failures + 1))
  else
    echo "ok: flashlab $* -> $(cat "$work/stderr")"
  fi
}

# expect_success "words stdout must contain" args...
expect_success() {
  local needle="$1"
  shift
  timeout 60 "$flashlab" "$@" >"$work/stdout" 2>"$work/stderr"
  local status=$?
  if [[ $status -ne 0 ]] || ! grep -qF -- "$needle" "$work/stdout"; then
    echo "FAILED: flashlab $* -> status $status (expected 0 and '$needle')"
    head -c 2000 "$work/stderr"
    failures=$((failures + 1))
  else
    echo "ok: flashlab $* -> accepted"
  fi
}

# --- Numbers: decimal only, in range, the range named -------------------------------------------
expect_refusal "--seqlen = '010' is not a decimal number" run --seqlen 010 --sram 64K --json "$work/out.json"
expect_refusal "--seqlen = '0x10' is not a decimal number" run --seqlen 0x10 --sram 64K --json "$work/out.json"
expect_refusal "--heads = '+4' is not a decimal number" run --heads +4 --sram 64K --json "$work/out.json"
expect_refusal "--head-dim = '6.4e1' is not a decimal number" run --head-dim 6.4e1 --sram 64K --json "$work/out.json"
expect_refusal "--batch = '2147483648' is out of range; allowed: 1..1073741824" run --batch 2147483648 --sram 64K --json "$work/out.json"
expect_refusal "--window-left = '-2' is out of range; allowed: -1..1073741824" run --window-left -2 --sram 64K --json "$work/out.json"
expect_refusal "--seed = '-1' is out of range; allowed: 0..18446744073709551615" check --seed -1
expect_refusal "--seed = '18446744073709551616' is out of range" check --seed 18446744073709551616
expect_refusal "--value-elements = '-1' is out of range" trace --value-elements -1 --sram 8K --out "$work/out.json"
expect_refusal "--seqlens = '010' is not a decimal number" sweep --seqlens 010 --sram 64K --json "$work/out.json"
expect_refusal "--seqlens = '2147483648' is out of range; allowed: 1..16777216" sweep --seqlens 2147483648 --sram 64K --json "$work/out.json"
expect_refusal "--head-dims = '0x40' is not a decimal number" sweep --head-dims 0x40 --sram 64K --json "$work/out.json"
expect_refusal "--sram: size = '064' is not a decimal number" run --sram 064K --json "$work/out.json"
expect_refusal "--sram: size = '1099511627777' is out of range; allowed: 0..1099511627776" run --sram 1099511627777 --json "$work/out.json"
expect_refusal "--sram: size '1048577M' is out of range" run --sram 1048577M --json "$work/out.json"
expect_refusal "window W = '0x10' is not a decimal number" sweep --sram 64K --masks window:0x10 --json "$work/out.json"
expect_refusal "kept fraction S = 'inf' is not a decimal number" sweep --sram 64K --masks sparse:inf --json "$work/out.json"
expect_refusal "--seqlen: 1 required INT (allowed: 1..1073741824) missing" run --seqlen
expect_success "seed 18446744073709551615" check --seed 18446744073709551615
expect_success "N 4096 x 4096" run --seqlen 4096 --window-left -1 --sram 64K

# --- Counts and size products past int64 or int -------------------------------------------------
# The issue's reproducer: negative FLOPs and "closed form (equal)" before the counters were checked.
expect_refusal "matmul_flops = 562949953421312 x 49152 is out of range; allowed: at most 9223372036854775807" \
  run --schedule fa2 --batch 384 --heads 128 --seqlen 1048576 --head-dim 128 --block-rows 65536 --block-cols 65536 \
  --machine h100 --sram 0 --json "$work/out.json"
expect_refusal "batch x seqlen_q = 2 x 1073741824 = 2147483648 rows; allowed: at most 2147483647" \
  run --batch 2 --seqlen 1073741824 --sram 64K --data --json "$work/out.json"
expect_refusal "batch x seqlen_k = 3 x 1000000000" run --batch 3 --seqlen 1 --seqlen-k 1000000000 --sram 64K --json "$work/out.json"
# 6700417 x 641 = 2^32 + 1: a guard on the int product saw one head.
expect_refusal "trace: batch 6700417, heads 641; one head only" trace --batch 6700417 --heads 641 --sram 8K --out "$work/out.json"

# --- Work and memory limits, refused before the work ---------------------------------------------
expect_refusal "tile steps = " run --seqlen 16777216 --sram 64K --json "$work/out.json"
expect_refusal "batch x seqlen_q = 1073741824 x 1024" run --batch 1073741824 --sram 64K --json "$work/out.json"
expect_refusal "tile steps = " experiment --machine "$work/tiny.json" --out-dir "$work"
expect_refusal "--max-events = '1000000000000' is out of range; allowed: 1..2000000" trace --max-events 1000000000000 --sram 8K --out "$work/out.json"
expect_refusal "host memory in bytes = " run --data --seqlen 1048576 --sram 64K --json "$work/out.json"
expect_refusal "allowed: at most 4294967296" run --data --batch 384 --heads 128 --seqlen 65536 --head-dim 128 --sram 228K --json "$work/out.json"
expect_refusal "multiply-adds = " run --data --seqlen 4096 --heads 2048 --head-dim 8 --block-rows 64 --block-cols 64 --sram 0 --json "$work/out.json"
if [[ -e "$work/experiment.json" ]]; then
  echo "FAILED: the refused experiment wrote experiment.json"
  failures=$((failures + 1))
fi

if [[ $failures -ne 0 ]]; then
  echo "$failures cases wrong"
  exit 1
fi
echo "every bad number and every run past a limit is refused with one line naming it and its range"
