#!/usr/bin/env bash
# Installs Loom's dependencies (idempotent) and builds it:
#  - Debian 12 packages (build tools and the libraries Loom links besides libtorch);
#  - the project virtualenv .venv with the pinned `torch` wheel (scripts/requirements-torch.txt),
#    whose libtorch Loom builds against and links; with --oracles also the pinned test oracles
#    (transformers, diffusers, peft: scripts/requirements-oracles.txt), which tests, fixture
#    generators and bench/compare's peer use and Loom never does;
#  - then builds build/loom (or, with --tests, everything: the tests and benchmarks too).
# Usage: bash scripts/setup.sh [--no-build] [--tests] [--oracles]
set -euo pipefail
cd "$(dirname "$0")/.."

build=loom oracles=0
for arg in "$@"; do
  case $arg in
    --no-build) build= ;;
    --tests) build=all ;;
    --oracles) oracles=1 ;;
    *) echo "usage: bash scripts/setup.sh [--no-build] [--tests] [--oracles]" >&2; exit 2 ;;
  esac
done

now() { date +%s; }
t0=$(now)

packages=(build-essential cmake ninja-build ccache pkg-config clang-format python3-venv
  libgloo-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev libsentencepiece-dev libre2-dev libturbojpeg0-dev
  libpng-dev zlib1g-dev dataset-fashion-mnist protobuf-compiler
  libavformat-dev libavcodec-dev libavutil-dev libswscale-dev libgif-dev)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "loom setup: installing ${missing[*]}"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
t_apt=$(now)

# The virtualenv, from Debian's Python 3.11 (the wheels' cp311 builds). pip only acts when a pin
# is missing or differs.
[ -x .venv/bin/python3 ] || /usr/bin/python3 -m venv .venv
requirements=(-r scripts/requirements-torch.txt)
((oracles)) && requirements+=(-r scripts/requirements-oracles.txt)
if ! .venv/bin/python3 scripts/check-requirements.py "${requirements[@]}"; then
  echo "loom setup: installing the Python packages of ${requirements[*]//-r /} into .venv"
  .venv/bin/python3 -m pip install -q --disable-pip-version-check "${requirements[@]}"
fi
t_pip=$(now)

if [ -n "$build" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  if [ "$build" = loom ]; then cmake --build build --target loom; else cmake --build build; fi
fi
t_build=$(now)
echo "loom setup: Debian packages $((t_apt - t0)) s, Python packages $((t_pip - t_apt)) s, build $((t_build - t_pip)) s"
