#!/usr/bin/env bash
# The test command: installs the dependencies, configures, builds and runs every test.
# GPU tests skip cleanly where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
ctest --preset default -j "$(nproc)" "$@"
