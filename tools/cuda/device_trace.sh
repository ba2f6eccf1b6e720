#!/usr/bin/env bash
# On the GPU machine, after tools/cuda/device_check.sh built BUILD_DIR: the kernel timeline of
# decode inside the real stream (kernel_trace.cpp, CUPTI), summarised by trace_summary.py: each
# kernel's share of a one-token forward's chain and the gap between forwards. Traces of decode at
# depth 0 (steps waiting for their logits, as `bench` times them), queued (back to back) and at
# depth 32K; with HOST=1 the host's runtime calls too, on the same clock (they slow the host). The
# raw traces go to $OUT/traces.tgz, the summaries to $OUT/trace-*.sum.txt (a device call returns at
# most 8 files).
#   tools/cuda/device_trace.sh [BUILD_DIR] [MODEL]   (env: QUEUED, DEEP, STEPS, HOST)
source "$(dirname "$0")/run_env.sh"
cd "$(dirname "$0")/../.."
build=${1:-/tmp/b}
model=${2:-/tmp/flash-next-64e-q4k.gguf}
cuda=$(dirname "$(dirname "$(command -v nvcc)")")
cupti=$(dirname "$(find -L "$cuda" -name 'libcupti.so' 2>/dev/null | head -1)")
g++ -O2 -shared -fPIC -I"$cuda/include" -I"$cuda/extras/CUPTI/include" tools/cuda/kernel_trace.cpp \
  -o /tmp/libkernel_trace.so -L"$cupti" -lcupti -Wl,-rpath,"$cupti" || { echo "device_trace: no tracer"; exit 1; }
[ -f "$model" ] || "$build/regolith" mkmodel --preset flash-next --experts 64 --type q8_0 \
  --tensor-type expert_gate_up=q4_k --repeat-experts -o "$model" >/dev/null
trace() {  # NAME BENCH_ARGS...
  local name=$1
  shift
  CUDA_INJECTION64_PATH=/tmp/libkernel_trace.so KERNEL_TRACE_OUT="/tmp/trace-$name.txt" KERNEL_TRACE_API="${HOST:-0}" \
    "$build/regolith" bench -m "$model" --backend cuda -r 1 "$@" >"$out/trace-$name.bench.txt" 2>&1
  grep "^| tg" "$out/trace-$name.bench.txt"
  python3 tools/cuda/trace_summary.py "/tmp/trace-$name.txt" --steps "${STEPS:-16}" >"$out/trace-$name.sum.txt"
  head -3 "$out/trace-$name.sum.txt"
}
trace sync -p 0 -n 32
[ "${QUEUED:-1}" = 1 ] && trace queued -p 0 -n 32 --queued
[ "${DEEP:-1}" = 1 ] && trace d32k -p 0 -n 32 -d 32768 --fill-chunk 4096
tar -C /tmp -czf "$out/traces.tgz" $(cd /tmp && ls trace-*.txt trace-*.txt.api 2>/dev/null)
