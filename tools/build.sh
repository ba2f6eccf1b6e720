#!/usr/bin/env bash
# Configures and builds regolith (Release) into build/.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
ninja -C build -j "$(nproc)"
