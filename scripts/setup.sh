#!/usr/bin/env bash
# Installs Loom's Debian 12 dependencies (idempotent) and builds build/loom and the tests.
# Usage: bash scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build ccache pkg-config clang-format
  libtorch-dev libgloo-dev libopenblas-dev libyaml-cpp-dev libcli11-dev nlohmann-json3-dev
  libfmt-dev libspdlog-dev libgtest-dev libgmock-dev libbenchmark-dev libsentencepiece-dev
  libre2-dev libturbojpeg0-dev libpng-dev zlib1g-dev dataset-fashion-mnist python3-torch python3-numpy python3-yaml
  python3-jinja2 protobuf-compiler python3-protobuf
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
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[ "${1:-}" = "--no-build" ] && exit 0
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
