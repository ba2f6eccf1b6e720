#!/usr/bin/env bash
# On the GPU machine: instructions and stalls by SASS line of chosen kernels. Builds regolith with
# -lineinfo into BUILD_DIR (default /tmp/b-lineinfo, apart from device_check.sh's build), writes the
# issue-7 model if MODEL is missing, runs Nsight Compute's full set with source on COUNT launches
# of the kernels matching KERNELS (a regex on their names) after SKIP matching launches, in
# `regolith bench $BENCH_ARGS` (default one-token steps), and summarises each kernel with
# tools/cuda/sass_summary.py into $OUT/sass-summary.txt; the report's source page goes to
# $OUT/sass.tgz (parse it again here with sass_summary.py --kernel ... --listing).
#   KERNELS=regex [SKIP=900] [COUNT=40] [BENCH_ARGS="-p 0 -n 8"] tools/cuda/device_sass.sh [BUILD_DIR] [MODEL]
# SKIP counts matching launches: a one-token step of the 48-layer model launches each per-layer
# kernel 36–97 times, and bench's warm-up forward comes first (prefill kernels: BENCH_ARGS
# "-p 8192 -n 0 -r 2" has about 94 launches a forward).
source "$(dirname "$0")/run_env.sh"
cd "$(dirname "$0")/../.."
build=${1:-/tmp/b-lineinfo}
model=${2:-/tmp/flash-next-64e-q4k.gguf}
[ -n "${KERNELS:-}" ] || { echo "device_sass: set KERNELS (a regex of kernel names)"; exit 1; }
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "device_sass: no ncu"; exit 1; }
CUDAFLAGS=-lineinfo BUILD_ONLY=1 tools/cuda/device_check.sh "$build" >"$out/sass-build.txt" 2>&1 ||
  { tail -20 "$out/sass-build.txt"; exit 1; }
[ -f "$model" ] || "$build/regolith" mkmodel --preset flash-next --experts 64 --type q8_0 \
  --tensor-type expert_gate_up=q4_k --repeat-experts -o "$model" >/dev/null
# Queued steps off, as in device_stalls.sh: ncu serializes launches, and a queued step waits for the host.
REGOLITH_CUDA_QUEUED=0 timeout "${NCU_LIMIT:-300}" "$ncu" --set full --import-source yes -k "regex:$KERNELS" \
  --launch-skip "${SKIP:-900}" --launch-count "${COUNT:-40}" -o /tmp/sass -f \
  "$build/regolith" bench -m "$model" --backend cuda ${BENCH_ARGS:--p 0 -n 8} -r 1 >"$out/sass-ncu.log" 2>&1
echo "ncu exit $?"
"$ncu" -i /tmp/sass.ncu-rep --page source --csv --print-source sass >/tmp/sass-source.csv 2>&1
python3 tools/cuda/sass_summary.py /tmp/sass-source.csv | tee "$out/sass-summary.txt"
tar -C /tmp -czf "$out/sass.tgz" sass-source.csv
