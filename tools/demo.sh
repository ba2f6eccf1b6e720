#!/usr/bin/env bash
# The main job on the embedded default model: `regolith run` without -m writes the default model
# (tiny geometry, deterministic random weights — not a trained model, its text is noise) to the
# user's cache on first use, then generates from a chat prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
build/regolith run --chat -p "Write a haiku about lunar soil." -n 48 --temp 0.8 --seed 1
