#!/usr/bin/env bash
# The test command: installs the dependencies, then runs four stages (all by default):
#   release   configure, build and run every test (GPU tests skip cleanly where no GPU is present)
#   sanitize  the CPU parts built by clang with ASan and UBSan, float-cast-overflow included, and
#             libFuzzer's instrumentation (preset fuzz: debug-clang's flags, and the fuzz targets
#             built in the same tree), and every test run on that build
#   fuzz      each libFuzzer target for FLASHLAB_FUZZ_SECONDS (default 20) on its committed seeds
#             (scripts/fuzz.sh; docs/fuzzing.md), built by the sanitize stage where it ran first
#   python    the Python package as a new user gets it: a fresh virtual environment, `pip install .`
#             of this checkout (the CUDA kernels left out: the release stage builds and tests
#             them, and the package's own tests here are its CPU parts) with its test extras
#             (pytest, numpy), then pytest (python/tests)
#
#   bash scripts/test.sh                  # all four
#   bash scripts/test.sh release          # one stage; any of them, in any order
set -euo pipefail
cd "$(dirname "$0")/.."

stages=("$@")
((${#stages[@]})) || stages=(release sanitize fuzz python)
for stage in "${stages[@]}"; do
  case $stage in
    release | sanitize | fuzz | python) ;;
    *) echo "test.sh: unknown stage '$stage'; allowed: release, sanitize, fuzz, python" >&2; exit 2 ;;
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
      cmake --preset fuzz >/dev/null
      cmake --build --preset fuzz -j "$(nproc)"
      ctest --preset fuzz -j "$(nproc)"
      ;;
    fuzz)
      bash scripts/fuzz.sh --seconds "${FLASHLAB_FUZZ_SECONDS:-20}"
      ;;
    python)
      venv=build/python-venv
      rm -rf "$venv" build/pip
      python3 -m venv "$venv"
      "$venv/bin/python" -m pip install --quiet --config-settings=cmake.define.FLASHLAB_BUILD_KERNELS=OFF ".[test]"
      # From outside the checkout, so that the installed package is the one imported.
      (cd "$venv" && bin/python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests")
      ;;
  esac
  echo "test.sh: stage $stage passed in $((SECONDS - start)) s"
done
