#!/usr/bin/env bash
# scripts/device_check.sh ncu-bwd refuses a bad setting before it builds or profiles anything: exit
# 2, one line on stderr naming the variable and its allowed values, nothing on stdout (so this runs
# without a GPU).
set -uo pipefail
script=$(cd "$(dirname "$0")/../.." && pwd)/scripts/device_check.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0 cases=0
expect_refusal() {  # expect_refusal <text the one stderr line must hold> <VARIABLE=value>
  local text=$1 setting=$2 status out err
  out=$(env OUT="$work/out" "$setting" bash "$script" ncu-bwd 2>"$work/stderr")
  status=$?
  err=$(cat "$work/stderr")
  cases=$((cases + 1))
  if [[ $status != 2 || -n $out || $(wc -l <"$work/stderr") != 1 || $err != *"$text"* ]]; then
    echo "FAILED: $setting device_check.sh ncu-bwd -> exit $status, stdout '$out', stderr '$err' (expected exit 2 and '$text')"
    failures=$((failures + 1))
  fi
}
expect_refusal "NCU_BWD_SEQLEN = 0; allowed: 1 to 16384" NCU_BWD_SEQLEN=0
expect_refusal "NCU_BWD_SEQLEN = 2k; allowed: 1 to 16384" NCU_BWD_SEQLEN=2k
expect_refusal "NCU_BWD_CAUSAL = 2; allowed: 0 or 1" NCU_BWD_CAUSAL=2
expect_refusal "NCU_BWD_DETERMINISTIC = yes; allowed: 0 or 1" NCU_BWD_DETERMINISTIC=yes
expect_refusal "NCU_KEEP_REP = 2; allowed: 0 or 1" NCU_KEEP_REP=2
if ((failures)); then exit 1; fi
echo "device_check.sh ncu-bwd: $cases refusals as expected"
