#!/usr/bin/env bash
# test_fa2_backward_bench (given as $1) refuses bad arguments before it looks for a device: exit 2,
# one line on stderr naming the input, nothing on stdout.
set -uo pipefail
bench=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
expect_refusal() {  # expect_refusal <text the one stderr line must hold> <arguments...>
  local text=$1
  shift
  local status out err
  out=$("$bench" "$@" 2>"$work/stderr")
  status=$?
  err=$(cat "$work/stderr")
  if [[ $status != 2 || -n $out || $(wc -l <"$work/stderr") != 1 || $err != *"$text"* ]]; then
    echo "FAILED: test_fa2_backward_bench $* -> exit $status, stdout '$out', stderr '$err' (expected exit 2 and '$text')"
    failures=$((failures + 1))
  fi
}
expect_refusal "--heads = 0; allowed: 1 to 256" --heads 0
expect_refusal "--heads = 257; allowed: 1 to 256" --generation 3 --heads 257
expect_refusal "--generation = 4; allowed: 2 or 3" --generation 4
((failures == 0)) || exit 1
echo "test_fa2_backward_bench: 3 refusals, each exit 2 with one line naming its input"
