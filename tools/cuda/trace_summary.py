#!/usr/bin/env python3
"""Where one-token forwards spend their time, from kernel_trace.cpp's timeline.

    tools/cuda/trace_summary.py TRACE [--steps N]

A forward starts at the token embedding's get_rows_kernel (the first get_rows at least 300
kernels after the last start). Within a forward, in launch order, a kernel's share of the chain is
end_i - end_(i-1): with programmatic dependent launch a kernel starts while its predecessor runs
and waits for it, so durations overlap, but the ends are in chain order and the shares sum to the
forward's time. Kernels are grouped by name and grid x and y (the same product kernel over
different matrices has different grids; z, the QSA splits, changes with the context). The gap between forwards (host time: reading logits, issuing) is
shown apart. The last N forwards (default 16) are summarised, medians of their per-forward sums.

The device's idle stretches inside a forward (a kernel starting after the previous one ended: the
pieces of a step graph, copies between kernels) are listed by place. With kernel_trace.cpp's
runtime calls (TRACE.api), each stretch is set against the host: when the call that launched the
kernel (a graph's launch) returned after the device went idle, the device waited for the host; and
between forwards, when the host's last wait (the logits) returned and when it launched the next.
Tracing the runtime calls slows the host, so these host times are upper bounds.
"""
import argparse
import collections
import re
import statistics
import subprocess


def short_name(name):
    """The kernel's own name: no namespaces, template arguments or parameters."""
    name = name.replace("(anonymous namespace)::", "")
    base = re.split(r"[<(]", name)[0].split("::")[-1].strip()
    return base.split(" ")[-1] or name


