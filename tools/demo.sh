#!/usr/bin/env bash
# Writes the default model (tiny, random weights, deterministic) once and runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/default-tiny-random.gguf
mkdir -p models
[ -f "$model" ] || build/regolith mkmodel --preset tiny --type q8_0 -o "$model"
build/regolith inspect "$model" | head -12
