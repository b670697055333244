#!/usr/bin/env bash
# Installs FlashLab's build and test dependencies from Debian's packages (and matplotlib and
# nanobind from PyPI where the python3 on the PATH lacks them). Idempotent: a package already present is skipped. Needs root (or sudo) for apt-get.
set -euo pipefail

debian_packages=(
  cmake g++ make pkg-config          # build
  libeigen3-dev                      # CPU tiles (algorithms/)
  nlohmann-json3-dev                 # JSON printers (sim/, benchmarks)
  catch2                             # tests
  libcli11-dev                       # the flashlab command line
  libimgui-dev libglfw3-dev libstb-dev  # visualizer (viz/) and its PNG screenshots
  xvfb xauth                         # headless visualizer test
  python3 python3-matplotlib python3-numpy  # notebooks and plots
  python3-dev python3-venv           # the Python package: its extension, and the test stage's fresh venv
  clang libclang-rt-dev llvm         # the sanitizer build with float-cast-overflow, libFuzzer, llvm-cov
)

missing=()
for package in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#debian_packages[@]} Debian packages already installed"
else
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  echo "install-deps: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The plotting scripts run on the python3 that is first on the PATH; give it matplotlib if it
# lacks it (Debian's python3-matplotlib serves /usr/bin/python3 only).
if ! python3 -c "import matplotlib, numpy" 2>/dev/null; then
  echo "install-deps: installing matplotlib and numpy for $(command -v python3)"
  python3 -m pip install --quiet matplotlib numpy
fi

# The CMake build's Python package (python/, which the notebooks' tests import) is built with
# nanobind, which Debian 12 does not package: from PyPI for the python3 on the PATH. Debian's own
# python3 marks its site-packages as externally managed (PEP 668); nanobind has no dependencies,
# so it is installed there all the same. (`pip install .` brings its own, in an isolated build.)
if ! python3 -c "import nanobind" 2>/dev/null; then
  echo "install-deps: installing nanobind for $(command -v python3)"
  python3 -m pip install --quiet nanobind 2>/dev/null || python3 -m pip install --quiet --break-system-packages nanobind
fi
