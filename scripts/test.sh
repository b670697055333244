#!/usr/bin/env bash
# The test command: installs the dependencies, then runs three stages (all by default):
#   release   configure, build and run every test (GPU tests skip cleanly where no GPU is present)
#   sanitize  the CPU parts built by clang with ASan and UBSan, float-cast-overflow included
#             (preset debug-clang), and every test run on that build
#   fuzz      each libFuzzer target for FLASHLAB_FUZZ_SECONDS (default 60) on its committed seeds
#             (scripts/fuzz.sh; docs/fuzzing.md)
#
#   bash scripts/test.sh                  # all three
#   bash scripts/test.sh release          # one stage; any of them, in any order
set -euo pipefail
cd "$(dirname "$0")/.."

stages=("$@")
((${#stages[@]})) || stages=(release sanitize fuzz)
for stage in "${stages[@]}"; do
  case $stage in
    release | sanitize | fuzz) ;;
    *) echo "test.sh: unknown stage '$stage'; allowed: release, sanitize, fuzz" >&2; exit 2 ;;
  esac
done

bash scripts/install-deps.sh
for stage in "${stages[@]}"; do
  start=$SECONDS
  echo "test.sh: stage $stage"
  case $stage in
    release)
      cmake --preset default >/dev/null
      cmake --build --preset default -j "$(nproc)"
      ctest --preset default -j "$(nproc)"
      ;;
    sanitize)
      cmake --preset debug-clang >/dev/null
      cmake --build --preset debug-clang -j "$(nproc)"
      ctest --preset debug-clang -j "$(nproc)"
      ;;
    fuzz)
      bash scripts/fuzz.sh --seconds "${FLASHLAB_FUZZ_SECONDS:-60}"
      ;;
  esac
  echo "test.sh: stage $stage passed in $((SECONDS - start)) s"
done
