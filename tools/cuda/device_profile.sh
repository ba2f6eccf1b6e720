#!/usr/bin/env bash
# On the GPU machine, after tools/cuda/device_check.sh built BUILD_DIR and tools/cuda/device_bench.sh
# wrote MODEL: device milliseconds per op and per op/kernel (REGOLITH_CUDA_PROFILE=1) over one
# prefill of PROMPT tokens (default 2048) and 64 decode steps, for one-token and multi-token calls,
# then the same with step graphs (REGOLITH_CUDA_GRAPHS=1: no op times, but the graphs'
# counters: built, reused, parameter updates and host time per graph). Output also goes to
# $OUT/profile.txt.
#   tools/cuda/device_profile.sh [BUILD_DIR] [MODEL]
source "$(dirname "$0")/run_env.sh"
build=${1:-/tmp/b}
model=${2:-/tmp/flash-next-64e-q4k.gguf}
REGOLITH_CUDA_PROFILE=1 timeout "${BENCH_LIMIT:-180}" "$build/regolith" bench -m "$model" --backend cuda \
  -p "${PROMPT:-2048}" -n 64 -r 1 2>&1 | tee "$out/profile.txt"
REGOLITH_CUDA_GRAPHS=1 REGOLITH_CUDA_PROFILE=1 timeout "${BENCH_LIMIT:-180}" "$build/regolith" bench -m "$model" \
  --backend cuda -p "${PROMPT:-2048}" -n 64 -r 1 2>&1 | tee -a "$out/profile.txt"
