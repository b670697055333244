#!/usr/bin/env bash
# Installs FlashLab's build and test dependencies from Debian's packages (and matplotlib from PyPI
# for the plots). Idempotent: a package already present is skipped. Needs root (or sudo) for apt-get.
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