def demangle(names):
    """Demangled names by c++filt where it exists (CUPTI records mangled names)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.split("\n")))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def load(path):
    """Kernels as (start, end, grid, threads, registers, name, correlation)."""
    raw = [line.rstrip("\n").split(" ", 8) for line in open(path)]
    raw = [p for p in raw if len(p) == 9]
    names = demangle(sorted({p[8] for p in raw}))
    return [(int(p[0]), int(p[1]), (int(p[2]), int(p[3]), int(p[4])), int(p[5]), int(p[6]), short_name(names[p[8]]),
             int(p[7])) for p in raw]


# CUDA runtime callback ids (cupti_runtime_cbid.h) of the calls that start device work.
LAUNCH_CALLS = {311: "cudaGraphLaunch", 312: "cudaGraphLaunch", 430: "cudaLaunchKernelExC", 431: "cudaLaunchKernelExC",
                211: "cudaLaunchKernel", 214: "cudaLaunchKernel"}


def load_api(path):
    """Runtime calls by correlation id: (host start, host end, callback id)."""
    try:
        rows = [line.split() for line in open(path)]
    except OSError:
        return {}
    return {int(r[3]): (int(r[0]), int(r[1]), int(r[2])) for r in rows if len(r) == 4}


def forwards(rows, min_kernels=300):
    starts, last = [], -min_kernels
    for i, r in enumerate(rows):
        if r[5] == "get_rows_kernel" and i - last >= min_kernels:
            starts.append(i)
            last = i
    return [rows[a:b] for a, b in zip(starts, starts[1:] + [len(rows)])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    fw = forwards(load(a.trace))
    api = load_api(a.trace + ".api")
    # Decode forwards have the most common kernel count; keep the last N of those.
    counts = collections.Counter(len(f) for f in fw)
    if not counts:
        print("no forwards found")
        return
    n_common = counts.most_common(1)[0][0]
    decode = [f for f in fw if len(f) == n_common][-a.steps:]
    print(f"{len(fw)} forwards; {len(decode)} of {n_common} kernels summarised")
    # Per forward, the chain share and run time summed by key; a key absent from a forward counts 0
    # there, so that kernels whose grid changes with the context (QSA splits) are not counted twice.
    # The grid's z (the splits) is left out of the key for the same reason.
    shares, durs, calls = [], [], []
    totals, gaps, idles = [], [], []
    for f in decode:
        share, dur, n = collections.Counter(), collections.Counter(), collections.Counter()
        prev_end = f[0][0]
        idle = []  # the device idle inside the forward: a kernel starting after the last one ended
        for i, r in enumerate(f):
            key = f"{r[5]} [{r[2][0]}x{r[2][1]}] {r[3]}t {r[4]}r"
            if r[0] > prev_end:
                # How late the host's launch call returned against the device going idle (> 0: the
                # device waited for the host), when the runtime calls were traced.
                call = api.get(r[6])
                idle.append((r[0] - prev_end, call[1] - prev_end if call else None, i, r[5]))
            end = max(r[1], prev_end)
            share[key] += end - prev_end
            dur[key] += r[1] - r[0]
            n[key] += 1
            prev_end = end
        shares.append(share), durs.append(dur), calls.append(n)
        totals.append(prev_end - f[0][0])
        idles.append(idle)
    keys = set().union(*calls)
    med = lambda per_forward, k: statistics.median(c[k] for c in per_forward)
    per = {k: (med(shares, k), med(durs, k), max(c[k] for c in calls)) for k in keys}
    # Gaps: from a forward's last end to the next forward's first start; with runtime calls, when
    # the host's last wait before the next forward returned and when that forward's first launch
    # call returned.
    waits = sorted((v[1], k) for k, v in api.items() if v[2] in (131, 137))  # stream / event synchronize
    host_parts = []
    for f, g in zip(decode, decode[1:]):
        last_end = max(r[1] for r in f)
        gaps.append(g[0][0] - last_end)
        call = api.get(g[0][6])
        if call and call[1] >= last_end:  # issued after the last forward ended: steps that wait for their logits
            before = [w for w, _ in waits if last_end <= w <= call[1]]
            host_parts.append(((before[-1] if before else last_end) - last_end, call[1] - last_end))
    if host_parts:
        print(f"between forwards: the host's last wait returned {statistics.median(p[0] for p in host_parts) / 1e3:.1f} us "
              f"after the last kernel ended, the next forward's first launch call {statistics.median(p[1] for p in host_parts) / 1e3:.1f} us after it")
    tot = statistics.median(totals)
    print(f"forward (first start to last end): median {tot / 1e3:.1f} us; gap to the next: median "
          f"{statistics.median(gaps) / 1e3 if gaps else 0:.1f} us")
    # Idle stretches (a step graph's pieces start after the previous piece ended, without the
    # programmatic overlap of kernels inside a piece or a stream).
    idle_sum = statistics.median(sum(x[0] for x in i) for i in idles)
    idle_n = statistics.median(len(i) for i in idles)
    long_idles = [x for i in idles for x in i if x[0] > 1000]
    print(f"device idle inside a forward: median {idle_sum / 1e3:.1f} us in {idle_n:.0f} stretches; stretches over 1 us: "
          f"{len(long_idles) / len(idles):.1f} a forward, median "
          f"{statistics.median(x[0] for x in long_idles) / 1e3 if long_idles else 0:.2f} us")
    if api and long_idles:
        waited = [x for x in long_idles if x[1] is not None and x[1] > 0]
        print(f"  of those, after a launch call that returned once the device was idle (the device waited for the "
              f"host): {len(waited) / len(idles):.1f} a forward, {sum(x[0] for x in waited) / len(idles) / 1e3:.1f} us")
        print("  by place in the forward (kernel index, name): median idle us, median host launch end - idle start us")
        places = collections.defaultdict(list)
        for x in long_idles:
            places[(x[2], x[3])].append(x)
        for (i, nm), xs in sorted(places.items()):
            hosts = [x[1] for x in xs if x[1] is not None]
            print(f"    {i:4d} {nm:32s} {len(xs):3d}x {statistics.median(x[0] for x in xs) / 1e3:7.2f} "
                  f"{statistics.median(hosts) / 1e3 if hosts else float('nan'):8.2f}")
    print(f"{'kernel [grid] threads regs':68s} {'calls':>5s} {'chain us':>9s} {'%':>5s} {'us/call':>8s} {'run us/call':>11s}")
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    for k, (s, d, n) in rows[: a.top]:
        print(f"{k[:68]:68s} {n:5d} {s / 1e3:9.1f} {100 * s / tot:5.1f} {s / n / 1e3:8.2f} {d / n / 1e3:11.2f}")
    rest = sum(v[0] for _, v in rows[a.top:])
    print(f"{'(the rest)':68s} {'':5s} {rest / 1e3:9.1f} {100 * rest / tot:5.1f}")
    print("\nby kernel name (median over forwards of the per-forward sums):")
    names = {k.split(" ")[0] for k in keys}
    by_name = {nm: (statistics.median(sum(v for k, v in c.items() if k.split(" ")[0] == nm) for c in shares),
                    max(sum(v for k, v in c.items() if k.split(" ")[0] == nm) for c in calls)) for nm in names}
    for nm, (s, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
        print(f"  {nm:40s} {n:5d} {s / 1e3:9.1f} us {100 * s / tot:5.1f}%")


if __name__ == "__main__":
    main()
