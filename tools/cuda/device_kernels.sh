#!/usr/bin/env bash
# On the GPU machine, after tools/cuda/device_check.sh built BUILD_DIR and tools/cuda/device_bench.sh
# wrote MODEL: every kernel of one-token steps under Nsight Compute, which runs them one at a time
# (so no launch gaps and no overlap), summed by kernel name per decode step: calls, µs, DRAM bytes
# read and the rate they came at. Kernels far below the copy bandwidth for the bytes they read are
# latency-bound; the sum over a step against the step's measured time is what launches cost.
# `bench -p 1` makes every forward a one-token one. Output also goes to $OUT/kernels.txt.
#   tools/cuda/device_kernels.sh [BUILD_DIR] [MODEL]      (COUNT: kernels to profile, default 3000)
source "$(dirname "$0")/run_env.sh"
build=${1:-/tmp/b}
model=${2:-/tmp/flash-next-64e-q4k.gguf}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$ncu" ]; then echo "device_kernels: no ncu"; exit 1; fi
# Queued steps off, as in device_stalls.sh: ncu serializes launches, and a queued step waits for the host.
REGOLITH_CUDA_QUEUED=0 timeout "${NCU_LIMIT:-300}" "$ncu" --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
  --launch-count "${COUNT:-3000}" "$build/regolith" bench -m "$model" --backend cuda -p 1 -n 2 -r 1 >/tmp/ncu.csv 2>/tmp/ncu.err
echo "ncu exit $?, $(grep -c gpu__time_duration /tmp/ncu.csv) kernels"
python3 - "$out/kernels.txt" <<'PY'
import csv, re, sys, collections
rows = [r for r in csv.reader(open("/tmp/ncu.csv")) if len(r) > 10]
head = rows[0]
col = {n: i for i, n in enumerate(head)}
per = collections.defaultdict(lambda: [0, 0.0, 0.0])  # calls, ns, bytes
for r in rows[1:]:
    name = re.sub(r"\(.*", "", r[col["Kernel Name"]]).split("<")[0].split("::")[-1].strip()
    v = float(r[col["Metric Value"]].replace(",", ""))
    unit = r[col["Metric Unit"]]
    if r[col["Metric Name"]] == "gpu__time_duration.sum":
        per[name][0] += 1
        per[name][1] += v * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6}.get(unit, 1)
    else:
        per[name][2] += v * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
steps = max(per.get("moe_router_kernel", [0])[0], per.get("expert_down_kernel", [0])[0]) / 48 or 1
lines = [f"kernels per one-token forward (from {steps:.1f} forwards; ncu runs kernels one at a time)",
         f"{'kernel':40s} {'calls':>7s} {'us/call':>8s} {'us/step':>8s} {'MB/call':>8s} {'GB/s':>7s}"]
total = 0
for name, (calls, ns, b) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    total += ns / steps
    lines.append(f"{name:40s} {calls/steps:7.1f} {ns/calls/1e3:8.2f} {ns/steps/1e3:8.1f} {b/calls/1e6:8.3f} {b/ns if ns else 0:7.0f}")
lines.append(f"sum of kernel time per forward: {total/1e3:.1f} us")
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
