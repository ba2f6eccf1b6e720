#!/usr/bin/env bash
# On the GPU machine, after tools/cuda/device_check.sh built BUILD_DIR and MODEL exists: where the
# warps of chosen decode kernels wait. Nsight Compute runs COUNT launches of the kernels whose
# names match KERNELS (a regex; default the routed expert kernels) after skipping SKIP matching
# launches (default 96: the first decode token's, 48 layers × 2), in one-token decode steps
# (`bench -p 0 -n 4`; BENCH_ARGS replaces those arguments, e.g. "-p 2048 -n 0" for prefill
# kernels), and reads per launch: duration, DRAM throughput, warps active, issue slots busy and
# the stall cycles per issued instruction by reason. Per kernel it prints the means and the five largest
# stall reasons; the raw CSV stays in $OUT/stalls.csv.
#   tools/cuda/device_stalls.sh [BUILD_DIR] [MODEL]
source "$(dirname "$0")/run_env.sh"
build=${1:-/tmp/b}
model=${2:-/tmp/flash-next-64e-q4k.gguf}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$ncu" ]; then echo "device_stalls: no ncu"; exit 1; fi
# Queued steps off: their first kernel waits for the host's next token, and ncu serializes each
# launch (the host stays in the launch until the kernel ends), so queued decode can wait for ever
# (session 56's run with queued steps on wrote no rows in 240 s).
REGOLITH_CUDA_QUEUED=0 timeout "${NCU_LIMIT:-240}" "$ncu" --clock-control none --csv -k "regex:${KERNELS:-expert_(gate_up|down)}" \
  --launch-skip "${SKIP:-96}" --launch-count "${COUNT:-8}" \
  --metrics "gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  "$build/regolith" bench -m "$model" --backend cuda ${BENCH_ARGS:--p 0 -n 4} -r 1 >"$out/stalls.csv" 2>"$out/stalls.err"
echo "ncu exit $?"
python3 - "$out/stalls.csv" <<'PY'
import csv, re, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    sys.exit("no ncu rows")
col = {n: i for i, n in enumerate(rows[0])}
per = collections.defaultdict(lambda: collections.defaultdict(list))  # kernel -> metric -> values
for r in rows[1:]:
    name = re.sub(r"\(anonymous namespace\)::", "", r[col["Kernel Name"]])
    name = re.sub(r"\(.*", "", name).split("<")[0].split("::")[-1].strip()
    metric = r[col["Metric Name"]]
    if metric == "gpu__time_duration.sum":
        metric = f"duration ({r[col['Metric Unit']]})"
    per[name][metric].append(float(r[col["Metric Value"]].replace(",", "")))
mean = lambda v: sum(v) / len(v)
for name, m in per.items():
    head = {k: mean(v) for k, v in m.items() if not k.startswith("smsp__average_warps_issue_stalled")}
    stalls = sorted(((mean(v), re.sub(r"smsp__average_warps_issue_stalled_|_per_issue_active\.ratio", "", k))
                     for k, v in m.items() if k.startswith("smsp__average_warps_issue_stalled")), reverse=True)
    short = {"dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM % of peak",
             "sm__warps_active.avg.pct_of_peak_sustained_active": "warps active %",
             "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue slots busy %"}
    launches = max(len(v) for v in m.values())
    print(f"{name}: {launches} launches, " + ", ".join(f"{short.get(k, k)} {v:.1f}" for k, v in head.items()))
    print("  stall cycles per issue: " + ", ".join(f"{s} {v:.2f}" for v, s in stalls[:5]))
PY
