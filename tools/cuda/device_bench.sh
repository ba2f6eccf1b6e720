#!/usr/bin/env bash
# On the GPU machine, after tools/cuda/device_check.sh built BUILD_DIR: writes the flash-next
# geometry benchmark model of issue 7 (64 routed experts; Q8_0 matrices, Q4_K routed gate/up;
# about 20 GB on the device's disk) and runs `regolith bench` on the CUDA backend at the depths in
# DEPTHS (default "0 8192"), each under a time limit so that a slow run still leaves the table so
# far. With PROFILE=1, also a short decode under `nsys profile` (kernel time table in $OUT).
#   tools/cuda/device_bench.sh [BUILD_DIR] [MODEL_PATH]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/regolith-cuda-out}
build=${1:-/tmp/b}
model=${2:-/tmp/flash-next-64e-q4k.gguf}
mkdir -p "$out"
[ -d /tmp/deps/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
t0=$(date +%s)
if [ ! -f "$model" ]; then
  timeout 150 "$build/regolith" mkmodel --preset flash-next --experts 64 --type q8_0 \
    --tensor-type expert_gate_up=q4_k -o "$model" || exit 1
fi
ls -l "$model"
echo "mkmodel: $(($(date +%s) - t0)) s"
for depth in ${DEPTHS:-0 8192}; do
  if [ "$depth" = 0 ]; then
    timeout "${BENCH_LIMIT:-150}" "$build/regolith" bench -m "$model" --backend cuda -p ${PREFILL:-512,2048} \
      -n 128 -d 0 -r 3 | tee -a "$out/bench.txt"
  else
    timeout "${BENCH_LIMIT:-150}" "$build/regolith" bench -m "$model" --backend cuda -p 512 -n 64 -d "$depth" -r 2 \
      --fill-chunk 4096 | tee -a "$out/bench.txt"
  fi
  echo "bench depth $depth done at $(($(date +%s) - t0)) s"
done
if [ "${PROFILE:-0}" = 1 ] && command -v nsys >/dev/null; then
  timeout 120 nsys profile -o /tmp/decode --force-overwrite true \
    "$build/regolith" bench -m "$model" --backend cuda -p 16 -n 32 -d 0 -r 1 >/dev/null 2>&1
  nsys stats -q --report cuda_gpu_kern_sum,cuda_api_sum --format csv /tmp/decode.nsys-rep >"$out/profile.csv" 2>&1
  head -c 6000 "$out/profile.csv"
fi
