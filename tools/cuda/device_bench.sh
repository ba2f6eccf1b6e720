#!/usr/bin/env bash
# On the GPU machine, after tools/cuda/device_check.sh built BUILD_DIR: writes a flash-next
# geometry benchmark model (64 routed experts; Q8_0 matrices, and RECIPE=q4k makes the routed
# gate/up Q4_K as issue 7 specifies; its experts are written with --repeat-experts, since
# quantizing 64 distinct experts to Q4_K took about 6 minutes of device time)
# and runs `regolith bench` on the CUDA backend at the depths in DEPTHS (default "0 8192"; depth 0
# measures prefill at PREFILL, default "2048,8192", the others decode), with the step graphs (the
# default) and, with STREAM=1, also on the stream's launches (REGOLITH_CUDA_GRAPHS=0). Each run has
# a time limit, so a slow one still leaves (BATCH, e.g. "2,4,8": depth 0 also decodes that many
# sequences at once, `bench --batch`)
# the table so far. Output also goes to $OUT/bench.txt.
#   tools/cuda/device_bench.sh [BUILD_DIR]
source "$(dirname "$0")/run_env.sh"
cd "$(dirname "$0")/../.."
build=${1:-/tmp/b}
t0=$(date +%s)
if [ "${RECIPE:-q8_0}" = q4k ]; then
  model=/tmp/flash-next-64e-q4k.gguf
  overrides=(--tensor-type expert_gate_up=q4_k --repeat-experts)
else
  model=/tmp/flash-next-64e-q8_0.gguf
  overrides=()
fi
if [ ! -f "$model" ]; then
  timeout 600 "$build/regolith" mkmodel --preset flash-next --experts 64 --type q8_0 "${overrides[@]}" -o "$model" ||
    { echo "mkmodel failed (exit $?)"; exit 1; }
fi
ls -l "$model"
echo "mkmodel: $(($(date +%s) - t0)) s"
bench() {  # depth, graphs (1: the default, 0: the stream)
  local args=(-m "$model" --backend cuda -d "$1")
  if [ "$1" = 0 ]; then args+=(-p "${PREFILL:-2048,8192}" -n 128 -r 3 ${BATCH:+--batch "$BATCH"}); else args+=(-p 512 -n 128 -r "${DEEP_REPS:-2}" --fill-chunk 4096); fi
  echo "### depth $1, REGOLITH_CUDA_GRAPHS=$2" | tee -a "$out/bench.txt"
  REGOLITH_CUDA_GRAPHS=$2 timeout "${BENCH_LIMIT:-180}" "$build/regolith" bench "${args[@]}" | tee -a "$out/bench.txt"
  echo "bench depth $1 graphs $2 done at $(($(date +%s) - t0)) s"
}
for depth in ${DEPTHS:-0 8192}; do
  bench "$depth" 1
  [ "${STREAM:-0}" = 1 ] && bench "$depth" 0
done
