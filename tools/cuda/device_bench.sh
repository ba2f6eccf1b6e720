#!/usr/bin/env bash
# On the GPU machine, after tools/cuda/device_check.sh built BUILD_DIR: writes the flash-next
# geometry benchmark model (64 routed experts, Q8_0 matrices; several GB, on the device's disk) and
# runs `regolith bench` on the CUDA backend at depth 0 and 8192, each under a time limit so that a
# slow run still leaves the table so far. Output also goes to $OUT/bench.txt.
#   tools/cuda/device_bench.sh [BUILD_DIR] [MODEL_PATH]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/regolith-cuda-out}
build=${1:-/tmp/b}
model=${2:-/tmp/flash-next-64e-q8_0.gguf}
mkdir -p "$out"
[ -d /tmp/deps/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t0=$(date +%s)
if [ ! -f "$model" ]; then
  timeout 150 "$build/regolith" mkmodel --preset flash-next --experts 64 --type q8_0 -o "$model" || exit 1
fi
ls -l "$model"
echo "mkmodel: $(($(date +%s) - t0)) s"
timeout "${BENCH_LIMIT_0:-150}" "$build/regolith" bench -m "$model" --backend cuda -p 512,2048 -n 128 -d 0 -r 3
echo "bench depth 0 done at $(($(date +%s) - t0)) s"
timeout "${BENCH_LIMIT_8K:-100}" "$build/regolith" bench -m "$model" --backend cuda -p 512 -n 64 -d 8192 -r 2 --fill-chunk 4096
echo "bench depth 8192 done at $(($(date +%s) - t0)) s"
