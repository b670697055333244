#!/usr/bin/env bash
# scripts/ptxas_check.sh refuses bad arguments before it compiles or patches anything: exit 2, one
# line on stderr naming the input, nothing on stdout, the tree unchanged.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
script=$root/scripts/ptxas_check.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'diff --git a/no_such_file.txt b/no_such_file.txt\n--- a/no_such_file.txt\n+++ b/no_such_file.txt\n@@ -1 +1 @@\n-a\n+b\n' \
  >"$work/stale.patch"
failures=0
expect_refusal() {  # expect_refusal <text the one stderr line must hold> <arguments...>
  local text=$1
  shift
  local status out err
  out=$(cd "$work" && bash "$script" "$@" 2>"$work/stderr")
  status=$?
  err=$(cat "$work/stderr")
  if [[ $status != 2 || -n $out || $(wc -l <"$work/stderr") != 1 || $err != *"$text"* ]]; then
    echo "FAILED: ptxas_check.sh $* -> exit $status, stdout '$out', stderr '$err' (expected exit 2 and '$text')"
    failures=$((failures + 1))
  fi
}
before=$(git -C "$root" status --porcelain 2>/dev/null)
expect_refusal "unknown option '--bogus'" --bogus
expect_refusal "--patch needs a file" --patch
expect_refusal "--log needs a file" --log
expect_refusal "--patch $work/missing.patch: no such file" --patch missing.patch
expect_refusal "source $work/missing.cu: no such file" missing.cu
expect_refusal "--patch $work/stale.patch does not apply" --patch stale.patch
after=$(git -C "$root" status --porcelain 2>/dev/null)
if [[ $before != "$after" ]]; then
  echo "FAILED: the tree changed: '$before' -> '$after'"
  failures=$((failures + 1))
fi
((failures == 0)) && echo "ptxas_check.sh: 6 refusals, each exit 2 with one line naming its input"
exit $((failures > 0))
