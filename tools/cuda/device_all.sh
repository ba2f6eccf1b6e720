#!/usr/bin/env bash
# On the GPU machine, everything issue 7's acceptance measures, in one call (a fresh machine
# costs minutes of the session's device time): builds regolith (tools/cuda/device_check.sh) and,
# when .llama-src is carried, llama.cpp's llama-bench in the background; runs `ctest -L cuda`;
# writes the Q4_K-recipe benchmark model; runs regolith bench at DEPTHS (default "0 1024 32768":
# prefill 2K and 8K at depth 0, decode at 1K and 32K as the issue asks)
# and then, alone on the GPU, llama-bench on the same file. Each step's log lands in $OUT.
#   tools/cuda/device_all.sh        (carry .devtree's equivalent of the repo, .deps, .llama-src)
#   SKIP_CTEST=1 LLAMA_NPROC=16 DEADLINE=590 tools/cuda/device_all.sh   (the table alone, one call)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/regolith-cuda-out}
mkdir -p "$out"
t0=$(date +%s)
since() { echo "$(($(date +%s) - t0)) s"; }
llama_pid=""
if [ -f .llama-src/llama.cpp.tar.gz ]; then
  # Half the cores each: both builds finish in about the time of the slower one. Niced, so that
  # regolith's bench, which may run while it builds, keeps a core for its host thread.
  (BUILD_ONLY=1 NPROC=${LLAMA_NPROC:-8} nice -n 19 tools/cuda/llama_bench.sh /tmp/flash-next-64e-q4k.gguf >"$out/llama_build.txt" 2>&1) &
  llama_pid=$!
fi
# SKIP_CTEST=1: build only (a speed-only run). STREAM=1: every bench also on the stream's launches.
# BATCH (e.g. 2,4,8): depth 0 also decodes that many sequences at once (bench --batch).
# PROFILE=1: then tools/cuda/device_profile.sh.
BUILD_ONLY=${SKIP_CTEST:-0} tools/cuda/device_check.sh /tmp/b >"$out/check.txt" 2>&1
echo "regolith built (and ctest -L cuda unless SKIP_CTEST=1) at $(since)"
tail -45 "$out/check.txt"
RECIPE=q4k BATCH=${BATCH:-} STREAM=${STREAM:-0} DEPTHS="${DEPTHS:-0 1024 32768}" DEEP_REPS=1 tools/cuda/device_bench.sh /tmp/b >"$out/bench_run.txt" 2>&1
echo "regolith bench done at $(since)"
grep -E "^\||###|mkmodel|copy bandwidth" "$out/bench_run.txt"
if [ "${PROFILE:-0}" = 1 ]; then
  tools/cuda/device_profile.sh /tmp/b >"$out/profile_run.txt" 2>&1
  echo "profile done at $(since)"
  tail -70 "$out/profile_run.txt"
fi
if [ -n "$llama_pid" ]; then
  wait "$llama_pid"
  echo "llama-bench built at $(since)"
  # llama_bench.sh reads DEPTHS too, in its own (comma) form.
  # DEADLINE (seconds since the start): llama-bench is stopped then, so that the call's limit
  # still returns the logs.
  limit=$((${DEADLINE:-100000} - $(date +%s) + t0))
  [ "$limit" -gt 0 ] || limit=1  # timeout 0 would mean none
  DEPTHS=${LLAMA_DEPTHS:-0,32768} REPS=${LLAMA_REPS:-2} timeout "$limit" tools/cuda/llama_bench.sh /tmp/flash-next-64e-q4k.gguf >"$out/llama_bench.txt" 2>&1
  echo "llama.cpp done at $(since)"
  tail -20 "$out/llama_bench.txt"
fi
